"""The keys of data-parallel steps run as one task per worker, the messages posted worker to
worker (``messages="posted"``).

The step graph of :func:`dasknn.data_parallel._hybrid.build_step` places every task on the
worker its key names as sender; :func:`dasknn.runtime.posted.cut_programs` cuts it into one
program per worker by that sender, and :func:`dasknn.runtime.posted.run_programs` runs one or
more consecutive steps (``steps_per_task`` of the model) of a worker's programs as one task.
:class:`DataParallelKeys` names that task, the error a failing worker posts to the others and
the step of a message. Every message keeps the key of its own step, so the monitor's records are
per step whatever the steps per task. The scheduler sees ``N`` tasks per submission.
"""

from __future__ import annotations

from dataclasses import dataclass

from dasknn.data_parallel._hybrid import STEP
from dasknn.data_parallel._worker_state import ReplicaState
from dasknn.runtime.keys import dp_key, parse_dp_key
from dasknn.runtime.posted import WorkerProgram, cut_programs, program_tasks

__all__ = ["DataParallelKeys", "step_tasks", "worker_of", "worker_programs"]


def worker_of(key) -> int:
    """The worker that makes the value of the step key ``key`` (its sender)."""
    return parse_dp_key(key).sender


@dataclass(frozen=True)
class DataParallelKeys:
    """The keys of the posted programs of the data-parallel model ``token``
    (:class:`~dasknn.runtime.posted.ProgramKeys`)."""

    token: str

    def worker_of(self, key) -> int:
        """The worker that makes ``key``'s value (its sender)."""
        return worker_of(key)

    def step_of(self, key) -> int:
        """The step of a message."""
        return parse_dp_key(key).step

    def failed(self, step: int, worker: int) -> tuple:
        """The key under which worker ``worker`` receives the error of a failed program."""
        return dp_key(self.token, step, STEP, "failed", worker, worker)

    def run(self, step: int, worker: int) -> tuple:
        """The key of worker ``worker``'s task from step ``step`` (placed by its sender)."""
        return dp_key(self.token, step, STEP, "run", worker, worker)

    def state(self) -> ReplicaState:
        """The model's plugin on this worker."""
        return ReplicaState.on_worker(self.token)


def worker_programs(tasks: dict, outputs: list, n_workers: int) -> list[WorkerProgram]:
    """The step graph ``tasks`` (``{dp_key: Task}``) cut into one program per worker by each
    key's sender (:func:`~dasknn.runtime.posted.cut_programs`)."""
    return cut_programs(tasks, outputs, n_workers, worker_of)


def step_tasks(
    token: str, steps: list[int], programs: list[list[WorkerProgram]], postboxes: list[str]
) -> tuple[dict, list]:
    """Consecutive steps ``steps`` of the model ``token`` as one task per worker
    (:func:`~dasknn.runtime.posted.program_tasks`), and their keys in worker order."""
    return program_tasks(DataParallelKeys(token), steps, programs, postboxes)
