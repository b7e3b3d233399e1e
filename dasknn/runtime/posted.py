"""Programs that run as one task per worker, their messages posted worker to worker
(``messages="posted"`` of every mode).

A posted step is one task per worker, which runs that worker's part of the step itself and
exchanges the messages directly: a value another worker reads is posted to that worker's
:class:`~dasknn.runtime.postbox.Postbox` actor (key and sender in one packed envelope,
:meth:`~dasknn.runtime.postbox.Postbox.post_packed`), which leaves it in the receiving model
plugin's :class:`~dasknn.runtime.postbox.Mailbox` and holds its transfer report there. The
scheduler sees one task per worker and submission, its data dependencies and the order of the
tasks; it no longer sees the messages.

:class:`PostedTask` is the run loop every mode's task runs in: it waits for the previous task's
posts that are not acknowledged yet, drops the mailbox's messages of ended steps, takes a message
from the mailbox (or the error a failing sender posted under the task's ``failed`` key), posts a
value to its receivers, on an exception posts the error to the other workers and re-raises
(:meth:`PostedTask.failing`), and reports every message the worker received to the
communication monitor in one event as the task ends
(:func:`dasknn.runtime.measure.report_transfers`, before its result, on the same stream), so
posted bytes are counted as Dask's own transfers are.

:func:`cut_programs` cuts any keyed task graph whose keys name the worker that makes them into
one :class:`WorkerProgram` per worker, and :func:`run_programs` runs consecutive steps of such
programs as one task per worker (:func:`program_tasks`); a mode gives the naming of its keys as a
:class:`ProgramKeys`.

A task returns without waiting for its posts to be acknowledged when every posted value is taken
by its reader's task of the same step (so the results, all gathered, imply that every post
arrived): the worker's next task waits for those of the last task's posts that are not
acknowledged yet, raising a failed one's error (``ActorFuture.result`` is a round trip through
the worker's event loop, about 1 ms each on a loaded machine, so the acknowledged ones are not
asked again: a post that failed before its acknowledgement shows instead as the message its
reader waits for, up to :data:`~dasknn.runtime.postbox.MESSAGE_TIMEOUT`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from dask.task_spec import List, Task, TaskRef
from distributed import get_worker

from dasknn.runtime.measure import report_transfers
from dasknn.runtime.postbox import Mailbox, post_failure, poster

__all__ = [
    "PostedTask",
    "ProgramKeys",
    "WorkerProgram",
    "cut_programs",
    "program_tasks",
    "run_programs",
]


class PostedTask:
    """The run loop of one posted task on its worker (a context manager: leaving it reports the
    messages the worker received, :meth:`report`).

    Parameters
    ----------
    mailbox : Mailbox
        The mailbox of the model's plugin on this worker.
    postboxes : mapping or sequence
        The :class:`~dasknn.runtime.postbox.Postbox` actor of every receiver, by the name the
        task's posts give (a worker number, an address, a stage).
    since : bool, default False
        Whether a :meth:`~dasknn.runtime.postbox.Mailbox.clear` after the task began also ends
        its waits (otherwise only a clear during a wait does).
    """

    def __init__(self, mailbox: Mailbox, postboxes, since: bool = False) -> None:
        self.worker = get_worker()
        self.address = self.worker.address
        self.mailbox = mailbox
        items = postboxes.items() if isinstance(postboxes, Mapping) else enumerate(postboxes)
        # how each receiver is posted to, looked up once a task
        self._post = {name: poster(box) for name, box in items if box is not None}
        self.since = mailbox.clears if since else None
        #: The futures of this task's posts, in the order they were made.
        self.posts: list = []

    def __enter__(self) -> PostedTask:
        return self

    def __exit__(self, *exc) -> None:
        self.report()

    def report(self) -> None:
        """Report every message this worker received so far in one event (before the task's
        result, on the same stream)."""
        report_transfers(self.worker, self.mailbox.take_receipts())

    def wait_posted(self, posts) -> None:
        """Wait until each of ``posts`` not acknowledged yet is delivered, re-raising a failed
        post's error (``RuntimeError`` if the mailbox is cleared meanwhile)."""
        pending = [post for post in posts if not post.done()]
        if pending:
            self.mailbox.wait_posted(pending, since=self.since)

    def drop_ended(self, keep: Callable) -> None:
        """Forget the mailbox's messages whose key ``keep(key)`` is false (of ended steps)."""
        self.mailbox.drop(keep)

    def take(self, key, failed=None, timeout: float | None = None):
        """Remove and return the message ``key``, waiting for it; the error a failing sender
        posted under ``failed`` is raised instead (:meth:`Mailbox.take
        <dasknn.runtime.postbox.Mailbox.take>`)."""
        if timeout is None:
            return self.mailbox.take(key, failed, since=self.since)
        return self.mailbox.take(key, failed, timeout=timeout, since=self.since)

    def post(self, receivers, key, value) -> None:
        """Post ``value`` under ``key`` to the postbox of each of ``receivers`` (one envelope);
        the futures join :attr:`posts`."""
        if not receivers:
            return
        for receiver in receivers:
            self.posts.append(self._post[receiver](key, self.address, value))

    @contextmanager
    def failing(self, notices: Callable[[], list], where: str) -> Iterator[None]:
        """On an exception inside, post it to each ``(postbox, failed key)`` of ``notices()``
        (those workers' waits raise it too; an empty list tells none), then re-raise it."""
        try:
            yield
        except BaseException as error:
            told = notices()
            if told:
                post_failure(told, self.address, error, where)
            raise


