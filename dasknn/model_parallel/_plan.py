"""The communication plan of a partitioned network (see docs/training.md, Communication plan)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dasknn.kernels.renumber import crossing_rows, split_columns

__all__ = [
    "CommPlan", "LayerPartPlan", "boundary", "build_comm_plan", "iter_layers",
    "normalize_partition", "renumbered_chunks", "renumbering", "reorder",
]


def normalize_partition(
    partition, layer_sizes: Sequence[int], nparts: int | None = None
) -> tuple[list[np.ndarray], int]:
    """Check a partition against a network and return ``(parts, nparts)``.

    Parameters
    ----------
    partition : graph.NetworkPartition or sequence of int arrays
        Anything with ``parts`` (and optionally ``nparts``), or ``L + 1`` arrays, ``parts[k][j]``
        the part of neuron ``j`` of layer ``k`` (``k = 0``: input features).
    layer_sizes : sequence of int
        ``n_0, n_1, ..., n_L``.
    nparts : int, optional
        Defaults to ``partition.nparts`` or to one more than the largest id.

    Raises
    ------
    ValueError
        Wrong layer count or lengths, ids not integers in ``[0, nparts)``, or no part.
    """
    if nparts is None:
        nparts = getattr(partition, "nparts", None)
    parts = getattr(partition, "parts", partition)
    if isinstance(parts, str | bytes) or not isinstance(parts, Sequence | np.ndarray):
        raise ValueError("partition must be a NetworkPartition or a list of L + 1 int arrays")
    parts = list(parts)
    if len(parts) != len(layer_sizes):
        raise ValueError(
            f"partition has {len(parts)} part arrays but the network has {len(layer_sizes) - 1} "
            f"layers (it needs {len(layer_sizes)}: the inputs and every layer's outputs)"
        )
    checked = []
    for k, (p, size) in enumerate(zip(parts, layer_sizes, strict=True)):
        p = np.asarray(p)
        if p.ndim != 1 or p.shape[0] != size:
            raise ValueError(
                f"partition layer {k} has shape {p.shape} but layer {k} has {size} neurons"
            )
        if p.size and not np.issubdtype(p.dtype, np.integer):
            raise ValueError(f"partition layer {k} must hold integer part ids, got {p.dtype}")
        checked.append(p.astype(np.int64))
    largest = max((int(p.max()) for p in checked if p.size), default=0)
    nparts = largest + 1 if nparts is None else int(nparts)
    if nparts < 1:
        raise ValueError(f"a partition needs at least one part, got {nparts}")
    for k, p in enumerate(checked):
        if p.size and (p.min() < 0 or p.max() >= nparts):
            raise ValueError(f"partition layer {k} holds part ids outside [0, {nparts})")
    return checked, nparts


def reorder(
    parts: np.ndarray, nparts: int, first: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(order, offsets)``: the renumbering of one layer that makes every part contiguous;
    ``order[r]`` is the original index of the neuron at new position ``r``, part ``m`` holds new
    positions ``offsets[m]:offsets[m+1]``. Within a part, the neurons flagged in ``first`` (a
    boolean mask) come first, each group in its original order."""
    key = parts * 2 if first is None else parts * 2 + ~np.asarray(first, dtype=bool)
    order = np.argsort(key, kind="stable")
    offsets = np.zeros(nparts + 1, dtype=np.int64)
    np.cumsum(np.bincount(parts, minlength=nparts), out=offsets[1:])
    return order, offsets


def boundary(weight: sp.spmatrix, parts_in: np.ndarray, parts_out: np.ndarray) -> np.ndarray:
    """Which input neurons of ``weight`` (``(n_in, n_out)``) feed an output neuron of another
    part: the rows a part sends forward. One pass over the entries."""
    csr = sp.csr_matrix(weight)
    out = np.empty(csr.shape[0], dtype=bool)
    crossing_rows(csr.indptr, csr.indices, np.asarray(parts_in), np.asarray(parts_out), out)
    return out


