"""Model-parallel training benchmark: hypergraph vs random partition, vs PyTorch CPU sparse.

One run, one machine, baselines beside the figures:

1. the same network trained in one process by PyTorch's CPU sparse tensors (``torch.sparse.mm`` on
   a COO weight built from a dense value vector each step, so the weight gradient is masked to the
   pattern; ``torch.optim.SGD``), and by dasknn's single-process ``SparseMLP``;
2. dasknn model-parallel with the hypergraph (H) and the random (R) partition at each P (one
   single-threaded worker per part), with each way of running a step (``--messages``: ``tasks``,
   a task per layer step and message; ``posted``, a task per worker and step, messages posted
   between workers): time per batch, the breakdown (local products / update / packing /
   communication+scheduling wait, the paper's Figure 5), the wait's share of the batch, measured
   bytes against the prediction, H/R ratios, the ratios to one process and to PyTorch;
3. the overhead per layer step of each way, measured on a 32-neuron network of the same depth
   and partition count, where the arithmetic is negligible.

``--kernels`` runs the training kernels alone instead (no Dask): for each RadiX-Net layer size,
batch size and dtype the best-of-N wall time of ``spmm_forward`` (``x @ W``), ``spmm_backward``
(``delta @ W.T``) and ``masked_outer_grad`` (``x.T @ delta`` on the pattern), on the
feature-major arrays the training paths keep, beside the scipy.sparse way to get the same result
from row blocks and the same products written as scatters (``out[j] += w * x[i]`` per entry, on
the same arrays), and a whole ``SparseMLP.train_step`` (sigmoid + MSE, 4 layers) beside the same
step written with scipy.sparse and numpy; the ratio is scipy / dasknn (> 1: dasknn faster). The
kernels are single-threaded, scipy's sparse products too.

Usage::

    python benchmarks/train.py [--layers 30] [--batches 3]
    python benchmarks/train.py --net 1gbit   # shaped links (root)
    python benchmarks/train.py --kernels     # the kernels alone
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import numpy as np
from distributed import Client, LocalCluster, get_task_stream
from harness import NetCluster, add_json_option, describe, write_json
from numba import njit

import graph
from dasknn.datasets import radixnet
from dasknn.kernels.training import column_runs, masked_outer_grad, spmm_backward, spmm_forward
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel._timing import time_training


@contextmanager
def _cluster(
    workers: int, net: str | None = None, delay_us: float | None = None
) -> Iterator[Client]:
    """A client of a LocalCluster, or with ``net`` of a :class:`NetCluster` whose links run at
    that rate; the client and the cluster are closed on exit."""
    threads = max(1, (os.cpu_count() or 1) // workers)
    env = {"NUMBA_NUM_THREADS": str(threads)}
    if net is not None:
        cluster = NetCluster(workers=workers, rate=net, delay_us=delay_us, env=env).start()
        client = Client(cluster.address)
    else:
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            env=env,
        )
        client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def torch_time_per_batch(model: SparseMLP, x: np.ndarray, y: np.ndarray, batch: int, lr: float):
    """PyTorch CPU sparse, written as a user would: COO weights from trainable value vectors."""
    import torch

    values, indices, shapes = [], [], []
    for weight in model.weights:
        transposed = weight.T.tocoo()  # (n_out, n_in): torch.sparse.mm(W^T, a^T)
        indices.append(torch.tensor(np.vstack([transposed.row, transposed.col]), dtype=torch.int64))
        values.append(torch.tensor(transposed.data, requires_grad=True))
        shapes.append(transposed.shape)
    biases = [torch.tensor(b, requires_grad=True) for b in model.biases]
    optimizer = torch.optim.SGD(values + biases, lr=lr)
    inputs, targets = torch.tensor(x), torch.tensor(y)

    def step(rows):
        optimizer.zero_grad()
        a = inputs[rows]
        for v, idx, shape, b in zip(values, indices, shapes, biases, strict=True):
            w = torch.sparse_coo_tensor(idx, v, shape, check_invariants=False)
            a = torch.sigmoid(torch.sparse.mm(w, a.T).T + b)
        loss = ((a - targets[rows]) ** 2).sum() / (2 * a.shape[0])
        loss.backward()
        optimizer.step()
        return loss.item()

    step(slice(0, batch))  # warm-up
    batches = x.shape[0] // batch
    start = time.perf_counter()
    for i in range(batches):
        step(slice(i * batch, (i + 1) * batch))
    return (time.perf_counter() - start) / batches, torch.get_num_threads()


def numba_time_per_batch(model: SparseMLP, x, y, batch: int, lr: float) -> float:
    """dasknn's single-process SparseMLP (same kernels, numba threads over the machine)."""
    model = model.copy()
    model.train_step(x[:batch], y[:batch], lr=lr)
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, lr=lr, shuffle=False, progress=False)
    return (time.perf_counter() - start) / (x.shape[0] // batch)


def posted_overhead(layers: int, nparts: int, workers: int, steps: int = 8) -> float:
    """Time per layer step of ``fit`` with ``messages="posted"`` on a 32-neuron network (batch
    1) with the same depth and P."""
    model = SparseMLP.radixnet(32, layers, seed=0)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(size=(steps, 32)), rng.uniform(size=(steps, 32))
    partition = graph.partition_network(model.weights, nparts, "block")
    with (
        _cluster(workers) as client,
        DistributedSparseMLP(model, client, partition=partition, messages="posted") as dist,
    ):
        times = time_training(dist, x, y, batch_size=1, lr=0.01)
    return times.per_batch / (2 * layers)


def scheduling_overhead(layers: int, nparts: int, workers: int, steps: int = 8) -> dict:
    """Time per layer step of a 32-neuron network (batch 1) with the same depth and P.

    Measured three ways: ``fit`` (data scattered once, next step submitted before the current one
    ends), a ``train_step`` loop (one scatter, submit and gather per step), and ``fit`` with a
    separate pack task per message (two scheduler round trips per layer instead of one).
    """
    model = SparseMLP.radixnet(32, layers, seed=0)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(steps, 32))
    y = rng.uniform(size=(steps, 32))
    partition = graph.partition_network(model.weights, nparts, "block")
    with _cluster(workers) as client:
        separate = DistributedSparseMLP(
            model, client, partition=partition, separate_packing=True
        )
        separate_times = time_training(separate, x, y, batch_size=1, lr=0.01)
        separate.close()
        dist = DistributedSparseMLP(model, client, partition=partition)
        times = time_training(dist, x, y, batch_size=1, lr=0.01)
        with get_task_stream(client) as stream:
            start = time.perf_counter()
            for i in range(steps):
                dist.train_step(x[i : i + 1], y[i : i + 1], lr=0.01)
            unpipelined = (time.perf_counter() - start) / steps
        dist.close()
    layer_steps = 2 * layers
    runs = [ss for record in stream.data for ss in record["startstops"]]
    compute = [ss["stop"] - ss["start"] for ss in runs if ss["action"] == "compute"]
    transfer = [ss["stop"] - ss["start"] for ss in runs if ss["action"] == "transfer"]
    return {
        "task_compute": float(np.mean(compute)),
        "transfer": float(np.mean(transfer)) if transfer else 0.0,
        "per_layer_step_fit": times.per_batch / layer_steps,
        "per_layer_step_train_step": unpipelined / layer_steps,
        "per_layer_step_separate": separate_times.per_batch / layer_steps,
        "busy_per_batch": times.products + times.update + times.pack,
    }



