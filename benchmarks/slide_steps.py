"""One process against P simulated shards, step by step, at the issue's size (issue 13).

On ``make_extreme_classification`` data, trains ``SampledMLP`` models with the same options for
the first ``--steps`` steps of the epoch and prints, per model:

- held-out precision@1 every ``--eval-every`` steps (the P@1-vs-step curve);
- the seconds of each phase of a step (hidden forward/backward/Adam, the shards' selection,
  logits, backward, Adam and rehash), in the first and the last ``--window`` steps;
- the selection quality of the final weights: on held-out rows, per model configuration given
  the same parameters, the candidates of a query (union of its buckets over all shards),
  the share of the rows' labels and of the exact top-10 logits among them, and the share of
  the exact top-10 among the active set selected without forcing labels.

``--models`` names the runs as ``SHARDS:ORDER[:BUCKET]`` (``ORDER``: ``hogwild`` or ``inorder``;
``BUCKET`` the bucket cap of each shard, default ``--bucket-size``); ``2:inorder`` is the
arithmetic of ``DistributedSampledMLP`` at P = 2 (tested equal to it to 1e-5).

Usage::

    flock /tmp/dasknn-tests.lock python benchmarks/slide_steps.py --samples 100000 --steps 200
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
from machine import describe

from dasknn.datasets import make_extreme_classification
from dasknn.optim import Adam
from dasknn.sampled import SampledMLP
from dasknn.sampled.model import epoch_batches, precision_at_k

PHASES = {
    "hidden_layer_": ("forward", "backward", "apply"),
    "shard": ("select", "logits", "backward", "apply", "end_step"),
}


def make_model(args, shards: int, hogwild: bool, bucket: int) -> SampledMLP:
    """``SampledMLP`` with the options of the benchmark runs S13/S16 (constant lr)."""
    return SampledMLP(
        hidden=args.hidden,
        active_fraction=args.active_fraction,
        k=args.k,
        n_tables=args.tables,
        bucket_size=bucket,
        rehash_every=args.rehash_every,
        correction="logq",
        hashing="mips",
        uniform_fraction=args.uniform_fraction,
        hidden_update="all",
        optimizer=Adam(lr=args.lr),
        lr_decay=0.0,  # constant, as in S19 (each group of batches is a fit call of its own)
        shards=shards,
        hogwild=hogwild,
        seed=0,
    )


def time_phases(model: SampledMLP, seconds: dict) -> None:
    """Wrap the layers' methods of ``model`` so that each call adds its time to
    ``seconds[phase]``."""

    def timed(name, method):
        def call(*a, **kw):
            start = time.perf_counter()
            out = method(*a, **kw)
            seconds[name] += time.perf_counter() - start
            return out

        return call

    for name in PHASES["hidden_layer_"]:
        layer = model.hidden_layer_
        setattr(layer, name, timed(f"hidden {name}", getattr(layer, name)))
    for shard in model.shards_:
        for name in PHASES["shard"]:
            setattr(shard, name, timed(f"output {name}", getattr(shard, name)))


def selection_quality(model: SampledMLP, X, Y) -> str:
    """Candidates, label recall and top-10 recall of ``model``'s tables on rows ``X``."""
    hidden = model.hidden_layer_.forward(X)
    params = model.parameters()
    scores = hidden @ params["output_weights"].T + params["output_bias"]
    top10 = np.argpartition(-scores, 10, axis=1)[:, :10]
    n = X.shape[0]
    cand_count = np.zeros(n)
    label_hits = top_hits = active_top = 0.0
    candidates = [[] for _ in range(n)]
    for shard in model.shards_:
        codes = shard.family.codes(shard.hashed_queries(hidden))
        for b in range(n):
            candidates[b].append(shard.ids[shard.tables.query(codes[b])])
    active = model.active_sets(X)
    for b in range(n):
        union = np.concatenate(candidates[b])
        cand_count[b] = len(union)
        labels = Y.indices[Y.indptr[b] : Y.indptr[b + 1]]
        label_hits += np.isin(labels, union).mean()
        top_hits += np.isin(top10[b], union).mean()
        active_top += np.isin(top10[b], active[b]).mean()
    return (
        f"candidates median {np.median(cand_count):.0f} mean {cand_count.mean():.0f}; "
        f"labels among them {label_hits / n:.3f}; exact top-10 among them {top_hits / n:.3f}, "
        f"among the active set {active_top / n:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=100_000)
    parser.add_argument("--labels", type=int, default=200_000)
    parser.add_argument("--test", type=int, default=2000)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--window", type=int, default=40, help="steps a phase profile covers")
    parser.add_argument("--probe", type=int, default=500, help="held-out rows of the probe")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--active-fraction", type=float, default=0.005)
    parser.add_argument("--k", type=int, default=9)
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--bucket-size", type=int, default=128)
    parser.add_argument("--rehash-every", type=int, default=10)
    parser.add_argument("--uniform-fraction", type=float, default=0.3)
    parser.add_argument("--models", nargs="+", default=["1:hogwild", "2:inorder"])
    parser.add_argument(
        "--probe-as",
        nargs="*",
        default=["1", "2", "2:64"],
        help="SHARDS[:BUCKET] configurations the final weights of each model are probed in",
    )
    args = parser.parse_args()
    print(f"machine: {describe()}")
    start = time.perf_counter()
    data = make_extreme_classification(
        n_samples=args.samples + args.test,
        n_features=args.features,
        n_labels=args.labels,
        seed=0,
    )
    print(f"data: {args.samples} + {args.test} rows, made in {time.perf_counter() - start:.1f} s")
    X, Y = data.X, data.Y
    test = np.arange(args.samples, args.samples + args.test)
    Xt, Yt = X[test], Y[test]
    test_labels = (Yt.indptr.astype(np.int64), Yt.indices.astype(np.int64))
    batches = list(epoch_batches(args.samples, args.batch, 0, 0, True))[: args.steps]

    for spec in args.models:
        shards, order, *bucket = spec.split(":")
        cap = int(bucket[0]) if bucket else args.bucket_size
        model = make_model(args, int(shards), order == "hogwild", cap)
        model.initialize(args.features, args.labels)
        model.fit(X[batches[0]], Y[batches[0]], shuffle=False)  # compile; then start afresh
        model.initialize(args.features, args.labels)
        model.n_steps_ = 0
        model.optimizer_ = Adam(lr=args.lr)
        seconds: dict = defaultdict(float)
        time_phases(model, seconds)
        curve, snaps, train_s = [], {0: ({}, 0.0)}, 0.0
        marks = {args.window, len(batches) - args.window, len(batches)}
        for step, rows in enumerate(batches, 1):
            begin = time.perf_counter()
            model.fit(X[rows], Y[rows], shuffle=False)
            train_s += time.perf_counter() - begin
            if step in marks:
                snaps[step] = (dict(seconds), train_s)
            if step % args.eval_every == 0 or step == len(batches):
                kept = dict(seconds)  # predict's hidden forward is not training time
                p1 = precision_at_k(model.predict(Xt, 1), *test_labels, 1)
                seconds.clear()
                seconds.update(kept)
                curve.append(f"{step}:{p1:.4f}")
        print(f"\n{spec}: P@1 after steps {' '.join(curve)}", flush=True)
        for lo, hi in ((0, args.window), (len(batches) - args.window, len(batches))):
            (s0, t0), (s1, t1) = snaps[lo], snaps[hi]
            span = hi - lo
            parts = ", ".join(
                f"{k} {1e3 * (v - s0.get(k, 0.0)) / span:.1f}" for k, v in sorted(s1.items())
            )
            print(
                f"  ms a step, steps {lo + 1}-{hi}: total {1e3 * (t1 - t0) / span:.1f}; {parts}",
                flush=True,
            )
        params = model.parameters()
        probe = np.arange(min(args.probe, args.test))
        for conf in args.probe_as:
            shards_p, *bucket_p = conf.split(":")
            cap_p = int(bucket_p[0]) if bucket_p else args.bucket_size
            twin = make_model(args, int(shards_p), True, cap_p).set_parameters(params)
            print(f"  probe as {conf}: {selection_quality(twin, Xt[probe], Yt[probe])}", flush=True)


if __name__ == "__main__":
    main()
