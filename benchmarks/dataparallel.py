"""Data-parallel training throughput (Parallax): hybrid against ar-dense, ps, ar and PyTorch DDP.

Every figure is measured in the same run on the same namespace cluster
(:class:`harness.NetCluster`: scheduler and workers in their own network namespaces, every link
shaped to ``--rate``), the same model, the same batches:

- ``ar-dense``, ``ps``, ``ar`` and ``hybrid`` of :mod:`dasknn.data_parallel`, one shard per
  worker (``--shards`` to change it), ``--warmup`` steps by ``train_step``, then the timed
  steps by one ``fit`` (which tells the model each next batch, so ``hybrid`` and ``ps``
  prefetch the next step's rows); the figure is the timed steps' mean;
- where torch is installed, PyTorch ``DistributedDataParallel`` over gloo with one process (one
  thread) per namespace, the embedding an ``nn.EmbeddingBag(sparse=True)`` ("DDP-sparse",
  gradients allgathered) and the dense variant ("DDP-dense", the whole table allreduced).

Models: ``zipf``, V = 2^18 rows of d = 256 (mean of the 4 ids of a window, as EmbeddingBag), a
256-wide hidden layer and a 1,024-class output, global batch 1,024 windows of Zipf-distributed
ids (the embedding's traffic dominates); ``corpus``, the code tokens of Python's standard library
(``dasknn.datasets.load_stdlib_corpus("code")``, the 32,768 most frequent tokens), d = 128,
windows of 4 concatenated, a 64-wide hidden layer, next-token softmax, global batch 256.
``--output sampled`` trains either model with the sampled softmax (``--n-sampled`` log-uniform
candidates a step; the output table is then a sparse variable), in dasknn and in DDP alike.

``--search`` also runs the shard-count search of the hybrid architecture and a brute force over
``1 .. 2N`` at the largest N (``--search-steps`` a count, the first 2 discarded, the figure their
median; ``--search-repeats`` brute-force passes), and prints both. ``--architectures`` runs a
subset of the dasknn architectures; ``--messages tasks posted`` runs each of them with a task
graph per step and with one task per worker and posted messages (``messages=`` of the model;
the search uses the last one named; ``--steps-per-task K ...`` runs the posted mode once for
each ``steps_per_task=K`` of the model, labelled ``posted/kK``; ``auto``: the model's
default). ``--reuse-memory`` runs every
dasknn variant a second time with ``reuse_memory=True`` (labelled ``+reuse``), after all the
untuned ones on the same cluster (the workers keep the malloc setting until they restart);
``--reuse-memory only`` runs the tuned variants alone.
``--ddp-kinds sparse`` runs DDP-sparse only. ``--learn``
trains a next-word model on the prose corpus with the hybrid architecture and in one process,
and prints the held-out perplexity of both and of the unigram distribution per epoch.

``--compute`` times one worker's compute alone (no cluster, no root): the ``zipf`` model, one
worker's share of the batch (``--compute-windows``, default 256: N = 4), the forward and backward
pass of ``batch_gradients`` (its temporaries in a ``Workspace`` kept from one pass to the next)
against PyTorch's forward and backward of the same model (as each DDP process runs it), each in a
child process with one thread, the median of ``--compute-repeats`` passes; once in a plain
environment and once in the one Dask's nanny gives its workers (``MALLOC_TRIM_THRESHOLD_``).

Root only (network namespaces), except ``--learn`` and ``--compute``::

    PYTHONPATH=. python3 benchmarks/dataparallel.py --workers 2 4 --models zipf corpus
    PYTHONPATH=. python3 benchmarks/dataparallel.py --compute
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402
    NetCluster,
    add_json_option,
    describe,
    unavailable_reason,
    write_json,
)

ARCHITECTURES = ("ar-dense", "ps", "ar", "hybrid")
ROOT = Path(__file__).resolve().parents[1]
ONE_THREAD = ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


# ------------------------------------------------------------------ models and batches
def zipf_setup(steps: int, seed: int = 0) -> dict:
    vocab, dim, context, classes, batch = 2**18, 256, 4, 1024, 1024
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    batches = [
        (rng.choice(vocab, size=(batch, context), p=p), rng.integers(0, classes, batch))
        for _ in range(steps)
    ]
    return dict(
        name="zipf",
        vocab=vocab,
        dim=dim,
        context=context,
        hidden=256,
        classes=classes,
        combine="mean",
        batches=batches,
    )


def corpus_setup(steps: int, seed: int = 0) -> dict:
    from dasknn.datasets import load_stdlib_corpus

    corpus = load_stdlib_corpus("code", context=4, max_vocab=32768)
    rng = np.random.default_rng(seed)
    vocab = len(corpus.vocabulary)
    batches = []
    for _ in range(steps):
        rows = rng.integers(0, len(corpus.y), 256)
        batches.append((corpus.X[rows], corpus.y[rows]))
    return dict(
        name="corpus",
        vocab=vocab,
        dim=128,
        context=4,
        hidden=64,
        classes=vocab,
        combine="concat",
        batches=batches,
    )


def make_model(setup: dict):
    from dasknn.model import EmbeddingMLP

    sampled = {"output": "sampled", "n_sampled": setup["n_sampled"]} if setup["sampled"] else {}
    return EmbeddingMLP(
        setup["vocab"],
        setup["context"],
        setup["dim"],
        hidden=(setup["hidden"],),
        n_classes=setup["classes"],
        combine=setup["combine"],
        dtype=np.float32,
        seed=0,
        **sampled,
    )


def with_output(setup: dict, args) -> dict:
    """``setup`` with the output of ``--output`` / ``--n-sampled``."""
    return {**setup, "sampled": args.output == "sampled", "n_sampled": args.n_sampled}


# ------------------------------------------------------------------ dasknn
def run_dasknn(
    client,
    setup: dict,
    arch: str,
    shards: int,
    warmup: int,
    messages: str = "tasks",
    steps_per_task: int | None = None,
    reuse_memory: bool = False,
) -> dict:
    from dasknn.data_parallel import DistributedEmbeddingMLP
    from dasknn.optim import SGD

    optimizer = SGD(lr=0.05)
    batches = setup["batches"]
    per_task = {} if steps_per_task is None else {"steps_per_task": steps_per_task}
    with DistributedEmbeddingMLP(
        make_model(setup),
        client,
        architecture=arch,
        sparse_partitions=shards,
        messages=messages,
        reuse_memory=reuse_memory,
        **per_task,
    ) as dp:
        for X, y in batches[:warmup]:
            dp.train_step(X, y, optimizer=optimizer)
        dp.reset_comm()
        X = np.concatenate([b[0] for b in batches[warmup:]])
        y = np.concatenate([b[1] for b in batches[warmup:]])
        start = time.perf_counter()
        dp.fit(X, y, batch_size=len(batches[0][1]), shuffle=False, optimizer=optimizer)
        seconds = (time.perf_counter() - start) / (len(batches) - warmup)
        report = dp.comm_report()
    return {
        "seconds": seconds,
        "bytes_per_step": report.total() / (len(batches) - warmup),
        "exact": report.exact,
        "alpha": report.details["model_alpha"],
    }


def run_search(client, setup: dict, steps: int, repeats: int, messages: str = "tasks") -> dict:
    """The cost-model search, then ``repeats`` brute-force passes over ``1 .. 2N`` on one model.

    Every count's figure is the median of its ``steps - 2`` timed steps; the passes show how much
    a count's figure moves between samples, and the choice is judged against each pass and
    against the per-count median over the passes.
    """
    from dasknn.data_parallel import DistributedEmbeddingMLP

    X, y = setup["batches"][0]
    with DistributedEmbeddingMLP(
        make_model(setup), client, search_steps=steps, search_warmup=2, messages=messages
    ) as dp:
        model = dp.search(X, y, mode="model")
        print(model, flush=True)
        passes = [dict(dp.search(X, y, mode="brute-force").samples) for _ in range(repeats)]
    counts = sorted(passes[0])
    for k, brute in enumerate(passes):
        row = ", ".join(f"{p}: {brute[p] * 1e3:.0f}" for p in counts)
        print(f"brute force pass {k + 1}, ms/step by P: {row}", flush=True)
    median = {p: float(np.median([brute[p] for brute in passes])) for p in counts}
    spread = {
        p: (max(b[p] for b in passes) - min(b[p] for b in passes)) / median[p] for p in counts
    }
    print(
        "per count over the passes: median "
        + ", ".join(f"{p}: {median[p] * 1e3:.0f}" for p in counts)
        + " ms; spread (max - min) / median "
        + ", ".join(f"{p}: {100 * spread[p]:.0f}%" for p in counts),
        flush=True,
    )
    choice = model.choice
    for label, times in [*((f"pass {k + 1}", b) for k, b in enumerate(passes)), ("median", median)]:
        best = min(times, key=times.get)
        print(
            f"model choice P = {choice} against brute force ({label}): "
            f"{times[choice] / times[best]:.3f} x the best (P = {best})",
            flush=True,
        )
    return {"model": model, "passes": passes, "median": median}


# ------------------------------------------------------------------ PyTorch DDP
def ddp_worker(args) -> None:
    """One DDP process (run inside a namespace by :func:`run_ddp`)."""
    import torch
    import torch.distributed as dist

    from dasknn.model.sampled_softmax import candidate_log_expected, sample_candidates

    torch.set_num_threads(1)
    setup = zipf_setup(args.steps) if args.model == "zipf" else corpus_setup(args.steps)
    setup = with_output(setup, args)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{args.master}:29500", rank=args.rank, world_size=args.world
    )

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.combine = setup["combine"]
            sparse = args.sparse
            if self.combine == "mean":
                self.emb = torch.nn.EmbeddingBag(
                    setup["vocab"], setup["dim"], mode="mean", sparse=sparse
                )
            else:
                self.emb = torch.nn.Embedding(setup["vocab"], setup["dim"], sparse=sparse)
            width = setup["dim"] * (setup["context"] if self.combine == "concat" else 1)
            self.hidden = torch.nn.Linear(width, setup["hidden"])
            if setup["sampled"]:  # the output table [W^T | b], one row per class
                self.out = torch.nn.Embedding(setup["classes"], setup["hidden"] + 1, sparse=sparse)
            else:
                self.out = torch.nn.Linear(setup["hidden"], setup["classes"])

        def forward(self, x, t, candidates):
            h = self.emb(x) if self.combine == "mean" else self.emb(x).reshape(x.shape[0], -1)
            h = torch.relu(self.hidden(h))
            if candidates is None:
                return torch.nn.functional.cross_entropy(self.out(h), t)
            # the sampled softmax of dasknn.model.sampled_softmax: the same candidates, logQ
            # correction, accidental hits dropped
            h1 = torch.cat([h, torch.ones(h.shape[0], 1)], dim=1)
            rows = self.out(torch.cat([t, candidates]))
            z_label = (h1 * rows[: len(t)]).sum(dim=1) - log_q[t]
            z_sampled = h1 @ rows[len(t) :].T - log_q[candidates]
            hits = candidates[None, :] == t[:, None]
            logits = torch.cat([z_label[:, None], z_sampled.masked_fill(hits, -torch.inf)], 1)
            return torch.nn.functional.cross_entropy(logits, torch.zeros_like(t))

    classes = setup["classes"]
    log_q = torch.from_numpy(
        candidate_log_expected(np.arange(classes), classes, setup["n_sampled"], "log-uniform")
    ).float()

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    times = []
    for step, (X, y) in enumerate(setup["batches"]):
        rows = np.array_split(np.arange(len(y)), args.world)[args.rank]
        x, t = torch.from_numpy(X[rows]), torch.from_numpy(y[rows])
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        candidates = None
        if setup["sampled"]:
            drawn = sample_candidates(classes, setup["n_sampled"], "log-uniform", 0, step)
            candidates = torch.from_numpy(drawn)
        loss = model(x, t, candidates)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    dist.barrier()
    if args.rank == 0:
        print(json.dumps({"seconds": float(np.median(times[args.warmup :]))}), flush=True)
    dist.destroy_process_group()


def run_ddp(
    cluster: NetCluster,
    model: str,
    sparse: bool,
    steps: int,
    warmup: int,
    output: str,
    n_sampled: int,
) -> dict | None:
    command = [
        __file__, "--ddp-model", model, "--steps", str(steps), "--warmup", str(warmup),
        "--output", output, "--n-sampled", str(n_sampled),
    ] + (["--ddp-sparse"] if sparse else [])  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    outputs = cluster.run_ranks(*command, env=env)
    if outputs[0] is None:
        return None
    return json.loads(outputs[0].strip().splitlines()[-1])


# ------------------------------------------------------------------ learning curve
def learn(args) -> None:
    from distributed import Client

    from dasknn.data_parallel import DistributedEmbeddingMLP
    from dasknn.datasets import load_stdlib_corpus
    from dasknn.model import EmbeddingMLP
    from dasknn.optim import Adam
    from dasknn.runtime.cluster import local_cluster

    corpus = load_stdlib_corpus("prose", context=3, max_vocab=4096)
    (X, y), (X_held, y_held) = corpus.split(every=10)
    rng = np.random.default_rng(0)
    train = rng.permutation(len(y))[: args.learn_windows]
    X, y = X[train], y[train]
    counts = np.bincount(y, minlength=len(corpus.vocabulary)) + 1.0
    unigram = float(np.exp(-np.mean(np.log(counts[y_held] / counts.sum()))))
    print(
        f"corpus: {corpus.n_tokens} words, vocabulary {len(corpus.vocabulary)}, "
        f"{len(y)} training windows, {len(y_held)} held out; unigram perplexity {unigram:.1f}"
    )
    model = EmbeddingMLP(len(corpus.vocabulary), 3, 64, hidden=(128,), seed=0)
    one = model.copy()
    optimizer = Adam(lr=2e-3)
    with local_cluster(2) as cluster, Client(cluster) as client:
        with DistributedEmbeddingMLP(
            model, client, architecture="hybrid", sparse_partitions=4
        ) as dp:
            print("epoch  one-process  hybrid (2 workers)  unigram   (held-out perplexity)")
            for epoch in range(args.learn_epochs):
                one.partial_fit(X, y, batch_size=256, seed=epoch, optimizer=optimizer)
                dp.partial_fit(X, y, batch_size=256, seed=epoch, optimizer=optimizer)
                a, b = one.perplexity(X_held, y_held), dp.perplexity(X_held, y_held)
                print(
                    f"{epoch + 1:5d}  {a:11.2f}  {b:18.2f}  {unigram:8.1f}   (ratio {b / a:.4f})",
                    flush=True,
                )


# ------------------------------------------------------------------ main
def _median_ms(func, repeats: int) -> float:
    func()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def compute_child(windows: int, repeats: int) -> dict:
    """Time both passes in this process (run with one thread by :func:`compute`)."""
    from dasknn.model import embedding_network as net

    setup = {**zipf_setup(1), "sampled": False}
    model = make_model(setup)
    X, y = setup["batches"][0]
    ids, labels = X[:windows].astype(np.int64), y[:windows].astype(np.int64)
    unique, inverse = net.unique_rows(ids)
    rows = model.embedding[unique]
    dense = model.dense_variables()
    weights, biases = dense[0::2], dense[1::2]
    total = sum(a.size for a in dense)
    denominator = len(setup["batches"][0][1])
    workspace = net.Workspace()

    def ours():
        out = np.empty(total, dtype=np.float32)
        net.batch_gradients(
            model.spec, rows, inverse, labels, weights, biases, denominator, workspace, out
        )

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    emb = torch.nn.EmbeddingBag(setup["vocab"], setup["dim"], mode="mean", sparse=True)
    hidden = torch.nn.Linear(setup["dim"], setup["hidden"])
    output = torch.nn.Linear(setup["hidden"], setup["classes"])
    params = [*emb.parameters(), *hidden.parameters(), *output.parameters()]
    x, t = torch.from_numpy(ids), torch.from_numpy(labels)

    def theirs():
        for p in params:
            p.grad = None
        loss = torch.nn.functional.cross_entropy(output(torch.relu(hidden(emb(x)))), t)
        loss.backward()

    return {
        "dasknn": _median_ms(ours, repeats),
        "torch": _median_ms(theirs, repeats),
    }


def run_compute_child(args, extra_env: dict) -> dict:
    env = {**os.environ, **dict.fromkeys(ONE_THREAD, "1"), **extra_env}
    env["PYTHONPATH"] = str(ROOT)
    command = [
        sys.executable,
        __file__,
        "--compute-child",
        "--compute-windows",
        str(args.compute_windows),
        "--compute-repeats",
        str(args.compute_repeats),
    ]
    out = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def compute(args) -> None:
    """One worker's compute against PyTorch's, one process and one thread each (``--compute``)."""
    import dask
    import distributed  # noqa: F401 - its configuration defaults

    nanny = {k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()}
    print(
        f"{describe()}; one worker's share: {args.compute_windows} windows; "
        f"median of {args.compute_repeats}"
    )
    print("| environment | dasknn | PyTorch | dasknn / PyTorch |")
    print("| --- | --- | --- | --- |")
    results = []
    for label, env in (("plain", {}), ("Dask worker's", nanny)):
        got = run_compute_child(args, env)
        ratio = got["dasknn"] / got["torch"]
        print(f"| {label} | {got['dasknn']:.2f} ms | {got['torch']:.2f} ms | {ratio:.2f}x |")
        results.append({"environment": label, **got})
    print(f"(Dask worker's environment: {nanny})")
    write_json(args.json, "dataparallel.py --compute", results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--models", nargs="+", default=["zipf", "corpus"], choices=["zipf", "corpus"]
    )
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--shards", type=int, default=None)
    parser.add_argument("--output", default="softmax", choices=["softmax", "sampled"])
    parser.add_argument("--n-sampled", type=int, default=256)
    parser.add_argument("--no-ddp", action="store_true")
    parser.add_argument(
        "--ddp-kinds", nargs="+", default=["sparse", "dense"], choices=["sparse", "dense"]
    )
    parser.add_argument("--search", action="store_true")
    parser.add_argument("--search-steps", type=int, default=4)
    parser.add_argument("--search-repeats", type=int, default=1)
    parser.add_argument(
        "--architectures", nargs="+", default=list(ARCHITECTURES), choices=ARCHITECTURES
    )
    parser.add_argument("--messages", nargs="+", default=["tasks"], choices=["tasks", "posted"])
    parser.add_argument(
        "--steps-per-task",
        type=lambda text: None if text == "auto" else int(text),
        nargs="+",
        default=None,
        help="steps_per_task of the posted runs, one run each (auto: the model's default)",
    )
    parser.add_argument(
        "--reuse-memory",
        nargs="?",
        const="also",
        choices=["also", "only"],
        help="also: every dasknn variant again with reuse_memory=True after the untuned ones; "
        "only: the tuned variants alone (workers tuned from their first step)",
    )
    parser.add_argument("--learn", action="store_true")
    parser.add_argument("--learn-windows", type=int, default=60000)
    parser.add_argument("--learn-epochs", type=int, default=5)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--ddp-model")
    parser.add_argument("--ddp-sparse", action="store_true")
    parser.add_argument(
        "--compute",
        action="store_true",
        help="time one worker's compute against PyTorch's instead (no root)",
    )
    parser.add_argument(
        "--compute-windows",
        type=int,
        default=256,
        help="with --compute: the worker's share of the batch",
    )
    parser.add_argument(
        "--compute-repeats", type=int, default=100, help="with --compute: passes timed (median)"
    )
    parser.add_argument("--compute-child", action="store_true", help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args()
    if args.compute_child:
        print(json.dumps(compute_child(args.compute_windows, args.compute_repeats)))
        return
    if args.compute:
        compute(args)
        return
    if args.rank is not None:  # one DDP rank, started by NetCluster.run_ranks
        args.model, args.sparse = args.ddp_model, args.ddp_sparse
        ddp_worker(args)
        return
    print(f"machine: {describe()}", flush=True)
    if args.learn:
        learn(args)
        return
    reason = unavailable_reason()
    if reason is not None:
        sys.exit(f"dataparallel benchmark: {reason}")
    try:
        import torch  # noqa: F401

        have_torch = not args.no_ddp
    except ImportError:
        have_torch = False
    from distributed import Client

    # (messages, steps_per_task, reuse_memory, label suffix) of every dasknn run, the tuned
    # ones last
    variants = []
    for messages in args.messages:
        if messages == "tasks":
            variants.append((messages, None, False, ""))
        elif args.steps_per_task is None:
            variants.append((messages, None, False, "/posted"))
        else:
            variants += [
                (messages, k, False, f"/posted/k{'auto' if k is None else k}")
                for k in args.steps_per_task
            ]
    if args.reuse_memory:
        tuned = [(m, k, True, f"{suffix}+reuse") for m, k, _, suffix in variants]
        variants = tuned if args.reuse_memory == "only" else variants + tuned
    for name in args.models:
        setup = zipf_setup(args.steps) if name == "zipf" else corpus_setup(args.steps)
        setup = with_output(setup, args)
        batch = len(setup["batches"][0][1])
        print(
            f"\nmodel {name}: V = {setup['vocab']}, d = {setup['dim']}, context "
            f"{setup['context']} ({setup['combine']}), hidden {setup['hidden']}, "
            f"{setup['classes']} classes ("
            f"{f'sampled softmax, {args.n_sampled} candidates' if setup['sampled'] else 'softmax'}"
            "), global batch "
            f"{batch}; {args.rate} links, dasknn: mean of {args.steps - args.warmup} steps "
            f"after {args.warmup}, DDP: median",
            flush=True,
        )
        for n in args.workers:
            env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))}
            rows = {}
            with NetCluster(workers=n, rate=args.rate, env=env) as cluster:
                with Client(cluster.address) as client:
                    for reuse, arch in [(r, a) for r in (False, True) for a in args.architectures]:
                        for messages, per_task, _, suffix in (v for v in variants if v[2] == reuse):
                            label = f"{arch}{suffix}"
                            rows[label] = run_dasknn(
                                client,
                                setup,
                                arch,
                                args.shards or n,
                                args.warmup,
                                messages,
                                per_task,
                                reuse,
                            )
                            r = rows[label]
                            print(
                                f"  N={n} {label:22s} {r['seconds'] * 1e3:9.1f} ms/step "
                                f"{batch / r['seconds']:9.0f} windows/s "
                                f"{r['bytes_per_step'] / 1e6:9.2f} MB/step between workers "
                                f"(measured = predicted: {r['exact']}, alpha {r['alpha']:.4f})",
                                flush=True,
                            )
                    if args.search and n == max(args.workers):
                        run_search(
                            client, setup, args.search_steps, args.search_repeats, args.messages[-1]
                        )
                if have_torch:
                    for sparse in [kind == "sparse" for kind in args.ddp_kinds]:
                        label = "DDP-sparse" if sparse else "DDP-dense"
                        r = run_ddp(
                            cluster,
                            name,
                            sparse,
                            args.steps,
                            args.warmup,
                            args.output,
                            args.n_sampled,
                        )
                        if r is not None:
                            rows[label] = r
                            print(
                                f"  N={n} {label:9s} {r['seconds'] * 1e3:9.1f} ms/step "
                                f"{batch / r['seconds']:9.0f} windows/s",
                                flush=True,
                            )
            for *_, suffix in variants:
                if f"hybrid{suffix}" not in rows:
                    continue
                hyb = rows[f"hybrid{suffix}"]["seconds"]
                ratios = []
                if {"ar-dense", "ps", "ar"} <= {a.removesuffix(suffix) for a in rows}:
                    best_other = min(rows[f"ps{suffix}"]["seconds"], rows[f"ar{suffix}"]["seconds"])
                    ratios += [
                        f"{rows[f'ar-dense{suffix}']['seconds'] / hyb:.2f}x ar-dense{suffix}",
                        f"{best_other / hyb:.2f}x best of ps/ar{suffix}",
                    ]
                if suffix and "hybrid" in rows:
                    ratios.append(f"{rows['hybrid']['seconds'] / hyb:.2f}x hybrid (tasks)")
                first_suffix = variants[0][3]
                if suffix != first_suffix and f"hybrid{first_suffix}" in rows:
                    first = rows[f"hybrid{first_suffix}"]["seconds"]
                    ratios.append(f"{first / hyb:.2f}x hybrid{first_suffix}")
                for label in ("DDP-sparse", "DDP-dense"):
                    if label in rows:
                        ratios.append(f"{rows[label]['seconds'] / hyb:.2f}x {label}")
                if ratios:
                    print(f"  N={n} hybrid{suffix} speed-up: {', '.join(ratios)}", flush=True)
            write_json(
                args.json,
                "dataparallel.py",
                {
                    "model": name,
                    "workers": n,
                    "rate": args.rate,
                    "ms_per_step": {label: r["seconds"] * 1e3 for label, r in rows.items()},
                },
            )


if __name__ == "__main__":
    main()