def best_time(func, repeats: int) -> float:
    func()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - start)
    return best


def scipy_forward(x, w):
    return x @ w


# The same three products as scatters on the same feature-major arrays, the loops numba
# vectorises by itself (the baseline of the register accumulators).
@njit(cache=True, nogil=True)
def scatter_forward(xt, indptr, indices, data, outt):
    outt[:] = 0
    for i in range(xt.shape[0]):
        for p in range(indptr[i], indptr[i + 1]):
            w, j = data[p], indices[p]
            for t in range(xt.shape[1]):
                outt[j, t] += w * xt[i, t]


@njit(cache=True, nogil=True)
def scatter_backward(deltat, indptr, indices, data, outt):
    for i in range(outt.shape[0]):
        outt[i] = 0
        for p in range(indptr[i], indptr[i + 1]):
            w, j = data[p], indices[p]
            for t in range(deltat.shape[1]):
                outt[i, t] += w * deltat[j, t]


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def scatter_grad(xt, deltat, indptr, indices, out):
    for i in range(xt.shape[0]):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            acc = xt[i, 0] * deltat[j, 0]
            for t in range(1, xt.shape[1]):
                acc += xt[i, t] * deltat[j, t]
            out[p] = acc


def scipy_backward(delta, w):
    return delta @ w.T


