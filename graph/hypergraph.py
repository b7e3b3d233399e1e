"""Phase hypergraphs of the multi-phase model, built with vectorised numpy: phase ``k``'s vertices
are layer ``k``'s neurons (identical ones merged into chunks), its nets of cost 2 the input neurons
(consumers plus the owner's fixed vertex, one a part) and, in refinement, one a neuron over the
parts consuming it next (docs/partitioning.md, "The hypergraph of a phase").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from graph._kernels import sort_within, sum_keys

__all__ = [
    "PhaseHypergraph",
    "build_phase_hypergraph",
    "identical_classes",
    "identical_vertex_chunks",
    "merge_identical_nets",
]

NET_COST = 2
_HASH_SEED = 0x5EED


@dataclass(frozen=True)
class PhaseHypergraph:
    """A hypergraph ready for a partitioner: vertices ``0 .. num_free-1`` free (merged neuron
    chunks), vertex ``num_free+t`` fixed to part ``fixed_parts[t]``.

    Attributes
    ----------
    num_free : int
    vertex_weights : numpy.ndarray
        Weight of every free vertex (nonzeros of the neurons it holds).
    fixed_parts : numpy.ndarray
        The part each fixed vertex is fixed to.
    net_offsets, net_pins : numpy.ndarray
        Nets in CSR form: the pins of net ``e`` are ``net_pins[net_offsets[e]:net_offsets[e+1]]``.
    net_weights : numpy.ndarray
        Cost of every net.
    vertex_of_neuron : numpy.ndarray
        The free vertex that holds each neuron of the layer.
    """

    num_free: int
    vertex_weights: np.ndarray
    fixed_parts: np.ndarray
    net_offsets: np.ndarray
    net_pins: np.ndarray
    net_weights: np.ndarray
    vertex_of_neuron: np.ndarray

    @property
    def num_vertices(self) -> int:
        """Free plus fixed vertices."""
        return self.num_free + len(self.fixed_parts)

    @property
    def num_nets(self) -> int:
        """Number of nets."""
        return len(self.net_offsets) - 1

    def neuron_parts(self, vertex_parts: np.ndarray) -> np.ndarray:
        """Expand a part per free vertex into a part per neuron."""
        return np.asarray(vertex_parts)[: self.num_free][self.vertex_of_neuron]


def _set_hashes(offsets: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Two 64-bit order-independent hashes of each set ``items[offsets[v]:offsets[v+1]]`` (wrapping
    sums of two random keys an item)."""
    rng = np.random.default_rng(_HASH_SEED)
    top = int(items.max()) + 1 if len(items) else 1
    keys = rng.integers(1, 2**63, size=(2, top), dtype=np.uint64)
    hashes = np.empty((2, len(offsets) - 1), dtype=np.uint64)
    sum_keys(np.asarray(offsets, dtype=np.int64), np.asarray(items, dtype=np.int64), keys, hashes)
    return hashes


