"""How much of the oracle's precision@1 a learner can reach on ``make_extreme_classification``.

For each training size and Zipf exponent, on held-out rows (sizes as ``benchmarks/slide.py``):

1. the Bayes-optimal scorer (the oracle) and the same scorer allowed to name only the labels that
   the training rows carry (``dasknn.datasets.oracle_top``): the learnable ceiling of any
   learner, for any number of epochs;
2. a one-pass learner of the generator's own family: multinomial naive Bayes over the TF-IDF
   values, counted from the training rows in one pass (each label of a row takes the row),
   Laplace smoothing ``alpha`` from a grid; numpy/scipy only;
3. optionally the PyTorch anchor of ``benchmarks/slide.py`` (same model, Adam) for several
   epochs, precision@1 after each.

Usage::

    flock /tmp/dasknn-tests.lock python benchmarks/slide_ceiling.py --samples 30000 100000 \\
        --torch-epochs 3 --torch-lr 0.01
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp
from machine import describe
from slide import torch_trainer

from dasknn.datasets import make_extreme_classification, oracle_top
from dasknn.sampled.model import epoch_batches


def precision_at_1(Y: sp.csr_matrix, top: np.ndarray) -> float:
    """Share of the rows of ``Y`` whose label ``top`` is one of theirs."""
    return float((np.asarray(Y[np.arange(Y.shape[0]), top]).ravel() > 0).mean())


def naive_bayes_top(
    X_train: sp.csr_matrix,
    Y_train: sp.csr_matrix,
    X_test: sp.csr_matrix,
    alpha: float,
    chunk: int = 250,
) -> np.ndarray:
    """Top label of each test row by multinomial naive Bayes counted from the training rows.

    ``score(l) = log prior(l) + sum_f x_f log p(f | l)`` with ``p(f | l) = (N_lf + alpha) /
    (N_l + alpha F)``, ``N = Y_train^T X_train``, and the prior the labels' training counts;
    labels no training row carries are never named."""
    n_features = X_train.shape[1]
    seen = np.flatnonzero(np.bincount(Y_train.indices, minlength=Y_train.shape[1]))
    Yt = sp.csc_matrix(Y_train, dtype=np.float64)[:, seen].T.tocsr()
    N = (Yt @ sp.csr_matrix(X_train, dtype=np.float64)).tocsr()
    total = np.asarray(N.sum(1)).ravel()
    log_prior = np.log(np.diff(Yt.indptr) / Y_train.shape[0])
    N.data = np.log1p(N.data / alpha)  # log(N_lf + alpha) - log(alpha)
    base = np.log(alpha) - np.log(total + alpha * n_features)
    X_test = sp.csr_matrix(X_test, dtype=np.float64)
    mass = np.asarray(X_test.sum(1)).ravel()
    top = np.empty(X_test.shape[0], dtype=np.int64)
    for start in range(0, X_test.shape[0], chunk):
        block = slice(start, start + chunk)
        score = (X_test[block] @ N.T).toarray() + mass[block, None] * base + log_prior
        top[block] = seen[np.argmax(score, axis=1)]
    return top


def ceilings(samples: int, zipf: float, args) -> None:
    """Print the oracle, the learnable ceilings and naive Bayes for one training size."""
    start = time.perf_counter()
    data = make_extreme_classification(
        n_samples=samples + args.test,
        n_features=args.features,
        n_labels=args.labels,
        zipf=zipf,
        seed=0,
    )
    made = time.perf_counter() - start
    train = np.arange(samples)
    test = np.arange(samples, samples + args.test)
    Y_test = data.Y[test]
    oracle = float(data.oracle_hits[test].mean())
    seen = np.bincount(data.Y[train].indices, minlength=args.labels)
    line = [f"{samples} rows, zipf {zipf:g} (made in {made:.1f} s): oracle {oracle:.4f}"]
    for times in (1, 2):
        ceiling = precision_at_1(Y_test, oracle_top(data, test, seen >= times))
        line.append(f"oracle among labels seen >= {times}x {ceiling:.4f} ({ceiling / oracle:.2f}x)")
    for alpha in args.nb_alpha:
        start = time.perf_counter()
        top = naive_bayes_top(data.X[train], data.Y[train], data.X[test], alpha)
        p1 = precision_at_1(Y_test, top)
        line.append(
            f"naive Bayes alpha={alpha:g} {p1:.4f} ({p1 / oracle:.2f}x, "
            f"{time.perf_counter() - start:.1f} s)"
        )
    print("; ".join(line), flush=True)


def torch_epochs(args) -> None:
    """Train the PyTorch anchor for ``args.torch_epochs`` epochs per learning rate and print
    the held-out precision@1 after each."""
    data = make_extreme_classification(
        n_samples=args.torch_samples + args.test,
        n_features=args.features,
        n_labels=args.labels,
        seed=0,
    )
    train = np.arange(args.torch_samples)
    test = np.arange(args.torch_samples, args.torch_samples + args.test)
    oracle = float(data.oracle_hits[test].mean())
    for lr in args.torch_lr:
        steps, evaluate = torch_trainer(data, test, args, lr)
        elapsed = 0.0
        for epoch in range(args.torch_epochs):
            batches = [train[b] for b in epoch_batches(len(train), args.batch, 0, epoch, True)]
            start = time.perf_counter()
            steps(batches)
            elapsed += time.perf_counter() - start
            p1 = evaluate()
            print(
                f"PyTorch lr={lr:g}, {args.torch_samples} rows, epoch {epoch + 1}: P@1 "
                f"{p1:.4f} ({p1 / oracle:.2f}x the oracle {oracle:.4f}), {elapsed:.1f} s",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, nargs="*", default=[30_000, 100_000])
    parser.add_argument("--zipf", type=float, nargs="*", default=[1.0])
    parser.add_argument("--features", type=int, default=100_000)
    parser.add_argument("--labels", type=int, default=200_000)
    parser.add_argument("--test", type=int, default=2000, help="held-out rows")
    parser.add_argument("--nb-alpha", type=float, nargs="*", default=[0.01, 0.1])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--torch-samples", type=int, default=30_000)
    parser.add_argument("--torch-epochs", type=int, default=0)
    parser.add_argument("--torch-lr", type=float, nargs="*", default=[1e-2])
    args = parser.parse_args()
    print(f"machine: {describe()}")
    for zipf in args.zipf:
        for samples in args.samples:
            ceilings(samples, zipf, args)
    if args.torch_epochs:
        torch_epochs(args)


if __name__ == "__main__":
    main()
