"""Data-parallel steps as one task per worker, their messages posted worker to worker
(``messages="posted"``, :mod:`dasknn.runtime.posted`): a step graph is cut into one program per
worker by each key's sender, and consecutive steps of a worker run as one task; every message
keeps the key of its own step.
"""

from __future__ import annotations

from dataclasses import dataclass

from dasknn.data_parallel._hybrid import STEP
from dasknn.data_parallel._worker_state import ReplicaState
from dasknn.runtime.keys import dp_key, parse_dp_key
from dasknn.runtime.placement import by_sender
from dasknn.runtime.posted import WorkerProgram, cut_programs, program_tasks

__all__ = ["step_tasks", "worker_programs"]

_sender = by_sender(parse_dp_key)


@dataclass(frozen=True)
class _Keys:
    """The :class:`~dasknn.runtime.posted.ProgramKeys` of the data-parallel model ``token``."""

    token: str

    def worker_of(self, key) -> int:
        return _sender(key)

    def step_of(self, key) -> int:
        return parse_dp_key(key).step

    def failed(self, step: int, worker: int) -> tuple:
        return dp_key(self.token, step, STEP, "failed", worker, worker)

    def run(self, step: int, worker: int) -> tuple:
        return dp_key(self.token, step, STEP, "run", worker, worker)

    def state(self) -> ReplicaState:
        return ReplicaState.on_worker(self.token)


def worker_programs(tasks: dict, outputs: list, n_workers: int) -> list[WorkerProgram]:
    """The step graph ``tasks`` cut into one program per worker by each key's sender."""
    return cut_programs(tasks, outputs, n_workers, _sender)


def step_tasks(
    token: str,
    steps: list[int],
    programs: list[list[WorkerProgram]],
    postboxes: list[str],
    after: list | None = None,
) -> tuple[dict, list]:
    """Consecutive steps ``steps`` of the model ``token`` as one task per worker
    (:func:`~dasknn.runtime.posted.program_tasks`; ``after[w]``: the future of worker ``w``'s
    task of the steps before, which its task waits for), and their keys in worker order."""
    return program_tasks(_Keys(token), steps, programs, postboxes, after)
