"""Data-parallel steps as one task per worker, the messages posted worker to worker
(``messages="posted"``).

The step graph of :func:`dasknn.data_parallel._hybrid.build_step` places every task on the
worker its key names as sender. :func:`worker_programs` cuts it into one
:class:`WorkerProgram` per worker: that worker's tasks in one order that every worker follows
(a topological order of the whole graph, so no worker waits for a message a later task of its
own would make), which of their values go to which other workers, and which values the program
returns. :func:`run_programs` is the one task a worker runs for one or more consecutive steps
(``steps_per_task`` of the model): it runs each step's program, the tasks one after the other,
takes the values made elsewhere from the model's mailbox
(:class:`~dasknn.runtime.postbox.Mailbox`) and posts each value another worker reads to that
worker's :class:`~dasknn.runtime.postbox.Postbox` actor (key and sender in one packed
envelope, :meth:`~dasknn.runtime.postbox.Postbox.post_packed`), which holds the message's transfer
report in the mailbox; the task reports every message its worker received
to the transfer monitor in one event as it ends (before its result, on the same stream), as
Dask's own transfers are reported. Every message keeps the key of its own step, so the
monitor's records are per step whatever the steps per task. The scheduler sees ``N`` tasks per
submission.

A task returns without waiting for its posts to be acknowledged: every posted value is taken
by its reader's program of the same step, so the results, all gathered, imply that every post
arrived. The worker's next task waits for those of the last task's posts that are not
acknowledged yet, raising a failed one's error (``ActorFuture.result`` is a round trip through
the worker's event loop, about 1 ms each on a loaded machine, so the acknowledged ones are not
asked again: a post that failed before its acknowledgement shows instead as the message its
reader waits for, up to :data:`~dasknn.runtime.postbox.MESSAGE_TIMEOUT`).

A program that fails posts the error to every other worker of the step (under their
``failed`` key), whose waits then raise it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from dask.task_spec import List, Task, TaskRef
from distributed import get_worker

from dasknn.data_parallel._hybrid import STEP
from dasknn.data_parallel._worker_state import ReplicaState
from dasknn.runtime.keys import dp_key, parse_dp_key
from dasknn.runtime.measure import report_transfers
from dasknn.runtime.postbox import pack_envelope, post_failure

__all__ = ["WorkerProgram", "program_tasks", "run_programs", "worker_programs"]

@dataclass(frozen=True)
class WorkerProgram:
    """One worker's part of a step.

    Attributes
    ----------
    worker : int
        The worker's number.
    tasks : tuple of Task
        Its tasks, in the order they run.
    sends : dict
        ``{key: (worker, ...)}``: the other workers that read the value of each of its keys.
    outputs : tuple
        The keys whose values :func:`run_program` returns, in order.
    """

    worker: int
    tasks: tuple
    sends: dict
    outputs: tuple

    def __dask_tokenize__(self) -> tuple:
        """The keys of its tasks (unique to the model, the step and the worker): Dask tokenizes
        a submitted graph, and walking the tasks' arguments (the batch) would cost more than
        the step's submission itself."""
        return tuple(task.key for task in self.tasks)


def _sender(key) -> int:
    return parse_dp_key(key).sender


def worker_programs(tasks: dict, outputs: list, n_workers: int) -> list[WorkerProgram]:
    """Cut the step graph ``tasks`` (``{dp_key: Task}``) into one program per worker; each
    returns the values of its keys among ``outputs``.

    Every worker runs its tasks in the order of one topological order of the whole graph (by
    depth, then in the graph's order), so a task waits only for values of earlier tasks.

    Raises
    ------
    ValueError
        If a task reads a key the graph does not make.
    """
    depth: dict = {}
    for key in _topological(tasks):
        depth[key] = 1 + max((depth[d] for d in tasks[key].dependencies), default=-1)
    position = {key: i for i, key in enumerate(tasks)}
    ordered = sorted(tasks, key=lambda key: (depth[key], position[key]))
    own: list[list] = [[] for _ in range(n_workers)]
    sends: list[dict] = [{} for _ in range(n_workers)]
    for key in ordered:
        reader = _sender(key)
        own[reader].append(tasks[key])
        for dependency in sorted(tasks[key].dependencies, key=position.__getitem__):
            maker = _sender(dependency)
            if maker != reader:
                receivers = sends[maker].setdefault(dependency, [])
                if reader not in receivers:
                    receivers.append(reader)
    wanted = [[key for key in outputs if _sender(key) == w] for w in range(n_workers)]
    return [
        WorkerProgram(
            w,
            tuple(own[w]),
            {key: tuple(r) for key, r in sends[w].items()},
            tuple(wanted[w]),
        )
        for w in range(n_workers)
    ]


