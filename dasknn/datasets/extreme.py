"""A seeded synthetic extreme-classification problem with a known Bayes-optimal ceiling.

Generative model (``numpy.random.default_rng(seed)``): labels ``0..N-1`` have Zipf popularity
``P(primary = l) ∝ (l + 1) ** -zipf`` and fall into random clusters of ``cluster_size``. Each label
has a signature of ``label_features`` features, each cluster one of ``cluster_features``, on
disjoint halves of the features. A sample draws its primary label, then
``min(Poisson(extra_labels), cluster_size - 1)`` others of its cluster, and ``nnz`` features with
replacement: from the primary's signature with ``p_label``, its cluster's with ``p_cluster``, else
uniformly. A feature drawn ``m`` times has value ``m * idf[f]``; rows are scaled to unit length.

The Bayes-optimal scorer ranks labels by ``P(l in labels | x) = (1 - pi) post(l) + pi
post(cluster(l))``, ``post`` the primary's posterior and ``pi`` the chance that a given other label
of the cluster is an extra; its precision@1 is the ceiling reported beside every result.
:func:`oracle_top` gives its top label among a subset of the labels.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from dasknn.kernels.extreme import bayes_top_labels

__all__ = ["SyntheticXMC", "make_extreme_classification", "oracle_top"]


class SyntheticXMC(NamedTuple):
    """A generated problem.

    Attributes
    ----------
    X : scipy.sparse.csr_matrix, float32, ``(n_samples, n_features)``
    Y : scipy.sparse.csr_matrix, float32 indicator, ``(n_samples, n_labels)``
    oracle_precision_at_1 : float
        Precision@1 of the Bayes-optimal scorer on these samples.
    oracle_hits : numpy.ndarray of bool
        Whether the Bayes-optimal top label of each sample is one of its labels (the ceiling of
        any subset of the rows is the mean over it).
    oracle_top : numpy.ndarray of int64
        The Bayes-optimal top label of each sample.
    generator : dict
        The latent structure: ``prior``, ``cluster_of``, ``label_signatures``,
        ``cluster_signatures``, ``idf``, ``p_label``, ``p_cluster``, ``extra_share`` (``pi``) and
        ``nnz``.
    """

    X: sp.csr_matrix
    Y: sp.csr_matrix
    oracle_precision_at_1: float
    oracle_hits: np.ndarray
    oracle_top: np.ndarray
    generator: dict


def _positive(name: str, value, integer: bool = True):
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        raise ValueError(f"{name} must be a positive {'integer' if integer else 'number'}")
    if value <= 0 or (not integer and not math.isfinite(value)):
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def _inverse(owner_rows: np.ndarray, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``feature -> owners`` of a ``(owners, width)`` signature table."""
    owners = np.repeat(np.arange(owner_rows.shape[0]), owner_rows.shape[1])
    features = owner_rows.ravel()
    order = np.argsort(features, kind="stable")
    ptr = np.zeros(n_features + 1, dtype=np.int64)
    np.cumsum(np.bincount(features, minlength=n_features), out=ptr[1:])
    return ptr, owners[order].astype(np.int64)


