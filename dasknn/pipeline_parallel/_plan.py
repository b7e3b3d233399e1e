"""Stages and replicas: contiguous layer runs, balanced by cost or fitting a memory limit
(docs/samo.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from dasknn.model.validation import check_count
from dasknn.optim import Optimizer

__all__ = [
    "ParallelPlan",
    "balanced_bounds",
    "check_bounds",
    "compressed_layer_bytes",
    "dense_layer_bytes",
    "layer_costs",
    "plan_parallelism",
    "split_stages",
]


def split_stages(layer_bytes: Sequence[int], stages: int) -> list[tuple[int, int]]:
    """Cut the layers into ``stages`` contiguous runs ``[(first, stop)]`` minimising the largest
    run's bytes (ties: the earliest cut).

    Raises
    ------
    ValueError
        If ``stages`` is not an integer in ``[1, len(layer_bytes)]``.
    """
    n = len(layer_bytes)
    stages = check_count("stages", stages)
    if stages > n:
        raise ValueError(f"{stages} stages for a network of {n} layers: at most one per layer")
    prefix = [0, *accumulate(int(b) for b in layer_bytes)]
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
    """Per layer, the multiply-adds per sample of its training step over its ``entries``
    (``n_in * n_out`` dense, the unpruned weights sparse): 3 products (forward, weight and input
    gradient), 2 for the first layer.

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


def balanced_bounds(model, stages: int) -> list[tuple[int, int]]:
    """The layers of each of ``stages`` stages of the :class:`~dasknn.model.CompressedMLP`
    ``model``, balanced by :func:`layer_costs` (over the dense entries with ``compute="dense"``,
    the unpruned weights with ``compute="sparse"``).

    Raises
    ------
    ValueError
        If ``stages`` is not an integer in ``[1, n_layers]``.
    """
    entries = [
        n_in * n_out if model.compute == "dense" else layer.nnz
        for (n_in, n_out), layer in zip(model.layer_shapes, model.stack.layers, strict=True)
    ]
    return split_stages(layer_costs(model.layer_shapes, entries), stages)


def check_bounds(bounds, stages: int, n_layers: int) -> list[tuple[int, int]]:
    """``bounds`` as ``[(first, stop)]``; ``ValueError`` unless they are ``stages`` contiguous
    non-empty runs covering the ``n_layers`` layers."""
    bounds = [(int(a), int(b)) for a, b in bounds]
    stops = [0] + [b for _, b in bounds]
    contiguous = [a for a, _ in bounds] == stops[:-1] and all(a < b for a, b in bounds)
    if len(bounds) != stages or not contiguous or stops[-1] != n_layers:
        raise ValueError(
            f"bounds must be {stages} contiguous non-empty runs (first, stop) covering the "
            f"{n_layers} layers, got {bounds}"
        )
    return bounds


def compressed_layer_bytes(stack, optimizer: Optimizer) -> list[int]:
    """Per layer of a :class:`~dasknn.compressed.CompressedStack`, the bytes of its model states
    with ``optimizer``'s state arrays (weights, gradients, optimizer states, index)."""
    out = []
    for layer in stack.layers:
        held = layer.state_bytes()
        n_states = len(optimizer.init_state(layer.master[:0]).arrays)
        params = layer.master.nbytes + layer.bias.nbytes
        out.append(held["weights"] + held["gradients"] + held["index"] + n_states * params)
    return out


def dense_layer_bytes(shapes: Sequence[tuple], arrays: int, itemsize: int = 4) -> list[int]:
    """Per dense layer of ``shapes``, ``arrays`` full-size arrays of ``itemsize`` bytes per weight
    and bias (float32 Adam: 4; with a float mask: 5; PyTorch's pruning utilities: 6)."""
    return [arrays * itemsize * (n_in * n_out + n_out) for n_in, n_out in shapes]


@dataclass(frozen=True)
class ParallelPlan:
    """A choice of stages and data-parallel replicas: ``bounds``, the layers ``(first, stop)``
    of each stage, and ``stage_bytes``, the model-state bytes each of its workers holds."""

    stages: int
    replicas: int
    bounds: list
    stage_bytes: list
    memory_limit: int

    @property
    def workers(self) -> int:
        return self.stages * self.replicas


def plan_parallelism(layer_bytes: Sequence[int], workers: int, memory_limit: int) -> ParallelPlan:
    """Fewest stages whose largest fits ``memory_limit`` per worker, ``workers // stages`` replicas.

    Raises
    ------
    ValueError
        If ``workers`` or ``memory_limit`` is not a positive integer, or no split into at most
        ``min(workers, layers)`` stages fits (the message gives the bytes needed and available).
    """
    workers = check_count("workers", workers)
    memory_limit = check_count("memory_limit", memory_limit)
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