def _topological(tasks: dict) -> list:
    """The keys of ``tasks``, each after the keys it depends on."""
    done: set = set()
    order: list = []
    for root in tasks:
        stack = [(root, False)]
        while stack:
            key, expanded = stack.pop()
            if key in done:
                continue
            if expanded:
                done.add(key)
                order.append(key)
                continue
            if key not in tasks:
                raise ValueError(f"a task of the step reads {key!r}, which the step does not make")
            stack.append((key, True))
            stack.extend((d, False) for d in tasks[key].dependencies if d not in done)
    return order


def program_tasks(
    token: str, steps: list[int], programs: list[list[WorkerProgram]], postboxes: list[str]
) -> tuple[dict, list]:
    """Consecutive steps ``steps`` as ``{key: Task}`` of one :func:`run_programs` task per
    worker (each placed on its worker by its key's sender), and their keys in worker order.
    ``programs[k]`` are the programs of step ``steps[k]`` (one per worker); ``postboxes[w]`` is
    the key of worker ``w``'s postbox actor."""
    boxes = List(*(TaskRef(key) for key in postboxes))
    tasks = {}
    for worker in range(len(programs[0])):
        key = dp_key(token, steps[0], STEP, "run", worker, worker)
        mine = [step_programs[worker] for step_programs in programs]
        tasks[key] = Task(key, run_programs, token, list(steps), mine, boxes)
    return tasks, list(tasks)


def _failed_key(token: str, step: int, worker: int) -> tuple:
    """The key under which worker ``worker`` receives the error of a failed program."""
    return dp_key(token, step, STEP, "failed", worker, worker)


def run_programs(token: str, steps: list[int], programs: list, postboxes: list) -> list[list]:
    """Task: run ``programs[k]`` (step ``steps[k]``) on its worker, one step after the other
    (see the module docstring); returns, per step, the values of its program's outputs.
    ``postboxes[w]`` is worker ``w``'s postbox. The posts of the task before are waited for
    first; the posts of these steps are left for the next task to wait for."""
    state = ReplicaState.on_worker(token)
    worker = get_worker()
    address = worker.address
    post = [box.post_packed for box in postboxes]  # the actor's method, looked up once a task
    earlier, state.posts = state.posts, []
    results = []
    try:
        for step, program in zip(steps, programs, strict=True):
            state.mailbox.drop(lambda key, step=step: parse_dp_key(key).step >= step)
            failed = _failed_key(token, step, program.worker)
            values: dict = {}
            try:
                if earlier:
                    state.mailbox.wait_posted([p for p in earlier if not p.done()])
                    earlier = []
                for task in program.tasks:
                    for key in task.dependencies:
                        if key not in values:
                            values[key] = state.mailbox.take(key, failed)
                    values[task.key] = value = task({key: values[key] for key in task.dependencies})
                    receivers = program.sends.get(task.key, ())
                    envelope = pack_envelope(task.key, address) if receivers else None
                    for receiver in receivers:
                        state.posts.append(post[receiver](envelope, value))
            except BaseException as error:
                others = [
                    (box, _failed_key(token, step, w))
                    for w, box in enumerate(postboxes)
                    if w != program.worker
                ]
                where = f"worker {program.worker} failed in step {step}"
                post_failure(others, address, error, where)
                raise
            results.append([values[key] for key in program.outputs])
    finally:  # every message this worker received so far, in one event before the result
        report_transfers(worker, state.mailbox.take_receipts())
    return results