def make_extreme_classification(
    n_samples: int = 100_000,
    n_features: int = 100_000,
    n_labels: int = 200_000,
    nnz: int = 40,
    cluster_size: int = 5,
    label_features: int = 10,
    cluster_features: int = 20,
    p_label: float = 0.08,
    p_cluster: float = 0.3,
    extra_labels: float = 1.0,
    zipf: float = 1.0,
    seed: int = 0,
) -> SyntheticXMC:
    """Generate the problem of the module docstring.

    Parameters
    ----------
    n_samples, n_features, n_labels : int
    nnz : int
        Features drawn per sample (with replacement, so a row has at most ``nnz`` nonzeros).
    cluster_size : int
        Labels per confusable cluster (the last cluster may be smaller).
    label_features, cluster_features : int
        Signature sizes.
    p_label, p_cluster : float
        Chances that a draw comes from the label's or the cluster's signature.
    extra_labels : float
        Mean of the Poisson number of extra labels of a sample.
    zipf : float
        Exponent of the label popularity.
    seed : int

    Returns
    -------
    SyntheticXMC
    """
    for name, value in (
        ("n_samples", n_samples),
        ("n_features", n_features),
        ("n_labels", n_labels),
        ("nnz", nnz),
        ("cluster_size", cluster_size),
        ("label_features", label_features),
        ("cluster_features", cluster_features),
    ):
        _positive(name, value)
    if not (0 <= p_label and 0 <= p_cluster and p_label + p_cluster < 1):
        raise ValueError("p_label and p_cluster must be >= 0 with a sum below 1")
    if extra_labels < 0 or zipf < 0:
        raise ValueError("extra_labels and zipf must be >= 0")
    half = n_features // 2
    if half < max(label_features, cluster_features) or n_features - half < label_features:
        raise ValueError("n_features is too small for the signatures")
    rng = np.random.default_rng(seed)
    # labels: popularity and clusters
    prior = (np.arange(1, n_labels + 1, dtype=np.float64)) ** -float(zipf)
    prior /= prior.sum()
    grouping = rng.permutation(n_labels)
    n_clusters = -(-n_labels // cluster_size)
    cluster_of = np.empty(n_labels, dtype=np.int64)
    cluster_of[grouping] = np.arange(n_labels) // cluster_size
    cluster_labels = np.argsort(cluster_of, kind="stable")  # by cluster, ids ascending
    cluster_ptr = np.zeros(n_clusters + 1, dtype=np.int64)
    np.cumsum(np.bincount(cluster_of, minlength=n_clusters), out=cluster_ptr[1:])
    sizes = np.diff(cluster_ptr)
    # signatures, on disjoint halves of the (shuffled) features
    rename = rng.permutation(n_features)
    cluster_sig = rename[_distinct_rows(rng, n_clusters, cluster_features, 0, half)]
    label_sig = rename[_distinct_rows(rng, n_labels, label_features, half, n_features)]
    idf = rng.uniform(1.0, 3.0, n_features)
    # samples
    primary = np.minimum(np.searchsorted(np.cumsum(prior), rng.random(n_samples)), n_labels - 1)
    extra = np.minimum(rng.poisson(extra_labels, n_samples), sizes[cluster_of[primary]] - 1)
    source = rng.choice(3, size=(n_samples, nnz), p=[p_label, p_cluster, 1 - p_label - p_cluster])
    pick_l = rng.integers(0, label_features, (n_samples, nnz))
    pick_c = rng.integers(0, cluster_features, (n_samples, nnz))
    noise = rng.integers(0, n_features, (n_samples, nnz))
    feats = np.where(
        source == 0,
        label_sig[primary[:, None], pick_l],
        np.where(source == 1, cluster_sig[cluster_of[primary][:, None], pick_c], noise),
    )
    rows = np.repeat(np.arange(n_samples), nnz)
    counts = sp.csr_matrix(
        (np.ones(rows.size), (rows, feats.ravel())), shape=(n_samples, n_features)
    )
    counts.sum_duplicates()
    counts.sort_indices()
    X = counts.copy()
    X.data = X.data * idf[X.indices]
    norms = np.sqrt(np.asarray(X.multiply(X).sum(1)).ravel())
    X.data /= np.repeat(norms, np.diff(X.indptr))
    X = X.astype(np.float32)
    # labels: the primary and `extra` others of its cluster
    Y = _labels(rng, primary, extra, cluster_of, cluster_ptr, cluster_labels, n_labels)
    generator = {
        "prior": prior,
        "cluster_of": cluster_of,
        "label_signatures": label_sig,
        "cluster_signatures": cluster_sig,
        "idf": idf,
        "p_label": p_label,
        "p_cluster": p_cluster,
        "extra_share": _extra_share(extra_labels, cluster_size),
        "nnz": nnz,
    }
    top = _bayes_top(counts, generator, np.ones(n_labels, dtype=bool))
    hits = np.asarray(Y[np.arange(n_samples), top]).ravel() > 0
    return SyntheticXMC(X, Y, float(hits.mean()), hits, top, generator)


def oracle_top(
    data: SyntheticXMC, rows: np.ndarray | None = None, labels: np.ndarray | None = None
) -> np.ndarray:
    """The Bayes-optimal top label of generated rows, among a subset of the labels.

    Parameters
    ----------
    data : SyntheticXMC
        A problem from :func:`make_extreme_classification`.
    rows : numpy.ndarray of int, optional
        Rows of ``data.X`` to score (default all).
    labels : numpy.ndarray of bool, optional
        ``(n_labels,)`` mask of the labels that may be the top (default every label); the others
        still count in their cluster's posterior mass.

    Returns
    -------
    numpy.ndarray of int64
        The top label of each row; equals ``data.oracle_top[rows]`` without ``labels``.
    """
    g = data.generator
    n_samples, n_features = data.X.shape
    n_labels = len(g["prior"])
    rows = np.arange(n_samples) if rows is None else np.asarray(rows)
    if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
        raise ValueError("rows must be a 1-d array of row indices")
    if rows.size and (rows.min() < 0 or rows.max() >= n_samples):
        raise ValueError(f"rows must lie in [0, {n_samples})")
    allowed = np.ones(n_labels, dtype=bool) if labels is None else np.asarray(labels)
    if allowed.dtype != np.bool_ or allowed.shape != (n_labels,):
        raise ValueError(f"labels must be a boolean mask of shape ({n_labels},)")
    if not allowed.any():
        raise ValueError("labels must allow at least one label")
    # each row is counts * idf scaled to unit length and its counts sum to nnz
    block = sp.csr_matrix(data.X[rows], dtype=np.float64)
    block.data /= g["idf"][block.indices]
    block.data *= g["nnz"] / np.repeat(
        np.add.reduceat(block.data, block.indptr[:-1]), np.diff(block.indptr)
    )
    block.data = np.rint(block.data)
    return _bayes_top(block, g, allowed)


def _bayes_top(counts: sp.csr_matrix, generator: dict, allowed: np.ndarray) -> np.ndarray:
    """The top label of each row of feature ``counts`` by ``P(l in labels | x)`` among the labels
    with ``allowed`` (see the module docstring)."""
    prior, cluster_of = generator["prior"], generator["cluster_of"]
    label_sig, cluster_sig = generator["label_signatures"], generator["cluster_signatures"]
    pi, nnz = generator["extra_share"], generator["nnz"]
    n_labels, n_features = len(prior), counts.shape[1]
    n_clusters = len(cluster_sig)
    cluster_size = int(np.bincount(cluster_of, minlength=n_clusters).max())
    bg = (1 - generator["p_label"] - generator["p_cluster"]) / n_features
    alpha = math.log1p(generator["p_label"] / label_sig.shape[1] / bg)
    beta = math.log1p(generator["p_cluster"] / cluster_sig.shape[1] / bg)
    slots = np.argsort(cluster_of, kind="stable")  # cluster c: slots c * cluster_size, ...
    slot_inv_ptr, slot_inv = _inverse(label_sig[slots], n_features)
    cluster_inv_ptr, cluster_inv = _inverse(cluster_sig, n_features)
    slot_prior = prior[slots]
    slot_allowed = allowed[slots]
    cluster_prior = np.bincount(cluster_of, weights=prior, minlength=n_clusters)
    starts = np.arange(0, n_labels, cluster_size)
    best_in = np.maximum.reduceat(np.where(slot_allowed, slot_prior, -1.0), starts)
    open_clusters = np.flatnonzero(best_in >= 0)
    fallback = (1 - pi) * best_in[open_clusters] + pi * cluster_prior[open_clusters]
    fallback_order = open_clusters[np.argsort(-fallback, kind="stable")]
    return bayes_top_labels(
        counts.indptr.astype(np.int64),
        counts.indices.astype(np.int64),
        counts.data.astype(np.int64),
        slot_inv_ptr,
        slot_inv,
        cluster_inv_ptr,
        cluster_inv,
        cluster_size,
        slots.astype(np.int64),
        slot_prior,
        slot_allowed,
        fallback_order,
        np.exp(beta * np.arange(nnz + 1)[:, None] + alpha * np.arange(nnz + 1)[None, :]),
        pi,
        min(64, counts.shape[0]),
    )


def _distinct_rows(rng, rows: int, width: int, low: int, high: int) -> np.ndarray:
    """``(rows, width)`` integers in ``[low, high)``, distinct within each row."""
    out = rng.integers(low, high, (rows, width))
    while True:
        ordered = np.sort(out, axis=1)
        bad = np.flatnonzero((np.diff(ordered, axis=1) == 0).any(1))
        if bad.size == 0:
            return out
        out[bad] = rng.integers(low, high, (bad.size, width))


def _extra_share(mean: float, cluster_size: int) -> float:
    """``E[min(K, c - 1)] / (c - 1)`` for ``K ~ Poisson(mean)``: ``pi`` (exact for full
    clusters)."""
    if cluster_size == 1:
        return 0.0
    top = cluster_size - 1
    pmf = [math.exp(-mean) * mean**k / math.factorial(k) for k in range(top)]
    expected = sum(k * p for k, p in enumerate(pmf)) + top * (1 - sum(pmf))
    return expected / top


def _labels(rng, primary, extra, cluster_of, cluster_ptr, cluster_labels, n_labels):
    """Indicator matrix of each sample's primary label and ``extra`` random others of its
    cluster."""
    n = len(primary)
    width = int(np.max(np.diff(cluster_ptr)))
    start = cluster_ptr[cluster_of[primary]]
    size = cluster_ptr[cluster_of[primary] + 1] - start
    slot = np.arange(width)[None, :]
    members = np.where(
        slot < size[:, None],
        cluster_labels[np.minimum(start[:, None] + slot, len(cluster_labels) - 1)],
        -1,
    )
    keys = rng.random((n, width))
    keys[(members == primary[:, None]) | (members < 0)] = 2.0  # never picked as an extra
    order = np.argsort(keys, axis=1)
    picked = np.take_along_axis(members, order, 1)
    take = slot < extra[:, None]
    rows = np.concatenate([np.arange(n), np.repeat(np.arange(n), take.sum(1))])
    cols = np.concatenate([primary, picked[take]])
    Y = sp.csr_matrix((np.ones(rows.size, dtype=np.float32), (rows, cols)), shape=(n, n_labels))
    Y.sum_duplicates()
    Y.data[:] = 1
    return Y