def identical_classes(offsets: np.ndarray, items: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Class id of every vertex: vertices with the same net set and weight share an id.

    Compared by two 64-bit hashes of the net sets, weight and degree (a collision, about
    2**-100, would only merge two vertices; the hypergraphs stay exact for them).
    """
    hashes = _set_hashes(offsets, items)
    keys = (hashes[0], hashes[1], np.diff(offsets), np.asarray(weights))
    return _key_ranks(keys)


def _key_ranks(keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """Rank of every position among the distinct tuples of ``keys`` (equal arrays), ordered by
    the last key first, then the one before, ...; one ``np.lexsort``."""
    order = np.lexsort(keys)
    differs = np.zeros(len(order), dtype=bool)
    for key in keys:
        ordered = key[order]
        differs[1:] |= ordered[1:] != ordered[:-1]
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.cumsum(differs)
    return ranks


def identical_vertex_chunks(
    offsets: np.ndarray,
    items: np.ndarray,
    weights: np.ndarray,
    chunk: int,
    tiebreak: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """Group vertices with identical net sets into equal chunks of at most ``chunk`` vertices.

    Classes come from :func:`identical_classes`.

    Parameters
    ----------
    offsets, items : numpy.ndarray
        The net set of each vertex in CSR form.
    weights : numpy.ndarray
        Vertex weights.
    chunk : int
        Largest chunk; a class of ``m`` identical vertices is cut into chunks of ``gcd(m, chunk)``.
    tiebreak : numpy.ndarray, optional
        Order of the vertices within a class before it is cut (default: their index).

    Returns
    -------
    chunk_of : numpy.ndarray
        The chunk of every vertex, numbered ``0 .. num_chunks-1``.
    num_chunks : int
    """
    n = len(weights)
    if chunk <= 1 or n == 0:
        return np.arange(n), n
    within = np.arange(n) if tiebreak is None else tiebreak
    classes = identical_classes(offsets, items, weights)
    order = np.lexsort((np.arange(n), within, classes))
    new_class = np.ones(n, dtype=bool)
    new_class[1:] = classes[order][1:] != classes[order][:-1]
    class_start = np.flatnonzero(new_class)
    class_id = np.cumsum(new_class) - 1
    class_size = np.diff(np.append(class_start, n))
    chunk_size = np.gcd(class_size, chunk)
    chunk_index = (np.arange(n) - class_start[class_id]) // chunk_size[class_id]
    chunks_per_class = class_size // chunk_size
    first_chunk = np.concatenate([[0], np.cumsum(chunks_per_class)[:-1]])
    chunk_of = np.empty(n, dtype=np.int64)
    chunk_of[order] = first_chunk[class_id] + chunk_index
    return chunk_of, int(chunks_per_class.sum())


def merge_chunk(num_neurons: int, nparts: int, max_chunk: int) -> int:
    """Largest chunk that keeps perfect balance reachable: a divisor of ``num_neurons / nparts``."""
    if num_neurons % nparts:
        return 1
    return math.gcd(num_neurons // nparts, max_chunk)


def build_phase_hypergraph(
    layer: sp.csr_matrix,
    nparts: int,
    input_parts: np.ndarray | None,
    consumer_parts: sp.csr_matrix | None = None,
    max_chunk: int = 1,
    current_parts: np.ndarray | None = None,
) -> PhaseHypergraph:
    """Build the hypergraph of one phase.

    Parameters
    ----------
    layer : scipy.sparse.csr_matrix
        The stored layer, shape ``(n_in, n_out)``.
    nparts : int
    input_parts : numpy.ndarray or None
        Owner part of every input neuron; ``None`` in the first phase (no fixed vertices).
    consumer_parts : scipy.sparse.csr_matrix or None
        Refinement: ``(n_out, nparts)``, nonzero where part ``p`` consumes neuron ``j`` in the
        next layer; adds one net per neuron.
    max_chunk : int
        Merge neurons with identical inputs into chunks of up to this many (1 disables merging).
    current_parts : numpy.ndarray, optional
        Refinement: every neuron's present part (identical neurons merged within a part only,
        so the present placement stays representable).

    Returns
    -------
    PhaseHypergraph
    """
    layer = sp.csr_matrix(layer)
    pattern = sp.csr_matrix(
        (np.ones(layer.nnz, dtype=np.int8), layer.indices, layer.indptr), shape=layer.shape
    )
    pattern.sum_duplicates()
    n_in, n_out = pattern.shape
    by_column = pattern.tocsc()
    by_column.sort_indices()
    weights = np.diff(by_column.indptr).astype(np.int64)
    if consumer_parts is not None:
        consumer_parts = sp.csr_matrix(consumer_parts, dtype=np.int8)
        consumer_parts.sum_duplicates()
        consumer_parts.sort_indices()
    chunk_of, num_chunks = identical_vertex_chunks(
        by_column.indptr,
        by_column.indices,
        weights,
        merge_chunk(n_out, nparts, max_chunk),
        None if current_parts is None else np.asarray(current_parts),
    )
    vertex_weights = np.bincount(chunk_of, weights=weights, minlength=num_chunks).astype(np.int64)

    # Input nets: pins = the chunks of the consumers, deduplicated.
    rows = np.repeat(np.arange(n_in), np.diff(pattern.indptr))
    pins_by_net = sp.csr_matrix(
        (np.ones(len(rows), dtype=np.int8), (rows, chunk_of[pattern.indices])),
        shape=(n_in, num_chunks),
    )
    pins_by_net.sum_duplicates()
    used = np.diff(pins_by_net.indptr) > 0

    # One fixed vertex per part that owns an input or consumes an output.
    fixed_parts = np.zeros(0, dtype=np.int64)
    if input_parts is not None:
        input_parts = np.asarray(input_parts, dtype=np.int64)
        fixed_parts = np.unique(input_parts[used])
    if consumer_parts is not None:
        fixed_parts = np.union1d(fixed_parts, consumer_parts.indices).astype(np.int64)
    fixed_vertex = num_chunks + np.searchsorted(fixed_parts, np.arange(nparts))

    owner_pin = None if input_parts is None else fixed_vertex[input_parts]
    offsets, pins = _append_pins(pins_by_net, owner_pin, keep=used)
    net_weights = np.full(len(offsets) - 1, NET_COST, dtype=np.int64)

    if consumer_parts is not None:
        # One output net per neuron: its chunk plus the parts that consume it in the next layer.
        out_nets = sp.csr_matrix(
            (consumer_parts.data, fixed_vertex[consumer_parts.indices], consumer_parts.indptr),
            shape=(n_out, num_chunks + len(fixed_parts)),
        )
        has_consumers = np.diff(out_nets.indptr) > 0
        out_offsets, out_pins = _prepend_pins(out_nets, chunk_of, has_consumers)
        offsets = np.concatenate([offsets, offsets[-1] + out_offsets[1:]])
        pins = np.concatenate([pins, out_pins])
        net_weights = np.concatenate(
            [net_weights, np.full(int(has_consumers.sum()), NET_COST, dtype=np.int64)]
        )
    offsets, pins, net_weights = merge_identical_nets(offsets, pins, net_weights)
    return PhaseHypergraph(
        num_free=num_chunks,
        vertex_weights=vertex_weights,
        fixed_parts=fixed_parts,
        net_offsets=offsets,
        net_pins=pins,
        net_weights=net_weights,
        vertex_of_neuron=chunk_of,
    )


def merge_identical_nets(
    offsets: np.ndarray, pins: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replace nets with the same pin set by one net weighing their sum (connectivity-1 of every
    placement unchanged). Candidates are found by :func:`_set_hashes` and then compared pin by pin,
    so the result is exact; cost: a sort of the pins and one of the nets.

    Returns
    -------
    offsets, pins, weights : numpy.ndarray
        The merged nets in CSR form (pins sorted within each net) and their ``int64`` weights,
        in the order of each set's first net.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.int64)
    num_nets = len(offsets) - 1
    if num_nets < 2:
        return offsets, np.asarray(pins, dtype=np.int64), weights
    sizes = np.diff(offsets)
    net_of_pin = np.repeat(np.arange(num_nets), sizes)
    pins = np.array(pins, dtype=np.int64)
    sort_within(offsets, pins)
    hashes = _set_hashes(offsets, pins)
    ranks = _key_ranks((hashes[1], hashes[0], sizes))
    first_of_rank = np.full(int(ranks.max()) + 1, num_nets, dtype=np.int64)
    np.minimum.at(first_of_rank, ranks, np.arange(num_nets))
    representative = first_of_rank[ranks]  # the first net of each candidate set
    within = np.arange(len(pins)) - offsets[net_of_pin]
    if not np.array_equal(pins, pins[offsets[representative][net_of_pin] + within]):
        return offsets, pins, weights  # a hash collision: leave every net as it is
    keep = representative == np.arange(num_nets)
    number = np.cumsum(keep) - 1
    merged_weights = np.bincount(number[representative], weights=weights, minlength=int(keep.sum()))
    new_offsets = np.concatenate([[0], np.cumsum(sizes[keep])]).astype(np.int64)
    return new_offsets, pins[np.repeat(keep, sizes)], merged_weights.astype(np.int64)


def _prepend_pins(
    pins_by_net: sp.csr_matrix, first_pin: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the kept nets, each with ``first_pin[net]`` put in front."""
    sizes = np.diff(pins_by_net.indptr) + 1
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    pins = np.empty(int(offsets[-1]), dtype=np.int64)
    mask = np.ones(len(pins), dtype=bool)
    mask[offsets[:-1]] = False
    pins[mask] = pins_by_net.indices
    pins[offsets[:-1]] = first_pin
    return _select_nets(offsets, pins, keep)


def _append_pins(
    pins_by_net: sp.csr_matrix, extra_pin: np.ndarray | None, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the kept nets, each with ``extra_pin[net]`` appended when given."""
    if extra_pin is None:
        return _select_nets(pins_by_net.indptr, pins_by_net.indices.astype(np.int64), keep)
    offsets = np.concatenate([[0], np.cumsum(np.diff(pins_by_net.indptr) + 1)])
    pins = np.empty(int(offsets[-1]), dtype=np.int64)
    last = offsets[1:] - 1
    mask = np.ones(len(pins), dtype=bool)
    mask[last] = False
    pins[mask] = pins_by_net.indices
    pins[last] = extra_pin
    return _select_nets(offsets, pins, keep)


def _select_nets(
    offsets: np.ndarray, pins: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Keep only the nets flagged in ``keep``."""
    sizes = np.diff(offsets)
    pin_keep = np.repeat(keep, sizes)
    new_offsets = np.concatenate([[0], np.cumsum(sizes[keep])])
    return new_offsets.astype(np.int64), pins[pin_keep]
