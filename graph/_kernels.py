"""The numba kernels of ``graph`` (its only numba-compiled code): set hashes and in-place sorts
of CSR sets (:mod:`graph.hypergraph`), the streamed report's word and link counts
(:mod:`graph.stream`) and the swap search's greedy placement and sweeps (:mod:`graph.swap`).
Each takes and fills numpy arrays; the modules named are their Python faces.
"""

from __future__ import annotations

import heapq

import numba
import numpy as np

__all__ = ["greedy_placement", "improve_by_swaps", "remote_pairs", "sort_within", "sum_keys"]


@numba.njit(cache=True, nogil=True)
def sort_within(offsets, items):  # pragma: no cover - numba
    """Sort every set ``items[offsets[v]:offsets[v+1]]`` in place (insertion sort: sets are
    small)."""
    for v in range(len(offsets) - 1):
        for t in range(offsets[v] + 1, offsets[v + 1]):
            item = items[t]
            s = t - 1
            while s >= offsets[v] and items[s] > item:
                items[s + 1] = items[s]
                s -= 1
            items[s + 1] = item


@numba.njit(cache=True, nogil=True)
def sum_keys(offsets, items, keys, hashes):  # pragma: no cover - numba
    """``hashes[:, v]``: the wrapping sums of ``keys[:, item]`` over the items of set ``v``."""
    for v in range(len(offsets) - 1):
        first = np.uint64(0)
        second = np.uint64(0)
        for t in range(offsets[v], offsets[v + 1]):
            first += keys[0, items[t]]
            second += keys[1, items[t]]
        hashes[0, v] = first
        hashes[1, v] = second


@numba.njit(cache=True, nogil=True)
def remote_pairs(
    indptr, indices, input_parts, output_parts, nparts, table
):  # pragma: no cover - numba
    """``(remote, links)``: distinct (input, consuming part) pairs off the input's owner, and
    distinct (owner, consumer) part pairs among them; one pass over the nonzeros (links counted
    in a ``nparts x nparts`` table if ``table``, else by a sort)."""
    seen = np.full(nparts, -1, dtype=np.int64)
    linked = np.zeros(nparts * nparts if table else 0, dtype=np.bool_)
    codes = np.empty(0 if table else len(indices), dtype=np.int64)
    remote = 0
    links = 0
    for i in range(len(indptr) - 1):
        owner = input_parts[i]
        for t in range(indptr[i], indptr[i + 1]):
            consumer = output_parts[indices[t]]
            if consumer != owner and seen[consumer] != i:
                seen[consumer] = i
                code = owner * nparts + consumer
                if table:
                    if not linked[code]:
                        linked[code] = True
                        links += 1
                else:
                    codes[remote] = code
                remote += 1
    if not table:
        links = len(np.unique(codes[:remote]))
    return remote, links


#: The swap search's kernels take a phase's incidence as one tuple ``nets`` of ``int64`` arrays:
#: ``(offsets, pins, vertex_offsets, vertex_nets, net_weights)``, the pins of net ``e`` at
#: ``pins[offsets[e]:offsets[e+1]]`` and the nets of free vertex ``v`` at
#: ``vertex_nets[vertex_offsets[v]:vertex_offsets[v+1]]``.


@numba.njit(cache=True, nogil=True)
def greedy_placement(nets, weights, limits, num_free, nparts, parts):  # pragma: no cover - numba
    """Place the free vertex of strongest pull first, each to the part of most pull that has
    room (else the one with most room left); pull: the weight of a vertex's nets with a pin
    already on the part (fixed, or free and placed), so placed vertices draw their neighbours."""
    offsets, pins, vertex_offsets, vertex_nets, _ = nets
    affinity = np.zeros(nparts, dtype=np.int64)
    load = np.zeros(nparts, dtype=np.int64)
    heap = [(np.int64(0), np.int64(0)) for _ in range(0)]  # empty; typed (-pull, vertex)
    for v in range(num_free):
        pull, _ = _best_part(v, nets, weights, limits, parts, load, affinity)
        heapq.heappush(heap, (-pull, np.int64(v)))
    while heap:
        negative, v = heapq.heappop(heap)
        if parts[v] >= 0:
            continue
        pull, choice = _best_part(v, nets, weights, limits, parts, load, affinity)
        if pull < -negative:  # stale: its best part filled up
            heapq.heappush(heap, (-pull, v))
            continue
        if choice < 0:
            choice = int(np.argmax(limits - load))
        parts[v] = choice
        load[choice] += weights[v]
        for t in range(vertex_offsets[v], vertex_offsets[v + 1]):
            e = vertex_nets[t]
            for s in range(offsets[e], offsets[e + 1]):
                u = pins[s]
                if u < num_free and parts[u] < 0:
                    pull, _ = _best_part(u, nets, weights, limits, parts, load, affinity)
                    heapq.heappush(heap, (-pull, u))


