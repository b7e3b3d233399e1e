"""The communication plan of a partitioned network, computed once from the pattern and the parts.

Neurons of every layer are renumbered so that each part's neurons are contiguous (part 0 first,
neurons of a part in their original order). Part ``m`` of layer ``k`` holds the columns of
``W_k`` of its neurons; the *rows* its chunk touches are the input neurons (of layer ``k-1``) it
needs. Sorted by the renumbering, these rows come grouped by the part that owns them, so part
``m``'s input block ``x_in`` is the concatenation, over owners ``n = 0 .. P-1``, of the owner's
activations at the rows ``m`` needs (its own for ``n = m``, a received message otherwise).

- forward (``Xsend/Xrecv``): owner ``n`` sends ``m`` the columns ``send[m]`` of its activations
  ``a_{k-1}^n`` (:attr:`LayerPartPlan.send` of part ``n``);
- backward (``Ssend/Srecv``), the mirror: ``m`` sends back the slice ``groups[n]:groups[n+1]`` of
  its partial sums ``s = delta_k^m W_k^m.T`` and ``n`` adds it at the same columns ``send[m]``.

A word of layer ``k-1`` crosses once to every part other than its owner whose chunk touches it:
``connectivity - 1`` words, forward in every layer and backward in layers ``2 .. L`` (no partial
sums go back to the input features).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = [
    "CommPlan",
    "LayerPartPlan",
    "build_comm_plan",
    "normalize_partition",
    "reorder",
]


def normalize_partition(
    partition, layer_sizes: Sequence[int], nparts: int | None = None
) -> tuple[list[np.ndarray], int]:
    """Check a partition against a network and return ``(parts, nparts)``.

    Parameters
    ----------
    partition : graph.NetworkPartition or sequence of int arrays
        Anything with a ``parts`` attribute (and optionally ``nparts``), or ``L + 1`` arrays where
        ``parts[k][j]`` is the part of neuron ``j`` of layer ``k`` (``k = 0``: input features).
    layer_sizes : sequence of int
        ``n_0, n_1, ..., n_L``.
    nparts : int, optional
        Number of parts; defaults to ``partition.nparts`` or to one more than the largest id.

    Raises
    ------
    ValueError
        If the partition has the wrong number of layers, a layer of the wrong length, ids that are
        not integers in ``[0, nparts)``, or fewer than one part.
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


def reorder(parts: np.ndarray, nparts: int) -> tuple[np.ndarray, np.ndarray]:
    """Renumbering of one layer that makes every part contiguous.

    Returns
    -------
    order : numpy.ndarray
        ``order[r]`` is the original index of the neuron at new position ``r``.
    offsets : numpy.ndarray
        ``nparts + 1`` offsets: part ``m`` holds new positions ``offsets[m]:offsets[m+1]``.
    """
    order = np.argsort(parts, kind="stable")
    offsets = np.zeros(nparts + 1, dtype=np.int64)
    np.cumsum(np.bincount(parts, minlength=nparts), out=offsets[1:])
    return order, offsets


@dataclass(frozen=True)
class LayerPartPlan:
    """What part ``m`` computes, sends and receives in layer ``k``.

    Attributes
    ----------
    part : int
        The part ``m``.
    indptr : numpy.ndarray
        Row pointer of the compact chunk: the chunk ``(n_{k-1}, c_m)`` without its empty rows, so
        its rows are the ``groups[-1]`` touched inputs in renumbered order (``indices`` and
        ``data`` are those of the full chunk).
    groups : numpy.ndarray
        ``P + 1`` offsets into the touched rows: rows ``groups[n]:groups[n+1]`` are owned by ``n``.
    own : numpy.ndarray
        Positions, within part ``m`` of layer ``k-1``, of the touched rows ``m`` owns itself.
    send : dict of int to numpy.ndarray
        For every other part ``n`` that touches rows owned by ``m``: their positions within part
        ``m`` of layer ``k-1`` (forward message ``m -> n``; backward, where ``n``'s partial sums
        are added).
    """

    part: int
    indptr: np.ndarray
    groups: np.ndarray
    own: np.ndarray
    send: dict[int, np.ndarray]

    def __sizeof__(self) -> int:
        """Bytes of this object and of its arrays: Dask's ``sizeof`` falls back on
        ``sys.getsizeof``, so a worker's memory accounting and the scheduler's transfer costs
        count what it holds."""
        arrays = [self.indptr, self.groups, self.own, *self.send.values()]
        return object.__sizeof__(self) + sum(int(a.nbytes) for a in arrays)

    def senders(self) -> list[int]:
        """Parts other than this one that own touched rows (they send forward, receive back)."""
        sizes = np.diff(self.groups)
        return [n for n in np.flatnonzero(sizes).tolist() if n != self.part]


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
        """Predicted payload of one batch: ``{(layer, phase): bytes}`` for phases ``forward`` and
        ``backward`` (the latter only for training steps)."""
        result = {}
        for k in range(1, self.n_layers + 1):
            result[(k, "forward")] = self.forward_words(k) * batch * itemsize
            if backward:
                result[(k, "backward")] = self.backward_words(k) * batch * itemsize
        return result