class ProgramKeys(Protocol):
    """How a mode names the keys of the programs :func:`run_programs` runs (picklable)."""

    def worker_of(self, key) -> int:
        """The number of the worker that makes ``key``'s value."""

    def step_of(self, key) -> int:
        """The step a key (a message in the mailbox) belongs to."""

    def failed(self, step: int, worker: int):
        """The key under which worker ``worker`` receives the error of a failed program."""

    def run(self, step: int, worker: int):
        """The key of worker ``worker``'s task that runs from step ``step`` (placed on it)."""

    def state(self):
        """The model's plugin on this worker: its ``mailbox``, ``posts`` (the posts of the
        worker's last task, kept for the next) and ``ended(step, posts)``, called once the
        worker's program of ``step`` has run, with the futures of the posts it made."""


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
        The keys whose values the program returns, in order.
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


def cut_programs(
    tasks: dict, outputs: list, n_workers: int, worker_of: Callable
) -> list[WorkerProgram]:
    """Cut the task graph ``tasks`` (``{key: Task}``, each made on worker ``worker_of(key)``)
    into one program per worker; each returns the values of its keys among ``outputs``.

    Every worker runs its tasks in the order of one topological order of the whole graph (by
    depth, then in the graph's order), so a task waits only for values of earlier tasks and no
    worker waits for a message a later task of its own would make.

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
        reader = worker_of(key)
        own[reader].append(tasks[key])
        for dependency in sorted(tasks[key].dependencies, key=position.__getitem__):
            maker = worker_of(dependency)
            if maker != reader:
                receivers = sends[maker].setdefault(dependency, [])
                if reader not in receivers:
                    receivers.append(reader)
    wanted = [[key for key in outputs if worker_of(key) == w] for w in range(n_workers)]
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
    keys: ProgramKeys,
    steps: list[int],
    programs: list[list[WorkerProgram]],
    postboxes: list,
    after: list[TaskRef] | None = None,
) -> tuple[dict, list]:
    """Consecutive steps ``steps`` as ``{key: Task}`` of one :func:`run_programs` task per
    worker (``keys.run(steps[0], worker)``), and their keys in worker order. ``programs[k]``
    are the programs of step ``steps[k]`` (one per worker); ``postboxes[w]`` is the key of
    worker ``w``'s postbox actor. ``after[w]``, if given, is the task (a key of this graph or
    a future of an earlier submission) that worker ``w``'s task waits for: its task of the
    steps before, submitted without waiting for it to finish."""
    boxes = List(*(TaskRef(key) for key in postboxes))
    tasks = {}
    for worker in range(len(programs[0])):
        key = keys.run(steps[0], worker)
        mine = [step_programs[worker] for step_programs in programs]
        before = () if after is None else (after[worker],)
        tasks[key] = Task(key, run_programs, keys, list(steps), mine, boxes, *before)
    return tasks, list(tasks)


def run_programs(
    keys: ProgramKeys, steps: list[int], programs: list, postboxes: list, *_after
) -> list:
    """Task: run ``programs[k]`` (step ``steps[k]``) on its worker, one step after the other
    (see the module docstring); returns, per step, the values of its program's outputs.
    ``postboxes[w]`` is worker ``w``'s postbox; ``_after``: the worker's task of the steps
    before, when it was submitted without waiting for it. The posts of the task before are
    waited for first; the posts of these steps are left for the next task to wait for. A
    program that fails posts its error to every other worker (under their ``failed`` key of
    the step)."""
    state = keys.state()
    earlier = state.posts
    results = []
    with PostedTask(state.mailbox, postboxes) as task:
        state.posts = task.posts
        for step, program in zip(steps, programs, strict=True):
            task.drop_ended(lambda key, step=step: keys.step_of(key) >= step)
            failed = keys.failed(step, program.worker)
            values: dict = {}
            notices = partial(_others, keys, postboxes, step, program.worker)
            first_post = len(task.posts)
            with task.failing(notices, f"worker {program.worker} failed in step {step}"):
                if earlier:
                    task.wait_posted(earlier)
                    earlier = []
                sends = program.sends
                for item in program.tasks:
                    for key in item.dependencies:
                        if key not in values:
                            values[key] = task.take(key, failed)
                    values[item.key] = value = item({key: values[key] for key in item.dependencies})
                    receivers = sends.get(item.key)
                    if receivers:
                        task.post(receivers, item.key, value)
            state.ended(step, task.posts[first_post:])
            results.append([values[key] for key in program.outputs])
    return results


def _others(keys: ProgramKeys, postboxes: list, step: int, worker: int) -> list:
    """``(postbox, failed key)`` of every worker but ``worker`` in ``step``."""
    return [(box, keys.failed(step, w)) for w, box in enumerate(postboxes) if w != worker]