@numba.njit(cache=True, nogil=True)
def _best_part(v, nets, weights, limits, parts, load, affinity):  # pragma: no cover - numba
    """``(pull, part)``: the part with room for ``v`` that its nets pull most to (-1 if none)."""
    touched = _affinities(v, nets, parts, affinity)
    choice, pull = -1, 0
    for p in touched:
        if load[p] + weights[v] <= limits[p] and affinity[p] > pull:
            choice, pull = p, affinity[p]
        affinity[p] = 0
    return pull, choice


@numba.njit(cache=True, nogil=True)
def _affinities(v, nets, parts, affinity):  # pragma: no cover - numba
    """Add to ``affinity[p]`` the weight of ``v``'s nets with a placed pin on part ``p``; the parts
    touched (``affinity`` must be zero on entry; the caller zeroes it again)."""
    offsets, pins, vertex_offsets, vertex_nets, net_weights = nets
    touched = []
    for t in range(vertex_offsets[v], vertex_offsets[v + 1]):
        e = vertex_nets[t]
        for s in range(offsets[e], offsets[e + 1]):
            p = parts[pins[s]]
            if p >= 0:
                if affinity[p] == 0:
                    touched.append(p)
                affinity[p] += net_weights[e]
    return touched


@numba.njit(cache=True, nogil=True)
def _move_gains(v, nets, parts, gain_to, mark, mark_stamp):  # pragma: no cover - numba
    """``(base, targets)``: moving ``v`` to part ``q`` lowers connectivity-1 by ``base +
    gain_to[q]``; ``targets`` are the other parts its nets touch (``gain_to`` zero elsewhere)."""
    offsets, pins, vertex_offsets, vertex_nets, net_weights = nets
    p = parts[v]
    base = 0
    targets = []
    for t in range(vertex_offsets[v], vertex_offsets[v + 1]):
        e = vertex_nets[t]
        w = net_weights[e]
        mark_stamp[0] += 1
        alone = True
        for s in range(offsets[e], offsets[e + 1]):
            u = pins[s]
            q = parts[u]
            if q == p:
                if u != v:
                    alone = False
            elif mark[q] != mark_stamp[0]:
                mark[q] = mark_stamp[0]
                if gain_to[q] == 0:
                    targets.append(q)
                gain_to[q] += w
        base += (w if alone else 0) - w
    return base, targets


@numba.njit(cache=True, nogil=True)
def _net_km1(e, offsets, pins, parts, mark, mark_stamp):  # pragma: no cover - numba
    """Connectivity-1 of net ``e`` without its weight."""
    mark_stamp[0] += 1
    distinct = 0
    for s in range(offsets[e], offsets[e + 1]):
        q = parts[pins[s]]
        if mark[q] != mark_stamp[0]:
            mark[q] = mark_stamp[0]
            distinct += 1
    return distinct - 1


@numba.njit(cache=True, nogil=True)
def _swap_gain(
    v, u, v_gain, nets, parts, shared, stamp, mark, mark_stamp
):  # pragma: no cover - numba
    """How much swapping ``v`` and ``u`` lowers connectivity-1, given ``v_gain`` of moving ``v``
    alone (``shared[e] == stamp`` flags ``v``'s nets)."""
    offsets, pins, vertex_offsets, vertex_nets, net_weights = nets
    p, q = parts[v], parts[u]
    gain = v_gain
    for t in range(vertex_offsets[u], vertex_offsets[u + 1]):
        e = vertex_nets[t]
        w = net_weights[e]
        if shared[e] == stamp:  # v's move on e, counted in v_gain, is replaced by the swap's
            parts[v] = q
            alone_v = _net_km1(e, offsets, pins, parts, mark, mark_stamp)
            parts[u] = p
            after = _net_km1(e, offsets, pins, parts, mark, mark_stamp)
            parts[v], parts[u] = p, q
            gain += w * (alone_v - after)
            continue
        alone, present = True, False
        for s in range(offsets[e], offsets[e + 1]):
            r = parts[pins[s]]
            if r == q and pins[s] != u:
                alone = False
            elif r == p:
                present = True
        gain += (w if alone else 0) - (0 if present else w)
    return gain