def scipy_grad(x, delta, rows, cols):
    return (x.T @ delta)[rows, cols]


def scipy_step(weights, biases, x, y, lr):
    """One SGD step of the sigmoid + MSE network with scipy.sparse products (reference baseline)."""
    acts = [x]
    for w, b in zip(weights, biases, strict=True):
        acts.append(1.0 / (1.0 + np.exp(-(np.asarray(acts[-1] @ w) + b))))
    delta = (acts[-1] - y) * acts[-1] * (1 - acts[-1]) / x.shape[0]
    for k in range(len(weights) - 1, -1, -1):
        w = weights[k]
        rows = np.repeat(np.arange(w.shape[0]), np.diff(w.indptr))
        grad = (acts[k].T @ delta)[rows, w.indices]
        grad_b = delta.sum(0)
        if k > 0:
            delta = np.asarray(delta @ w.T) * acts[k] * (1 - acts[k])
        w.data -= lr * grad
        biases[k] -= lr * grad_b


def kernels(args) -> None:
    """The training kernels and a whole ``train_step`` against scipy.sparse (``--kernels``)."""
    print(f"machine: {describe()}, python "
          f"{platform.python_version()}; times are best-of-N wall seconds")
    results = []
    print(f"{'n':>5} {'B':>4} {'dtype':>7} {'op':<10} {'dasknn ms':>10} {'scipy ms':>9} "
          f"{'ratio':>6} {'scatter ms':>10} {'ratio':>6}")
    for n in (1024, 4096):
        for dtype in (np.float32, np.float64):
            w = radixnet(n, 1, dtype=dtype)[0]
            rows = np.repeat(np.arange(n), np.diff(w.indptr))
            for batch in (1, 32, 256):
                rng = np.random.default_rng(0)
                x = rng.random((batch, n)).astype(dtype)
                delta = rng.standard_normal((batch, n)).astype(dtype)
                xt, deltat = np.ascontiguousarray(x.T), np.ascontiguousarray(delta.T)
                out = np.empty((n, batch), dtype=dtype)
                grad = np.empty(w.nnz, dtype=dtype)
                repeats = max(5, int(2e7 / (batch * w.nnz)))
                csr = (w.indptr, w.indices, w.data)
                bounds, by_column, order = column_runs(w.indptr, w.indices, n,
                                                       np.array([0, n]))
                columns = (bounds[0], bounds[-1], by_column, order, w.data)
                cases = [
                    ("forward", partial(spmm_forward, xt, *columns, out),
                     partial(scipy_forward, x, w), partial(scatter_forward, xt, *csr, out)),
                    ("backward", partial(spmm_backward, deltat, *csr, out),
                     partial(scipy_backward, delta, w),
                     partial(scatter_backward, deltat, *csr, out)),
                    ("grad", partial(masked_outer_grad, xt, deltat, *csr[:2], 1.0, grad),
                     partial(scipy_grad, x, delta, rows, w.indices),
                     partial(scatter_grad, xt, deltat, *csr[:2], grad)),
                ]
                for name, ours, theirs, scatter in cases:
                    t_ours, t_theirs = best_time(ours, repeats), best_time(theirs, repeats)
                    t_scatter = best_time(scatter, repeats)
                    results.append({"n": n, "batch": batch, "dtype": np.dtype(dtype).name,
                                    "op": name, "dasknn_s": t_ours, "scipy_s": t_theirs,
                                    "scatter_s": t_scatter})
                    print(f"{n:>5} {batch:>4} {np.dtype(dtype).name:>7} {name:<10} "
                          f"{t_ours * 1e3:>10.3f} {t_theirs * 1e3:>9.3f} {t_theirs / t_ours:>6.2f}"
                          f" {t_scatter * 1e3:>10.3f} {t_scatter / t_ours:>6.2f}", flush=True)
    for n, batch in ((1024, 64), (4096, 256)):
        model = SparseMLP.radixnet(n, 4, seed=0, activation="sigmoid", loss="mse", scale=0.1)
        weights = [w.copy() for w in model.weights]
        biases = [b.copy() for b in model.biases]
        rng = np.random.default_rng(1)
        x, y = rng.random((batch, n)), rng.random((batch, n))
        t_ours = best_time(partial(model.train_step, x, y, lr=0.01), 5)
        t_theirs = best_time(partial(scipy_step, weights, biases, x, y, 0.01), 5)
        print(f"train_step 4 x {n}, B={batch}, float64: dasknn {t_ours * 1e3:.1f} ms, scipy "
              f"{t_theirs * 1e3:.1f} ms, ratio {t_theirs / t_ours:.2f} "
              f"({batch / t_ours:,.0f} vs {batch / t_theirs:,.0f} samples/s)")
        results.append({"n": n, "batch": batch, "dtype": "float64", "op": "train_step",
                        "dasknn_s": t_ours, "scipy_s": t_theirs})
    write_json(args.json, "train.py --kernels", results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--neurons", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=3, help="timed batches per configuration")
    parser.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--workers", type=int, default=0, help="worker processes (0: one per part)"
    )
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true",
                        help="do not measure the overhead per layer step (32-neuron network)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="value type of every implementation (PyTorch follows the data)")
    parser.add_argument(
        "--net", help="run every cluster in network namespaces joined by links shaped to this "
        "rate (tc notation: 1gbit, 10gbit; root only), see benchmarks/harness.py",
    )
    parser.add_argument("--delay-us", type=float, help="with --net: one-way delay per link end")
    parser.add_argument(
        "--messages", nargs="+", choices=("tasks", "posted"), default=["tasks", "posted"],
        help="how the distributed steps run (DistributedSparseMLP's messages=)",
    )
    parser.add_argument(
        "--microbatches", type=int, help="microbatches per step (default: the automatic choice)"
    )
    parser.add_argument("--no-reuse-memory", action="store_true",
                        help="reuse_memory=False instead of the model's default (True)")
    parser.add_argument("--kernels", action="store_true",
                        help="time the training kernels against scipy.sparse instead")
    add_json_option(parser)
    args = parser.parse_args()
    if args.kernels:
        kernels(args)
        return

    print(f"machine: {describe()}")
    if args.net:
        print(f"links: scheduler and every worker in its own network namespace, {args.net} "
              f"per link end" + (f", {args.delay_us} us delay" if args.delay_us else ""))
    model = SparseMLP.radixnet(
        args.neurons, args.layers, seed=0, activation="sigmoid", loss="mse", dtype=args.dtype
    )
    rng = np.random.default_rng(1)
    samples = args.batch * args.batches
    x = rng.uniform(0, 1, size=(samples, args.neurons)).astype(args.dtype)
    y = rng.uniform(0, 1, size=(samples, args.neurons)).astype(args.dtype)
    print(f"network: RadiX-Net {args.neurons} x {args.layers} layers, {model.weights[0].nnz} nnz "
          f"per layer, batch {args.batch}, sigmoid + MSE, lr {args.lr}, {args.batches} timed "
          f"batches per configuration (+1 warm-up)")

    numba_single = numba_time_per_batch(model, x, y, args.batch, args.lr)
    print(f"dasknn SparseMLP, one process: {numba_single * 1e3:.0f} ms/batch "
          f"({args.batch / numba_single:,.0f} samples/s)")
    torch_batch = None
    if not args.skip_torch:
        torch_batch, torch_threads = torch_time_per_batch(model, x, y, args.batch, args.lr)
        print(f"PyTorch CPU sparse (COO), one process, {torch_threads} threads: "
              f"{torch_batch * 1e3:.0f} ms/batch ({args.batch / torch_batch:,.0f} samples/s)")

    results = {}
    for nparts in args.parts:
        workers = args.workers or nparts
        print(f"P={nparts} on {workers} single-threaded worker processes")
        with _cluster(workers, args.net, args.delay_us) as client:
            for method in ("hypergraph", "random"):
                partition = graph.partition_network(model.weights, nparts, method, seed=0)
                for messages in args.messages:
                    dist = DistributedSparseMLP(
                        model, client, partition=partition, messages=messages,
                        reuse_memory=not args.no_reuse_memory, microbatches=args.microbatches,
                    )
                    m = dist.step_microbatches(args.batch)
                    times = time_training(dist, x, y, args.batch, lr=args.lr)
                    dist.close()
                    results[(nparts, method, messages)] = times
                    comm = times.comm
                    print(f"P={nparts} {method:<10} {messages:<6} m={m} {times.format()}")
                    line = (f"    wait {times.wait / times.per_batch:.0%} of the batch; "
                            f"{numba_single / times.per_batch:.2f}x the one-process throughput")
                    if torch_batch is not None:
                        line += f", {torch_batch / times.per_batch:.2f}x PyTorch's"
                    print(line)
                    mb = comm.total() / times.batches / 1e6
                    overhead = "n/a (posted messages are not in the transfer logs)"
                    wire = comm.details
                    if wire["wire_messages"]:
                        overhead = (f"{wire['serialization_overhead'] / wire['wire_messages']:.0f}"
                                    f" B/message over {wire['wire_messages']} logged messages")
                    print(f"    measured payload {mb:.2f} MB/batch, "
                          f"predicted {comm.total('predicted') / times.batches / 1e6:.2f} MB/batch "
                          f"({'equal' if comm.exact else 'DIFFERENT'}); serialization overhead "
                          f"{overhead}")
        for messages in args.messages:
            h = results[(nparts, "hypergraph", messages)]
            r = results[(nparts, "random", messages)]
            print(f"P={nparts} {messages}: H vs R speedup {r.per_batch / h.per_batch:.2f}x (target "
                  f">= 1.5x); measured bytes ratio H/R {h.comm.total() / r.comm.total():.3f}, "
                  f"predicted {h.comm.total('predicted') / r.comm.total('predicted'):.3f}")

    write_json(args.json, "train.py", {
        "one_process_ms": numba_single * 1e3,
        "pytorch_ms": None if torch_batch is None else torch_batch * 1e3,
        "distributed": [
            {"parts": p, "method": method, "messages": messages,
             "ms_per_batch": t.per_batch * 1e3, "wait_share": t.wait / t.per_batch,
             "payload_bytes": t.comm.total() / t.batches,
             "predicted_bytes": t.comm.total("predicted") / t.batches}
            for (p, method, messages), t in results.items()
        ],
    })

    for nparts in [] if args.skip_overhead else args.parts:
        if "posted" in args.messages:
            per_step = posted_overhead(args.layers, nparts, args.workers or nparts)
            print(f"overhead per layer step, messages=posted, 32 neurons x {args.layers} layers, "
                  f"batch 1, P={nparts} on {args.workers or nparts} workers: fit "
                  f"{per_step * 1e3:.2f} ms")
        if "tasks" not in args.messages:
            continue
        overhead = scheduling_overhead(args.layers, nparts, args.workers or nparts)
        print(f"scheduling overhead, 32 neurons x {args.layers} layers, batch 1, P={nparts} "
              f"on {args.workers or nparts} workers, per layer step: "
              f"fit {overhead['per_layer_step_fit'] * 1e3:.2f} ms "
              f"(arithmetic {overhead['busy_per_batch'] * 1e3 / (2 * args.layers):.2f} ms); "
              f"train_step loop {overhead['per_layer_step_train_step'] * 1e3:.2f} ms; "
              f"fit with separate pack tasks {overhead['per_layer_step_separate'] * 1e3:.2f} ms; "
              f"a task's own run {overhead['task_compute'] * 1e3:.2f} ms and a transfer "
              f"{overhead['transfer'] * 1e3:.2f} ms on average")


if __name__ == "__main__":
    main()
