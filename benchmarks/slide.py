"""LSH-sampled training (SLIDE / D-SLIDE) against PyTorch CPU with a full softmax, one run.

On ``make_extreme_classification`` data (sizes below), beside the Bayes-optimal ceiling:

1. PyTorch CPU (2 threads): ``EmbeddingBag`` (sum, TF-IDF weights) + ReLU + full-softmax
   ``Linear``, ``torch.optim.Adam`` with the sampled models' learning-rate schedule
   (``LambdaLR`` with :func:`dasknn.sampled.schedule.lr_scale` of each step), one epoch per
   learning rate of a small grid; the best is the anchor;
2. dasknn ``SampledMLP`` in one process (HOGWILD over the batch, numba threads), one epoch;
3. dasknn ``DistributedSampledMLP`` on a LocalCluster of ``P`` single-threaded workers, one epoch,
   with the bytes between workers measured and set beside the formula.

Each run evaluates precision@1 on held-out rows at checkpoints (evaluation time excluded from the
training time), so the time to reach ``0.8 x`` PyTorch's one-epoch precision@1 is read off the
same runs. Output-layer multiply-adds of the sampled model are counted from its active sets.

``--net RATE`` runs the comparison on links instead (root only): on a :class:`harness.NetCluster`
(scheduler and ``--net-workers`` workers in their own network namespaces, every link shaped to
``RATE``), with the sizes above, dasknn ``DistributedSampledMLP`` with SLIDE's own sampled softmax
(one shard a worker; seconds a step and the bytes a step between workers, measured, beside the
formula), the same model with every neuron active (dense model parallelism), and PyTorch DDP over
gloo, one process a worker (run as a task on the same workers) training the same network with a
full softmax on ``B / P`` rows each (seconds a step; the bytes a step are those of its ring
allreduce, ``2 (P - 1) / P`` times the parameter bytes sent by each worker), ``--net-steps`` timed
steps after one.

Usage::

    python benchmarks/slide.py [--samples 100000] [--labels 200000]
    python benchmarks/slide.py --net 1gbit   # shaped links (root)
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp
from harness import NetCluster, add_json_option, describe, unavailable_reason, write_json

from dasknn.datasets import make_extreme_classification, oracle_top, stdlib_next_word
from dasknn.optim import Adam
from dasknn.runtime.cluster import scheduler_workers
from dasknn.sampled import SampledMLP
from dasknn.sampled.model import epoch_batches, precision_at_k
from dasknn.sampled.schedule import lr_scale
from dasknn.sampled_parallel import DistributedSampledMLP


class Curve:
    """Training seconds (evaluation excluded) and held-out precision@1 at checkpoints."""

    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []

    def time_to(self, target: float) -> float | None:
        for seconds, p1 in self.points:
            if p1 >= target:
                return seconds
        return None


def timed_epoch(
    train: np.ndarray,
    args,
    steps: Callable[[list[np.ndarray]], object],
    evaluate: Callable[[], float],
) -> tuple[float, float, Curve, float]:
    """One epoch over the rows ``train`` in batches of ``args.batch``, given to
    ``steps(batches)`` ``args.eval_every`` batches at a time and timed without the held-out
    ``evaluate()``, which runs after each group and at the end: (P@1, seconds, curve,
    samples/s)."""
    curve = Curve()
    elapsed = 0.0
    batches = [train[b] for b in epoch_batches(len(train), args.batch, 0, 0, True)]
    for first in range(0, len(batches), args.eval_every):
        start = time.perf_counter()
        steps(batches[first : first + args.eval_every])
        elapsed += time.perf_counter() - start
        if first + args.eval_every < len(batches):
            curve.points.append((elapsed, evaluate()))
            step = first + args.eval_every
            print(f"  step {step}: {elapsed:.1f} s, P@1 {curve.points[-1][1]:.4f}", flush=True)
    p1 = evaluate()
    curve.points.append((elapsed, p1))
    return p1, elapsed, curve, len(train) / elapsed


def epoch_steps(args) -> int:
    """Batches in one epoch: the horizon of every model's learning-rate schedule."""
    return -(-args.samples // args.batch)


def _labels_of(Y):
    return Y.indptr.astype(np.int64), Y.indices.astype(np.int64)


def torch_trainer(
    data, test: np.ndarray, args, lr: float
) -> tuple[Callable[[list[np.ndarray]], None], Callable[[], float]]:
    """The PyTorch anchor, fresh: ``steps(batches)`` trains on each batch of rows in turn and
    ``evaluate()`` is its precision@1 on the held-out rows ``test``. Step ``s`` (0 for the
    first) takes ``lr * lr_scale(s, epoch_steps(args), args.torch_lr_decay)``, the factor the
    sampled models take at their step ``s``."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    X, Y = data.X, data.Y
    n_features, n_labels = X.shape[1], Y.shape[1]
    emb = torch.nn.EmbeddingBag(n_features, args.hidden, mode="sum")
    lin = torch.nn.Linear(args.hidden, n_labels)
    opt = torch.optim.Adam(list(emb.parameters()) + list(lin.parameters()), lr=lr)
    horizon = epoch_steps(args)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_scale(s, horizon, args.torch_lr_decay)
    )

    def forward(rows):
        block = X[rows]
        idx = torch.from_numpy(block.indices.astype(np.int64))
        off = torch.from_numpy(block.indptr[:-1].astype(np.int64))
        val = torch.from_numpy(block.data)
        return lin(torch.relu(emb(idx, off, per_sample_weights=val)))

    def evaluate():
        with torch.no_grad():
            top = np.concatenate(
                [
                    forward(test[s : s + 512]).argmax(1, keepdim=True).numpy()
                    for s in range(0, len(test), 512)
                ]
            )
        return precision_at_k(top, *_labels_of(Y[test]), 1)

    def step(rows):
        z = forward(rows)
        block = Y[rows]
        r = torch.from_numpy(np.repeat(np.arange(len(rows)), np.diff(block.indptr)))
        c = torch.from_numpy(block.indices.astype(np.int64))
        w = torch.from_numpy(1.0 / np.diff(block.indptr)[r.numpy()]).float()
        loss = (torch.logsumexp(z, 1).sum() - (z[r, c] * w).sum()) / len(rows)
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()

    def steps(batches):
        for rows in batches:
            step(rows)

    return steps, evaluate


def run_torch(data, train, test, args, lr: float) -> tuple[float, float, Curve, float]:
    """One epoch of the PyTorch anchor: (P@1, seconds, curve, samples/s)."""
    return timed_epoch(train, args, *torch_trainer(data, test, args, lr))


def sampled_model(args, shards: int, hogwild: bool) -> SampledMLP:
    """The run's sampled model with ``shards`` shards (``hogwild``: HOGWILD over the batch)."""
    return SampledMLP(
        hidden=args.hidden,
        active_fraction=args.active_fraction,
        hash_family=args.family,
        k=args.k,
        n_tables=args.tables,
        bucket_size=args.bucket_size,
        rehash_every=args.rehash_every,
        rebuild_every=args.rebuild_every,
        correction=args.correction,
        hashing=args.hashing,
        uniform_fraction=args.uniform_fraction,
        hidden_update=args.hidden_update,
        optimizer=Adam(lr=args.slide_lr),
        lr_decay=args.lr_decay,
        decay_horizon=epoch_steps(args),  # one epoch, fitted in groups of batches
        shards=shards,
        hogwild=hogwild,
        seed=0,
    )


def run_sampled(model, data, train, test, args) -> tuple[float, float, Curve, float]:
    """One epoch of a sampled model (local or distributed): (P@1, seconds, curve, samples/s).

    Each group of batches is one ``fit`` call over their rows in order (``shuffle=False``), so
    the distributed model queues its steps as in any ``fit``."""
    X, Y = data.X, data.Y

    def steps(batches):
        rows = np.concatenate(batches)
        model.fit(X[rows], Y[rows], epochs=1, batch_size=args.batch, shuffle=False)

    return timed_epoch(train, args, steps, lambda: model.precision_at_k(X[test], Y[test], 1))


def learnable_ceilings(data, train: np.ndarray, test: np.ndarray) -> str:
    """What the training rows can teach about the held-out rows, for labels seen at least 1, 2
    and 5 times in training: the share of held-out rows with such a label, the share whose
    Bayes-optimal top label is such a label and right, and the precision@1 of the Bayes-optimal
    scorer that may name such labels only (a learner cannot rank a label it never saw above
    the others but by chance)."""
    Y = data.Y
    seen = np.bincount(Y[train].indices, minlength=Y.shape[1])
    held = Y[test]
    right = np.asarray(held[np.arange(len(test)), data.oracle_top[test]]).ravel() > 0
    parts = []
    for times in (1, 2, 5):
        known = seen >= times
        any_known = np.add.reduceat(known[held.indices], held.indptr[:-1]) > 0
        among = oracle_top(data, test, known)
        ceiling = (np.asarray(held[np.arange(len(test)), among]).ravel() > 0).mean()
        parts.append(
            f"labels seen >= {times}x: held-out rows with one {any_known.mean():.4f}, "
            f"oracle right on one {(right & known[data.oracle_top[test]]).mean():.4f}, "
            f"oracle among them {ceiling:.4f}"
        )
    return "; ".join(parts)


def ddp_steps(rank, world, master, port, features, labels, hidden, batch, nnz, steps):
    """On a worker: DDP training steps of the full-softmax network; seconds a step (rank's)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world
    )

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.EmbeddingBag(features, hidden, mode="sum")
            self.lin = torch.nn.Linear(hidden, labels)

        def forward(self, idx, off, val):
            return self.lin(torch.relu(self.emb(idx, off, per_sample_weights=val)))

    torch.manual_seed(0)
    model = DistributedDataParallel(Net())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rows = batch // world
    gen = torch.Generator().manual_seed(rank)
    idx = torch.randint(0, features, (rows * nnz,), generator=gen)
    off = torch.arange(0, rows * nnz, nnz)
    val = torch.rand(rows * nnz, generator=gen)
    target = torch.randint(0, labels, (rows,), generator=gen)

    def step():
        loss = torch.nn.functional.cross_entropy(model(idx, off, val), target)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    seconds = (time.perf_counter() - start) / steps
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    dist.destroy_process_group()
    return seconds, params


def dslide_steps(client, data, args, fraction: float, steps: int):
    model = SampledMLP(
        hidden=args.hidden,
        active_fraction=fraction,
        k=9,
        n_tables=50,
        correction="none",  # SLIDE's own sampled softmax (plain SimHash, no correction)
        hashing="plain",
        uniform_fraction=0.0,
        hidden_update="rows",
        optimizer=Adam(lr=3e-3),
        shards=args.net_workers,
        hogwild=False,
        seed=0,
    ).initialize(args.features, args.labels)
    with DistributedSampledMLP(model, client) as dist:
        rows = np.arange(args.batch)
        dist.train_step(data.X[rows], data.Y[rows])  # warm-up (compilation)
        dist.reset_comm()
        start = time.perf_counter()
        for s in range(steps):
            rows = np.arange((s + 1) * args.batch, (s + 2) * args.batch)
            dist.train_step(data.X[rows], data.Y[rows])
        seconds = (time.perf_counter() - start) / steps
        measured = dist.comm_report().total() / steps
        formula = sum(dist.predicted_bytes(args.batch).values())
    return seconds, measured, formula


def net(args) -> None:
    """D-SLIDE against PyTorch DDP on shaped links (``--net RATE``)."""
    from distributed import Client

    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot run: {reason}")
    print(f"machine: {describe()}; links {args.net}, P = {args.net_workers}")
    data = make_extreme_classification(
        n_samples=(args.net_steps + 2) * args.batch,
        n_features=args.features,
        n_labels=args.labels,
        seed=0,
    )
    # gloo picks its interface from the hostname (loopback here): name the namespace link
    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    with (
        NetCluster(workers=args.net_workers, rate=args.net, env=env) as cluster,
        Client(cluster.address) as client,
    ):
        workers = sorted(scheduler_workers(client))
        sec, measured, formula = dslide_steps(client, data, args, 0.005, args.net_steps)
        print(
            f"D-SLIDE (active fraction 0.005): {sec:.3f} s a step, {measured / 1e6:.3f} MB a "
            f"step between workers (formula {formula / 1e6:.3f} MB)",
            flush=True,
        )
        master = workers[0].split("://")[1].rsplit(":", 1)[0]
        futures = [
            client.submit(
                ddp_steps,
                rank,
                args.net_workers,
                master,
                29511,
                args.features,
                args.labels,
                args.hidden,
                args.batch,
                37,
                args.net_steps,
                workers=[w],
                pure=False,
            )
            for rank, w in enumerate(workers)
        ]
        results = client.gather(futures)
        ddp_sec = max(r[0] for r in results)
        ddp_bytes = 2 * (args.net_workers - 1) / args.net_workers * results[0][1] * args.net_workers
        print(
            f"PyTorch DDP (gloo), full softmax: {ddp_sec:.3f} s a step, about "
            f"{ddp_bytes / 1e6:.1f} MB a step between workers (ring allreduce of "
            f"{results[0][1] / 1e6:.1f} MB of gradients); D-SLIDE is {ddp_sec / sec:.1f}x faster",
            flush=True,
        )
        dense_sec, dense_measured, _ = dslide_steps(client, data, args, 1.0, args.net_dense_steps)
        print(
            f"dasknn, every neuron active (dense model parallel): {dense_sec:.3f} s a step, "
            f"{dense_measured / 1e6:.3f} MB a step; D-SLIDE is {dense_sec / sec:.1f}x faster"
        )
    write_json(args.json, "slide.py --net", {
        "rate": args.net, "workers": args.net_workers, "dslide_s": sec,
        "dslide_bytes": measured, "formula_bytes": formula, "ddp_s": ddp_sec,
        "ddp_bytes": ddp_bytes, "dense_s": dense_sec,
    })


def make_parser() -> argparse.ArgumentParser:
    """The run's options; their defaults are the measured setup (sizes and models)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=100_000)
    parser.add_argument("--labels", type=int, default=200_000)
    parser.add_argument(
        "--zipf", type=float, default=1.0, help="Zipf exponent of the synthetic labels' popularity"
    )
    parser.add_argument("--test", type=int, default=2000, help="held-out rows")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--torch-lr", type=float, nargs="*", default=[3e-3, 1e-2])
    parser.add_argument(
        "--anchor",
        type=float,
        nargs=2,
        metavar=("P1", "RATE"),
        help="PyTorch's one-epoch P@1 and samples/s from an earlier run on the same data (with "
        "no --torch-lr); times to its 0.8x P@1 are then set beside that run's",
    )
    parser.add_argument(
        "--torch-steps",
        type=int,
        help="time PyTorch on this many batches only, for its samples/s (P@1 from --anchor)",
    )
    parser.add_argument("--no-local", action="store_true", help="skip the one-process model")
    parser.add_argument("--slide-lr", type=float, default=1e-2)
    parser.add_argument(
        "--lr-decay",
        type=float,
        default=0.5,
        help="share of the epoch, at its end, over which the sampled models' lr falls to 0",
    )
    parser.add_argument(
        "--torch-lr-decay",
        type=float,
        help="the same for PyTorch (LambdaLR); default: --lr-decay, so both take one schedule",
    )
    parser.add_argument("--active-fraction", type=float, default=0.005)
    parser.add_argument("--family", choices=("simhash", "dwta"), default="simhash")
    parser.add_argument("--k", type=int, default=9)
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--bucket-size", type=int, default=128)
    parser.add_argument("--rehash-every", type=int, default=10)
    parser.add_argument("--rebuild-every", type=int, default=500)
    parser.add_argument(
        "--correction", choices=("none", "logq"), default="logq", help="sampled-softmax correction"
    )
    parser.add_argument("--hashing", choices=("plain", "mips"), default="mips")
    parser.add_argument(
        "--hidden-update", choices=("rows", "all"), default="all", help="hidden rows Adam updates"
    )
    parser.add_argument(
        "--uniform-fraction", type=float, default=0.3, help="share of a budget kept for the fill"
    )
    parser.add_argument("--eval-every", type=int, default=50, help="steps between checkpoints")
    parser.add_argument("--parts", type=int, nargs="*", default=[2])
    parser.add_argument(
        "--task",
        choices=("synthetic", "stdlib"),
        default="synthetic",
        help="stdlib: next word from 3 words of the Python standard library's sources",
    )
    parser.add_argument("--net", metavar="RATE",
                        help="compare with PyTorch DDP on links shaped to RATE instead (root)")
    parser.add_argument("--net-workers", type=int, default=2, help="with --net: P")
    parser.add_argument("--net-steps", type=int, default=5, help="with --net: timed steps")
    parser.add_argument("--net-dense-steps", type=int, default=1,
                        help="with --net: timed steps of the dense model")
    add_json_option(parser)
    return parser


def main() -> None:
    parser = make_parser()
    args = parser.parse_args()
    if args.torch_lr_decay is None:
        args.torch_lr_decay = args.lr_decay
    if args.net:
        net(args)
        return
    print(f"machine: {describe()}")

    start = time.perf_counter()
    if args.task == "stdlib":
        task = stdlib_next_word(context=3, max_train=args.samples, max_test=args.test)
        data = SimpleNamespace(
            X=sp.vstack([task.X_train, task.X_test]).tocsr(),
            Y=sp.vstack([task.Y_train, task.Y_test]).tocsr(),
        )
        args.features, args.labels = data.X.shape[1], data.Y.shape[1]
        args.samples, args.test = task.X_train.shape[0], task.X_test.shape[0]
    else:
        data = make_extreme_classification(
            n_samples=args.samples + args.test,
            n_features=args.features,
            n_labels=args.labels,
            zipf=args.zipf,
            seed=0,
        )
    zipf = f", zipf {args.zipf:g}" if args.task == "synthetic" else ""
    print(
        f"data ({args.task}{zipf}): {args.samples} training + {args.test} held-out rows, "
        f"{args.features} features, {args.labels} labels, "
        f"{data.X.nnz / data.X.shape[0]:.1f} nonzeros and "
        f"{data.Y.nnz / data.Y.shape[0]:.2f} labels a row; made in "
        f"{time.perf_counter() - start:.1f} s"
    )
    train = np.arange(args.samples)
    test = np.arange(args.samples, args.samples + args.test)
    oracle = float(data.oracle_hits[test].mean()) if args.task == "synthetic" else float("nan")
    print(f"oracle (Bayes-optimal) precision@1 on the held-out rows: {oracle:.4f}")
    if args.task == "synthetic":
        print(learnable_ceilings(data, train, test), flush=True)

    rows = []
    best = None
    for lr in args.torch_lr if args.torch_steps else []:
        steps, _ = torch_trainer(data, test, args, lr)
        batches = [train[b] for b in epoch_batches(len(train), args.batch, 0, 0, True)]
        start = time.perf_counter()
        steps(batches[: args.torch_steps])
        rate = args.torch_steps * args.batch / (time.perf_counter() - start)
        print(f"torch lr={lr:g}: {rate:.0f} samples/s over the first {args.torch_steps} steps")
        args.anchor = (args.anchor[0], rate)
    for lr in [] if args.torch_steps else args.torch_lr:
        p1, sec, curve, rate = run_torch(data, train, test, args, lr)
        name = f"PyTorch full softmax, Adam lr={lr:g}, lr decay {args.torch_lr_decay:g}"
        rows.append((name, p1, sec, rate, curve))
        print(f"{name}: P@1 {p1:.4f}, {sec:.1f} s, {rate:.0f} samples/s", flush=True)
        if best is None or p1 > best[0]:
            best = (p1, sec, rate, curve)
    if best is None:
        if args.anchor is None:
            parser.error("give --torch-lr or --anchor")
        torch_p1, torch_rate = args.anchor
    else:
        torch_p1, _, torch_rate, _ = best

    if not args.no_local:
        local = sampled_model(args, 1, True).initialize(args.features, args.labels)
        sizes = [len(a) for a in local.active_sets(data.X[train[:512]], data.Y[train[:512]])]
        mac_ratio = float(np.mean(sizes)) / args.labels
        p1, sec, curve, rate = run_sampled(local, data, train, test, args)
        rows.append(("dasknn SampledMLP, 1 process (HOGWILD)", p1, sec, rate, curve))
        print(f"sampled local: P@1 {p1:.4f}, {sec:.1f} s, {rate:.0f} samples/s", flush=True)
        print(
            f"output-layer multiply-adds vs dense: {mac_ratio:.4%} "
            f"(mean active set {np.mean(sizes):.0f} of {args.labels})"
        )

    if args.parts:
        from distributed import Client, LocalCluster

        os.environ["NUMBA_NUM_THREADS"] = "1"  # one core a worker
        for parts in args.parts:
            model = sampled_model(args, parts, False).initialize(args.features, args.labels)
            with (
                LocalCluster(
                    n_workers=parts, threads_per_worker=1, dashboard_address=":0"
                ) as cluster,
                Client(cluster) as client,
            ):
                with DistributedSampledMLP(model, client) as dist:
                    p1, sec, curve, rate = run_sampled(dist, data, train, test, args)
                    measured = dist.comm_report().by("phase")
                    steps = dist.n_steps_
                    formula = dist.predicted_bytes(args.batch)
            name = f"dasknn DistributedSampledMLP, P={parts} (LocalCluster)"
            rows.append((name, p1, sec, rate, curve))
            train_bytes = sum(v for k, v in measured.items() if k in formula)
            print(
                f"D-SLIDE P={parts}: P@1 {p1:.4f}, {sec:.1f} s, {rate:.0f} samples/s; "
                f"{train_bytes / steps / 1e6:.3f} MB a step between workers "
                f"(formula for a full batch {sum(formula.values()) / 1e6:.3f} MB), by phase "
                f"{measured}",
                flush=True,
            )

    target = 0.8 * torch_p1
    print()
    print(
        f"| run | P@1 | / PyTorch | / oracle | epoch s | samples/s | vs PyTorch | "
        f"s to {target:.3f} |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, p1, sec, rate, curve in rows:
        reach = curve.time_to(target)
        print(
            f"| {name} | {p1:.4f} | {p1 / torch_p1:.2f} | {p1 / oracle:.2f} | {sec:.1f} | "
            f"{rate:.0f} | {rate / torch_rate:.2f}x | "
            f"{'not reached' if reach is None else f'{reach:.1f}'} |"
        )
    write_json(args.json, "slide.py", [
        {"run": name, "p_at_1": p1, "epoch_s": sec, "samples_per_s": rate,
         "vs_pytorch": rate / torch_rate, "s_to_target": curve.time_to(target)}
        for name, p1, sec, rate, curve in rows
    ])


if __name__ == "__main__":
    main()
