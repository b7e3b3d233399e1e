"""The client's plan of one data-parallel step: which rows every worker, machine and shard uses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dasknn.data_parallel._shards import ShardMap
from dasknn.model.embedding_network import EMBEDDING, SOFTMAX, EmbeddingSpec, unique_rows
from dasknn.model.sampled_softmax import SampledOutput, sampled_output

__all__ = ["MachineRows", "StepPlan", "Topology", "WorkerBatch", "plan_inference", "plan_step"]


@dataclass(frozen=True)
class Topology:
    """Workers grouped into machines.

    Attributes
    ----------
    machines : tuple of tuple of int
        The workers of each machine, ascending; machines ordered by their first worker, the chief.
    """

    machines: tuple[tuple[int, ...], ...]

    @property
    def n_workers(self) -> int:
        return sum(len(m) for m in self.machines)

    @property
    def chiefs(self) -> list[int]:
        return [m[0] for m in self.machines]

    def machine_of(self, worker: int) -> int:
        return next(k for k, members in enumerate(self.machines) if worker in members)


@dataclass(frozen=True)
class WorkerBatch:
    """What one worker gets for a step (sent with the step graph by the client).

    Attributes
    ----------
    inverse : int64 array (B_i, c)
        Position of every token id of its windows in ``ids["embedding"]``.
    labels : int64 array (B_i,) or None
        Its windows' labels (``None`` for an inference pass that needs none).
    ids : dict
        Per sparse variable, the sorted distinct rows it reads.
    output : SampledOutput or None
        Its labels and the step's candidates among ``ids["softmax"]`` (sampled softmax).
    global_ids : dict or None
        ``ar-dense``: per sparse variable, the distinct rows of the global batch.
    """

    inverse: np.ndarray
    labels: np.ndarray | None
    ids: dict
    output: SampledOutput | None
    global_ids: dict | None


@dataclass(frozen=True)
class MachineRows:
    """One machine's rows of one sparse variable.

    Attributes
    ----------
    union : int64 array
        The sorted distinct rows of its workers.
    member_pos : list of int64 arrays
        Per worker of the machine (in order), the positions of its rows in ``union``.
    shard_pos : list of int64 arrays or None
        Per shard, the positions in ``union`` of the rows it holds (ascending).
    offsets : list of int64 arrays or None
        Per shard, those rows' offsets inside the shard (the pull's request).
    """

    union: np.ndarray
    member_pos: list
    shard_pos: list | None
    offsets: list | None


@dataclass(frozen=True)
class StepPlan:
    """One step's plan: ``batches[i]`` of worker ``i``; ``machines[v][k]``: variable ``v``, machine
    ``k``."""

    batches: list[WorkerBatch]
    machines: dict


def _blocks(topology: Topology, ids: np.ndarray):
    """Per worker, its row block of ``ids`` (``numpy.array_split``), the distinct embedding rows
    of its windows and the position of each id among them."""
    for block in np.array_split(np.arange(ids.shape[0]), topology.n_workers):
        yield (block, *unique_rows(ids[block]))


def plan_step(
    spec: EmbeddingSpec,
    topology: Topology,
    shards: dict | None,
    ids: np.ndarray,
    labels: np.ndarray,
    candidates: np.ndarray | None,
    architecture: str,
) -> StepPlan:
    """Split a global batch over the workers (``numpy.array_split`` row blocks) and plan its rows.

    Parameters
    ----------
    spec : EmbeddingSpec
    topology : Topology
    shards : dict or None
        ``{variable: ShardMap}`` of the sparse variables on parameter servers.
    ids : int64 array (B, c)
    labels : int64 array (B,)
    candidates : int64 array or None
        The step's candidate classes (sampled softmax).
    architecture : str
    """
    global_ids = None
    if architecture == "ar-dense":
        global_ids = {EMBEDDING: unique_rows(ids)[0]}
        if spec.sampled:
            global_ids[SOFTMAX] = np.unique(np.concatenate([labels, candidates]))
    batches = []
    for block, unique, inverse in _blocks(topology, ids):
        rows, output = {EMBEDDING: unique}, None
        if spec.sampled:
            output = sampled_output(labels[block], candidates, spec.n_classes, spec.sampler)
            rows[SOFTMAX] = output.classes
        batches.append(WorkerBatch(inverse, labels[block], rows, output, global_ids))
    return StepPlan(batches, _machines(spec, topology, shards, batches))


def plan_inference(
    spec: EmbeddingSpec, topology: Topology, shards: dict | None, ids: np.ndarray, labels
) -> StepPlan:
    """Split windows over the workers as :func:`plan_step` does; a worker reads its windows'
    distinct embedding rows and, under the sampled softmax, the whole output table (none
    without a window). ``labels`` (B,): the windows' labels, or ``None`` when the pass needs
    none; the other parameters as for :func:`plan_step`."""
    batches = []
    for block, unique, inverse in _blocks(topology, ids):
        rows = {EMBEDDING: unique}
        if spec.sampled:
            rows[SOFTMAX] = np.arange(spec.n_classes if len(block) else 0, dtype=np.int64)
        mine = None if labels is None else labels[block]
        batches.append(WorkerBatch(inverse, mine, rows, None, None))
    return StepPlan(batches, _machines(spec, topology, shards, batches))


def _machines(
    spec: EmbeddingSpec, topology: Topology, shards: dict | None, batches: list[WorkerBatch]
) -> dict:
    """``{variable: [MachineRows of each machine]}`` of the workers' rows ``batches``."""
    machines = {}
    for variable in spec.sparse_shapes():
        shard_map: ShardMap | None = None if shards is None else shards[variable]
        machines[variable] = [
            _machine_rows([batches[m].ids[variable] for m in members], shard_map)
            for members in topology.machines
        ]
    return machines


def _machine_rows(member_ids: list[np.ndarray], shard_map: ShardMap | None) -> MachineRows:
    union = np.unique(np.concatenate(member_ids)).astype(np.int64)
    member_pos = [np.searchsorted(union, m).astype(np.int64) for m in member_ids]
    if shard_map is None:
        return MachineRows(union, member_pos, None, None)
    shard_pos = shard_map.split(union)
    offsets = [shard_map.offset_of(union[pos]) for pos in shard_pos]
    return MachineRows(union, member_pos, shard_pos, offsets)