def _layer_plans(
    weight: sp.csr_matrix,
    order_in: np.ndarray,
    offsets_in: np.ndarray,
    order_out: np.ndarray,
    offsets_out: np.ndarray,
    nparts: int,
) -> tuple[list[LayerPartPlan], list[sp.csr_matrix]]:
    """Plans and renumbered chunks ``(n_{k-1}, c_m)`` of one layer."""
    renumbered = sp.csr_matrix(weight)[order_in][:, order_out]
    renumbered.sort_indices()
    compact: list[tuple[np.ndarray, np.ndarray]] = []
    chunks: list[sp.csr_matrix] = []
    touched_by: list[np.ndarray] = []
    for m in range(nparts):
        chunk = sp.csr_matrix(renumbered[:, offsets_out[m] : offsets_out[m + 1]])
        chunk.sort_indices()
        counts = np.diff(chunk.indptr)
        rows = np.flatnonzero(counts)
        indptr = np.zeros(len(rows) + 1, dtype=chunk.indptr.dtype)
        np.cumsum(counts[rows], out=indptr[1:])
        chunks.append(chunk)
        touched_by.append(rows)
        compact.append((rows, indptr))
    result = []
    for m in range(nparts):
        rows, indptr = compact[m]
        groups = np.searchsorted(rows, offsets_in).astype(np.int64)
        own_rows = rows[groups[m] : groups[m + 1]]
        send = {}
        for n in range(nparts):
            if n == m:
                continue
            other = touched_by[n]
            lo, hi = np.searchsorted(other, offsets_in[m : m + 2])
            if hi > lo:
                send[n] = other[lo:hi] - offsets_in[m]
        result.append(
            LayerPartPlan(
                part=m,
                indptr=indptr,
                groups=groups,
                own=own_rows - offsets_in[m],
                send=send,
            )
        )
    return result, chunks


def build_comm_plan(
    weights: Sequence[sp.spmatrix], parts: Sequence[np.ndarray], nparts: int
) -> tuple[CommPlan, list[list[sp.csr_matrix]]]:
    """Renumber a network by its partition and compute every layer's communication plan.

    Parameters
    ----------
    weights : sequence of scipy.sparse matrices ``(n_{k-1}, n_k)``
    parts : sequence of ``L + 1`` int arrays (checked by :func:`normalize_partition`)
    nparts : int

    Returns
    -------
    plan : CommPlan
    chunks : list of list of scipy.sparse.csr_matrix
        ``chunks[k-1][m]``: the renumbered columns of part ``m`` of ``W_k``, shape ``(n_{k-1},
        c_m)``, sorted indices (the weight chunk that lives on part ``m``'s worker).
    """
    reorders = [reorder(p, nparts) for p in parts]
    orders = [o for o, _ in reorders]
    offsets = [off for _, off in reorders]
    layers, chunks = [], []
    for k, weight in enumerate(weights, start=1):
        plans, layer_chunks = _layer_plans(
            weight, orders[k - 1], offsets[k - 1], orders[k], offsets[k], nparts
        )
        layers.append(plans)
        chunks.append(layer_chunks)
    return CommPlan(nparts, orders, offsets, layers), chunks