@dataclass(frozen=True)
class LayerPartPlan:
    """What part ``m`` computes, sends and receives in layer ``k``.

    Attributes
    ----------
    part : int
        The part ``m``.
    indptr : numpy.ndarray
        Row pointer of the chunk without its empty rows (the ``groups[-1]`` touched inputs).
    groups : numpy.ndarray
        ``P + 1`` offsets into the touched rows: rows ``groups[n]:groups[n+1]`` are owned by ``n``.
    own : numpy.ndarray
        Positions, within part ``m`` of layer ``k-1``, of the touched rows ``m`` owns itself.
    send : dict of int to numpy.ndarray
        Per other part ``n`` touching rows of ``m``: their positions within part ``m`` of layer
        ``k-1`` (forward message ``m -> n``; backward, where ``n``'s partial sums are added).
    """

    part: int
    indptr: np.ndarray
    groups: np.ndarray
    own: np.ndarray
    send: dict[int, np.ndarray]

    def __sizeof__(self) -> int:
        """Bytes of this object and its arrays (Dask's ``sizeof`` uses ``sys.getsizeof``)."""
        arrays = [self.indptr, self.groups, self.own, *self.send.values()]
        return object.__sizeof__(self) + sum(int(a.nbytes) for a in arrays)

    def sent_prefix(self) -> int:
        """``h``: every row of part ``m`` of layer ``k-1`` that another part needs is among its
        first ``h`` (all of them, with :func:`build_comm_plan`'s boundary-first order)."""
        return max((int(rows[-1]) + 1 for rows in self.send.values() if len(rows)), default=0)

    def senders(self) -> list[int]:
        """Parts other than this one that own touched rows (they send forward, receive back)."""
        return [n for n in np.flatnonzero(np.diff(self.groups)).tolist() if n != self.part]


@dataclass(frozen=True)
class CommPlan:
    """The renumbering and the per-layer communication plan of a partitioned network.

    Attributes
    ----------
    nparts : int
    orders, offsets : list of numpy.ndarray
        :func:`reorder` of every layer ``k = 0 .. L``.
    layers : list of list of LayerPartPlan
        ``layers[k-1][m]`` is the plan of part ``m`` in layer ``k``.
    """

    nparts: int
    orders: list[np.ndarray]
    offsets: list[np.ndarray]
    layers: list[list[LayerPartPlan]]

    @property
    def n_layers(self) -> int:
        """Number of weight layers ``L``."""
        return len(self.layers)

    def part_sizes(self, k: int) -> np.ndarray:
        """Neurons of every part in layer ``k`` (``k = 0``: inputs)."""
        return np.diff(self.offsets[k])

    def messages(self, k: int) -> list[tuple[int, int, int]]:
        """Forward messages of layer ``k`` as ``(sender, receiver, words per sample)``."""
        return [
            (m, n, len(idx))
            for m, plan in enumerate(self.layers[k - 1])
            for n, idx in sorted(plan.send.items())
        ]

    def forward_words(self, k: int) -> int:
        """Words per sample sent forward in layer ``k``: the sum of ``connectivity - 1``."""
        return sum(words for _, _, words in self.messages(k))

    def backward_words(self, k: int) -> int:
        """Partial sums per sample sent back in layer ``k`` (none in layer 1)."""
        return self.forward_words(k) if k >= 2 else 0

    def predicted_bytes(self, batch: int, itemsize: int, backward: bool = True) -> dict:
        """Predicted payload of one batch, ``{(layer, phase): bytes}``: ``words * batch * itemsize``
        for ``forward`` and (with ``backward``) ``backward``."""
        result = {}
        for k in range(1, self.n_layers + 1):
            result[(k, "forward")] = self.forward_words(k) * batch * itemsize
            if backward:
                result[(k, "backward")] = self.backward_words(k) * batch * itemsize
        return result


def renumbered_chunks(weight, order_in, order_out, offsets_out) -> list[sp.csr_matrix]:
    """Every part's columns ``offsets_out[m]:offsets_out[m+1]`` of ``weight`` with its rows and
    columns renumbered by ``order_in`` and ``order_out`` (sorted indices, the entries' dtype),
    made in one pass over the entries (:func:`~dasknn.kernels.renumber.split_columns`)."""
    csr = sp.csr_matrix(weight)
    n_rows, nparts = csr.shape[0], len(offsets_out) - 1
    position = np.empty(len(order_out), dtype=np.int64)
    position[order_out] = np.arange(len(order_out))
    part_out = np.searchsorted(offsets_out, position, side="right") - 1
    column_out = position - np.asarray(offsets_out)[part_out]
    index = np.int32 if max(csr.nnz, csr.shape[1], n_rows) < 2**31 else np.int64
    indptr = np.zeros((nparts, n_rows + 1), dtype=index)
    indices = np.empty(csr.nnz, dtype=index)
    data = np.empty(csr.nnz, dtype=csr.dtype)
    split_columns(
        csr.indptr, csr.indices, csr.data, np.asarray(order_in), part_out, column_out, indptr,
        indices, data,
    )  # fmt: skip
    chunks, start = [], 0
    for m in range(nparts):
        stop = start + int(indptr[m, -1])
        width = int(offsets_out[m + 1] - offsets_out[m])
        chunk = sp.csr_matrix(
            (data[start:stop], indices[start:stop], indptr[m]), shape=(n_rows, width), copy=False
        )
        chunk.has_sorted_indices = True
        chunks.append(chunk)
        start = stop
    return chunks


