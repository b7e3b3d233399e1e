"""The numba kernel of the Bayes-optimal scorer of the synthetic extreme-classification problem
(:func:`dasknn.datasets.make_extreme_classification`)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["bayes_top_labels"]


@njit(cache=True, parallel=True)
def bayes_top_labels(
    indptr,
    indices,
    counts,
    slot_inv_ptr,
    slot_inv,
    cluster_inv_ptr,
    cluster_inv,
    cluster_size,
    slot_label,
    slot_prior,
    slot_allowed,
    fallback_order,
    ratio,
    pi,
    n_chunks,
):  # pragma: no cover - compiled
    """The Bayes-optimal top label of every sample (the scorer of :mod:`dasknn.datasets.extreme`).

    Cluster ``c`` holds slots ``c * cluster_size .. (c + 1) * cluster_size - 1``; slot ``s`` is
    label ``slot_label[s]``. ``slot_inv`` / ``cluster_inv`` list the slots / clusters whose
    signature holds a feature. ``ratio[i, j] = exp(beta * i + alpha * j)`` for ``j`` draws in the
    label's signature and ``i`` in its cluster's. Only ``slot_allowed`` slots compete (all count
    in the cluster's mass); ``fallback_order``: clusters with an allowed slot, best first.
    """
    n = indptr.shape[0] - 1
    n_slots = slot_label.shape[0]
    n_clusters = (n_slots + cluster_size - 1) // cluster_size
    top = np.empty(n, dtype=np.int64)
    for chunk in prange(n_chunks):
        hits_label = np.zeros(n_slots, dtype=np.int64)
        hits_cluster = np.zeros(n_clusters, dtype=np.int64)
        hit = np.zeros(n_clusters, dtype=np.bool_)
        clusters = np.empty(n_clusters, dtype=np.int64)
        own = np.empty(cluster_size, dtype=np.float64)
        for c in range(chunk * n // n_chunks, (chunk + 1) * n // n_chunks):
            n_hit = 0
            for p in range(indptr[c], indptr[c + 1]):
                f = indices[p]
                m = counts[p]
                for q in range(slot_inv_ptr[f], slot_inv_ptr[f + 1]):
                    slot = slot_inv[q]
                    hits_label[slot] += m
                    cl = slot // cluster_size
                    if not hit[cl]:
                        hit[cl] = True
                        clusters[n_hit] = cl
                        n_hit += 1
                for q in range(cluster_inv_ptr[f], cluster_inv_ptr[f + 1]):
                    cl = cluster_inv[q]
                    hits_cluster[cl] += m
                    if not hit[cl]:
                        hit[cl] = True
                        clusters[n_hit] = cl
                        n_hit += 1
            best = -1.0
            best_label = n_slots
            for i in range(n_hit):
                cl = clusters[i]
                lo = cl * cluster_size
                hi = min(lo + cluster_size, n_slots)
                mass = 0.0
                for q in range(lo, hi):
                    own[q - lo] = slot_prior[q] * ratio[hits_cluster[cl], hits_label[q]]
                    mass += own[q - lo]
                for q in range(lo, hi):
                    if not slot_allowed[q]:
                        continue
                    score = (1.0 - pi) * own[q - lo] + pi * mass
                    if score > best or (score == best and slot_label[q] < best_label):
                        best = score
                        best_label = slot_label[q]
            # the best label of the clusters the sample does not touch (likelihood ratio 1)
            for i in range(fallback_order.shape[0]):
                cl = fallback_order[i]
                if hit[cl]:
                    continue
                lo = cl * cluster_size
                hi = min(lo + cluster_size, n_slots)
                mass = 0.0
                for q in range(lo, hi):
                    mass += slot_prior[q]
                for q in range(lo, hi):
                    if not slot_allowed[q]:
                        continue
                    score = (1.0 - pi) * slot_prior[q] + pi * mass
                    if score > best or (score == best and slot_label[q] < best_label):
                        best = score
                        best_label = slot_label[q]
                break
            top[c] = best_label
            for i in range(n_hit):
                cl = clusters[i]
                hit[cl] = False
                hits_cluster[cl] = 0
                for q in range(cl * cluster_size, min((cl + 1) * cluster_size, n_slots)):
                    hits_label[q] = 0
    return top