@numba.njit(cache=True, nogil=True)
def improve_by_swaps(
    nets, weights, limits, num_free, nparts, parts, sweep_order, max_sweeps, min_gain, max_targets
):  # pragma: no cover - numba
    """Sweeps applying, for every free vertex, its best improving move or swap (swaps with the
    vertices of the ``max_targets`` parts its move gains most on), until a sweep lowers the cost
    by less than ``min_gain`` of it (or by nothing)."""
    offsets, pins, vertex_offsets, vertex_nets, net_weights = nets
    load = np.zeros(nparts, dtype=np.int64)
    for v in range(num_free):
        load[parts[v]] += weights[v]
    start = np.zeros(nparts + 1, dtype=np.int64)
    members = np.empty(num_free, dtype=np.int64)
    position = np.empty(num_free, dtype=np.int64)
    shared = np.zeros(len(offsets) - 1, dtype=np.int64)
    mark = np.zeros(nparts, dtype=np.int64)
    mark_stamp = np.zeros(1, dtype=np.int64)
    gain_to = np.zeros(nparts, dtype=np.int64)
    cost = 0
    for e in range(len(offsets) - 1):
        cost += net_weights[e] * _net_km1(e, offsets, pins, parts, mark, mark_stamp)
    stamp = 0
    for _ in range(max_sweeps):
        _list_members(parts, num_free, nparts, start, members, position)
        improved = 0
        for v in sweep_order:
            p = parts[v]
            base, targets = _move_gains(v, nets, parts, gain_to, mark, mark_stamp)
            if len(targets) == 0:
                continue
            gains = np.empty(len(targets), dtype=np.int64)
            for i in range(len(targets)):
                gains[i] = base + gain_to[targets[i]]
                gain_to[targets[i]] = 0
            stamp += 1
            for t in range(vertex_offsets[v], vertex_offsets[v + 1]):
                shared[vertex_nets[t]] = stamp
            best_gain, best_q, best_u = 0, -1, -1
            ranked = np.argsort(-gains)
            for i in ranked[:max_targets]:
                q = targets[i]
                if load[q] + weights[v] <= limits[q] and gains[i] > best_gain:  # a move
                    best_gain, best_q, best_u = gains[i], q, -1
                for slot in range(start[q], start[q + 1]):
                    u = members[slot]
                    if u < 0:
                        continue
                    shift = weights[u] - weights[v]
                    if load[p] + shift > limits[p] or load[q] - shift > limits[q]:
                        continue
                    gain = _swap_gain(v, u, gains[i], nets, parts, shared, stamp, mark, mark_stamp)
                    if gain > best_gain:
                        best_gain, best_q, best_u = gain, q, u
            if best_q < 0:
                continue
            improved += best_gain
            parts[v] = best_q
            load[p] -= weights[v]
            load[best_q] += weights[v]
            if best_u >= 0:
                parts[best_u] = p
                load[best_q] -= weights[best_u]
                load[p] += weights[best_u]
                members[position[v]], members[position[best_u]] = best_u, v
                position[v], position[best_u] = position[best_u], position[v]
            else:  # out of p's list; in q's from the next sweep on
                members[position[v]] = -1
        if improved == 0 or improved < min_gain * cost:
            break
        cost -= improved


@numba.njit(cache=True, nogil=True)
def _list_members(parts, num_free, nparts, start, members, position):  # pragma: no cover - numba
    """The free vertices of every part, ``members[start[p]:start[p+1]]``; ``position``: slots."""
    start[:] = 0
    for v in range(num_free):
        start[parts[v] + 1] += 1
    for p in range(nparts):
        start[p + 1] += start[p]
    fill = start[:-1].copy()
    for v in range(num_free):
        members[fill[parts[v]]] = v
        position[v] = fill[parts[v]]
        fill[parts[v]] += 1