def _layer_plans(chunks: list[sp.csr_matrix], offsets_in: np.ndarray) -> list[LayerPartPlan]:
    """The plan of every part of one layer from its renumbered chunks ``(n_{k-1}, c_m)``."""
    nparts = len(chunks)
    touched_by = [np.flatnonzero(np.diff(chunk.indptr)) for chunk in chunks]
    result = []
    for m, (chunk, rows) in enumerate(zip(chunks, touched_by, strict=True)):
        indptr = np.zeros(len(rows) + 1, dtype=chunk.indptr.dtype)
        np.cumsum(np.diff(chunk.indptr)[rows], out=indptr[1:])
        groups = np.searchsorted(rows, offsets_in).astype(np.int64)
        send = {}
        for n in range(nparts):
            lo, hi = np.searchsorted(touched_by[n], offsets_in[m : m + 2])
            if n != m and hi > lo:
                send[n] = touched_by[n][lo:hi] - offsets_in[m]
        own = rows[groups[m] : groups[m + 1]] - offsets_in[m]
        result.append(LayerPartPlan(m, indptr, groups, own, send))
    return result


def renumbering(
    weights: Sequence[sp.spmatrix], parts: Sequence[np.ndarray], nparts: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(orders, offsets)``: :func:`reorder` of every layer ``k = 0 .. L``, the neurons another
    part needs in the next layer first within each part (:func:`boundary`). One pass over the
    weights' patterns; nothing of their size is kept."""
    first = [boundary(w, parts[k], parts[k + 1]) for k, w in enumerate(weights)] + [None]
    orders, offsets = zip(*(reorder(p, nparts, f) for p, f in zip(parts, first, strict=True)),
                          strict=True)
    return list(orders), list(offsets)


def iter_layers(
    weights: Iterable[sp.spmatrix], orders: Sequence[np.ndarray], offsets: Sequence[np.ndarray]
) -> Iterator[tuple[list[LayerPartPlan], list[sp.csr_matrix]]]:
    """Per layer ``k = 1 .. L``, in order: every part's :class:`LayerPartPlan` and its renumbered
    columns of ``W_k`` (sorted indices), made when asked for (``W_k`` is drawn from ``weights``
    then), so a consumer that lets each layer go holds one layer's chunks at a time."""
    for k, weight in enumerate(weights, start=1):
        chunks = renumbered_chunks(weight, orders[k - 1], orders[k], offsets[k])
        yield _layer_plans(chunks, offsets[k - 1]), chunks


def build_comm_plan(
    weights: Sequence[sp.spmatrix], parts: Sequence[np.ndarray], nparts: int
) -> tuple[CommPlan, list[list[sp.csr_matrix]]]:
    """Renumber a network by its partition and compute every layer's communication plan.

    Within each part, the neurons another part needs in the next layer come first
    (:func:`boundary`), so that the forward step can finish and send them before the rest.
    Holds every layer's chunks at once; :func:`renumbering` and :func:`iter_layers` give the
    same a layer at a time.

    Parameters
    ----------
    weights : sequence of scipy.sparse matrices ``(n_{k-1}, n_k)``
    parts : sequence of ``L + 1`` int arrays (checked by :func:`normalize_partition`)
    nparts : int

    Returns
    -------
    plan : CommPlan
    chunks : list of list of scipy.sparse.csr_matrix
        ``chunks[k-1][m]``: part ``m``'s renumbered columns of ``W_k``, sorted indices.
    """
    orders, offsets = renumbering(weights, parts, nparts)
    layers, chunks = [], []
    for layer_plans, layer_chunks in iter_layers(weights, orders, offsets):
        layers.append(layer_plans)
        chunks.append(layer_chunks)
    return CommPlan(nparts, orders, offsets, layers), chunks
