"""Stages and replicas: contiguous runs of layers per stage, and the planner that picks the fewest
stages whose per-worker model states fit a memory limit.

Compressing the model states shrinks every stage, so the planner can choose fewer stages and give
the workers left to more data-parallel replicas: SAMO's way of turning saved memory into less
communication (fewer pipeline messages, a smaller bubble).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

from dasknn.optim import Optimizer

__all__ = [
    "ParallelPlan",
    "compressed_layer_bytes",
    "dense_layer_bytes",
    "layer_costs",
    "plan_parallelism",
    "split_stages",
]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def split_stages(layer_bytes: Sequence[int], stages: int) -> list[tuple[int, int]]:
    """Cut the layers into ``stages`` contiguous runs ``[(first, stop)]``, none empty, with the
    largest run's bytes as small as possible (ties: the earliest cut).

    Raises
    ------
    ValueError
        If ``stages`` is not an integer in ``[1, len(layer_bytes)]``.
    """
    n = len(layer_bytes)
    stages = _positive_int("stages", stages)
    if stages > n:
        raise ValueError(f"{stages} stages for a network of {n} layers: at most one per layer")
    prefix = [0]
    for b in layer_bytes:
        prefix.append(prefix[-1] + int(b))
    inf = float("inf")
    # best[s][i]: the smallest largest-run over the first i layers cut into s runs
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for s in range(1, stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], prefix[i] - prefix[j])
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    bounds, i = [], n
    for s in range(stages, 0, -1):
        j = cut[s][i]
        bounds.append((j, i))
        i = j
    return bounds[::-1]


def layer_costs(shapes: Sequence[tuple[int, int]], entries: Sequence[int]) -> list[int]:
    """Per layer, the multiply-adds per sample of its training step: the forward product, the
    weight gradient and the input gradient (``W @ delta``), each over the layer's ``entries``
    (``n_in * n_out`` with dense compute, the unpruned weights with sparse compute). The
    network's first layer needs no input gradient, so it costs 2 products, every other layer 3.

    Splitting the layers by these costs (:func:`split_stages`) balances the stages' work, where a
    split by weights gives the stage holding the first layer less to do.

    Raises
    ------
    ValueError
        If ``entries`` does not give one count per layer, or a count lies outside
        ``[1, n_in * n_out]``.
    """
    if len(entries) != len(shapes):
        raise ValueError(f"{len(entries)} entry counts for {len(shapes)} layers")
    costs = []
    for k, ((n_in, n_out), count) in enumerate(zip(shapes, entries, strict=True)):
        if not 1 <= int(count) <= n_in * n_out:
            raise ValueError(f"layer {k}: {count} entries for a layer of shape {(n_in, n_out)}")
        costs.append((2 if k == 0 else 3) * int(count))
    return costs


def compressed_layer_bytes(stack, optimizer: Optimizer) -> list[int]:
    """Per layer of a :class:`~dasknn.compressed.CompressedStack`, the bytes of its model states
    with ``optimizer``'s state arrays (weights, gradients, optimizer states, index)."""
    out = []
    for layer in stack.layers:
        held = layer.state_bytes()
        n_states = len(optimizer.init_state(layer.master[:0]).arrays)
        out.append(
            held["weights"]
            + held["gradients"]
            + held["index"]
            + n_states * (layer.master.nbytes + layer.bias.nbytes)
        )
    return out


def dense_layer_bytes(
    shapes: Sequence[tuple[int, int]], arrays: int, itemsize: int = 4
) -> list[int]:
    """Per dense layer of ``shapes``, ``arrays`` full-size arrays of ``itemsize`` bytes per weight
    and per bias (dense float32 Adam: 4 arrays, weight, gradient, two moments; the dense model
    with a float mask: 5; PyTorch's pruning utilities: 6)."""
    return [arrays * itemsize * (n_in * n_out + n_out) for n_in, n_out in shapes]


@dataclass(frozen=True)
class ParallelPlan:
    """A choice of stages and data-parallel replicas.

    Attributes
    ----------
    stages, replicas : int
    bounds : list of (first, stop)
        The layers of each stage.
    stage_bytes : list of int
        Model-state bytes of each stage (what each of its workers holds).
    memory_limit : int
    """

    stages: int
    replicas: int
    bounds: list
    stage_bytes: list
    memory_limit: int

    @property
    def workers(self) -> int:
        return self.stages * self.replicas


def plan_parallelism(layer_bytes: Sequence[int], workers: int, memory_limit: int) -> ParallelPlan:
    """The fewest stages whose largest stage fits ``memory_limit`` bytes per worker, and as many
    replicas as the workers allow (``workers // stages``).

    Raises
    ------
    ValueError
        If ``workers`` or ``memory_limit`` is not a positive integer, or no split into at most
        ``min(workers, layers)`` stages fits (the message gives the bytes needed and available).
    """
    workers = _positive_int("workers", workers)
    memory_limit = _positive_int("memory_limit", memory_limit)
    smallest, most = None, min(workers, len(layer_bytes))
    for stages in range(1, most + 1):
        bounds = split_stages(layer_bytes, stages)
        sizes = [sum(layer_bytes[a:b]) for a, b in bounds]
        if max(sizes) <= memory_limit:
            return ParallelPlan(stages, workers // stages, bounds, sizes, memory_limit)
        smallest = max(sizes)
    raise ValueError(
        f"the model states do not fit: the best split into at most {most} "
        f"stages needs {smallest:,} bytes on one worker, the limit is {memory_limit:,} bytes"
    )
