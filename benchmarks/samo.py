"""SAMO (compressed model states of pruned networks) against its baselines, in the same run.

Run: ``python3 benchmarks/samo.py [section ...]`` with sections
``memory``, ``accuracy``, ``speed``, ``bubble``, ``received``, ``workers``, ``links`` (default:
all);
``--bubble-m``, ``--bubble-steps`` and ``--bubble-rows`` shrink the bubble section (default m 2 4
8, 3 steps, 2,048 rows a microbatch), ``--bubble-messages`` picks the pipeline's modes (default
``tasks``, ``posted``, ``posted-pinned``, ``posted-fresh``, in the same run: a mode without a
suffix is ``DistributedCompressedMLP``'s defaults, ``-fresh`` is ``reuse_memory=False``,
``-pinned`` ``pin_cores=True``), ``--bubble-clusters``
the clusters that run them (default ``dask``: Dask's defaults; ``dasknn``: dasknn's own
``local_cluster``, the worker profiler off). Everything runs
single-threaded (BLAS, numba, torch), one thread per Dask worker, so the figures compare
algorithms, not thread counts. Prints markdown tables with their targets:

- **memory** at p = 0.9 on 784-1024-1024-1024-10 (2.9 M weights): ``memory_report()`` checked
  against tracemalloc, SAMO fp32 against dense float32 Adam (16 phi) and PyTorch's pruning
  utilities (measured tensors, 24 phi), SAMO bf16 against the mixed-precision default (20 phi);
- **accuracy**: LeNet-300-100 on MNIST (8,000 train, 2,000 held out), dense Adam with Early-Bird
  at p = 0.9, the ticket retrained on compressed states in fp32 and bf16;
- **speed**: a training step (batch 64) of SAMO against the same step without compression
  (dense with mask) and against PyTorch's pruned (masked) model;
- **bubble**: GPipe with S = 2, m in {2, 4, 8} on 64-1024-1024-1024-1024-1024 (stages balanced
  by estimated cost): each stage's idle fraction against ``(S - 1) / (m + S - 1)``, split into
  the bubble (the busiest stage's idle fraction) and each stage's imbalance, with the handover
  time (``DistributedCompressedMLP.idle_breakdown``), for messages as task results and posted
  worker to worker, with and without the stage workers pinned to cores; each cell's busy time
  split into CPU, waiting for a core and slow passes, the spread of each stage's passes (wall,
  CPU, involuntary context switches, migrations), the cyclic collections inside passes, the workers'
  other threads' CPU and the other processes' CPU on the machine; before it, each stage's passes
  timed in this process, on its worker alone and on both workers at once (wall and CPU time,
  page faults), and the workers' thread settings;
- **received**: stage 0's backward pass of the bubble network on one worker, on a delta fetched
  from the other worker against a copy of it and one made locally, and on a cold stash (the first
  of ``m`` microbatches) against a warm one;
- **workers**: at a per-worker memory limit where the dense model with a mask needs S = 2, the
  planner's choice for SAMO, with bytes and time per step of both;
- **links** (root; ``--links-replicas``, ``--links-rate``, ``--links-rows``, ``--links-steps``):
  compressed-gradient data parallelism (S = 1, D replicas) against dense-gradient data
  parallelism of the same network (every weight kept, dense compute) and PyTorch DDP (gloo) of
  the masked model, each worker in a network namespace of ``harness.NetCluster``: bytes a step
  (measured against the formula) and time a step.
"""

from __future__ import annotations

import os

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
for _var in _THREAD_VARS:
    os.environ[_var] = "1"

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from harness import describe  # noqa: E402

from dasknn.compressed import CompressedStack  # noqa: E402
from dasknn.datasets import load_mnist_test  # noqa: E402
from dasknn.kernels.compressed import flat_forward, row_pointers  # noqa: E402
from dasknn.model import CompressedMLP, DenseMLP  # noqa: E402
from dasknn.model.dense_mlp import LENET_300_100, MLP_1024_3  # noqa: E402
from dasknn.optim import Adam  # noqa: E402
from dasknn.pipeline_parallel import (  # noqa: E402
    DistributedCompressedMLP,
    balanced_bounds,
    bubble_fraction,
    compressed_layer_bytes,
    dense_layer_bytes,
    layer_costs,
    plan_parallelism,
    split_stages,
)
from dasknn.pruning import EarlyBird, magnitude_masks  # noqa: E402
from dasknn.runtime.affinity import migrations  # noqa: E402
from dasknn.runtime.worker_memory import ReuseFreedMemory  # noqa: E402

P = 0.9
#: The bubble section's pipeline modes: messages, then ``-fresh`` (``reuse_memory=False``) and
#: ``-pinned`` (``pin_cores=True``); the other options are the model's defaults.
BUBBLE_MODES = ("tasks", "posted", "posted-pinned", "posted-fresh")


def best_ms(fn, repeat: int = 7) -> float:
    """Best-of-``repeat`` wall time of ``fn()`` in milliseconds (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def batch(n_inputs: int, rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 1, (rows, n_inputs)).astype(np.float32), rng.integers(0, 10, rows)


def torch_pruned(dense: DenseMLP, masks, ddp: bool = False):
    """The network in torch with ``prune.custom_from_mask`` on every layer and Adam; with
    ``ddp``, wrapped in ``DistributedDataParallel`` (a process group must be initialized)."""
    import torch
    from torch.nn.utils import prune

    torch.set_num_threads(1)
    layers = []
    for w, b, m in zip(dense.weights, dense.biases, masks, strict=True):
        lin = torch.nn.Linear(*w.shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.T.copy()))
            lin.bias.copy_(torch.from_numpy(b))
        prune.custom_from_mask(lin, "weight", torch.from_numpy(m.T.copy()))
        layers.append(lin)
    modules = [m for lin in layers[:-1] for m in (lin, torch.nn.ReLU())] + [layers[-1]]
    net = torch.nn.Sequential(*modules)
    if ddp:
        net = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step(x, y):
        opt.zero_grad()
        out = net(torch.from_numpy(x))
        torch.nn.functional.cross_entropy(out, torch.from_numpy(y)).backward()
        opt.step()

    def state_bytes():
        total = 0
        for lin in layers:
            tensors = [lin.weight_orig, lin.weight_mask, lin.weight, lin.weight_orig.grad]
            tensors += [lin.bias, lin.bias.grad]
            for p in (lin.weight_orig, lin.bias):
                tensors += [t for t in opt.state[p].values() if t.dim() > 0]
            total += sum(t.element_size() * t.nelement() for t in tensors)
        return total

    return step, state_bytes


# ---------------------------------------------------------------------------- memory
def traced_states(make, step) -> tuple[object, int]:
    """``(model, bytes)``: the bytes ``make()`` and one ``step(model)`` leave allocated."""
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    model = make()
    step(model)
    held = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    return model, held


def memory() -> None:
    dense = DenseMLP.init(MLP_1024_3, seed=0)
    masks = magnitude_masks(dense.weights, P)
    x, y = batch(784, 64)
    phi = sum(w.size for w in dense.weights)
    warm = dense.prune(masks)  # numba's first calls allocate code and caches: not model states
    warm.train_step(x, y, optimizer=Adam())
    print(f"\n### Memory at p = {P}, 784-1024-1024-1024-10 (phi = {phi:,}), Adam\n")
    print("| configuration | states (memory_report) | tracemalloc | bytes / phi |")
    print("| --- | ---: | ---: | ---: |")
    reports = {}
    for precision, compute in (
        ("fp32", "sparse"),
        ("fp32", "dense"),
        ("bf16", "sparse"),
        ("bf16", "dense"),
    ):
        model, traced = traced_states(
            lambda p=precision, c=compute: dense.prune(masks, precision=p, compute=c),
            lambda m: m.train_step(x, y, optimizer=Adam()),
        )
        report = model.memory_report()
        reports[(precision, compute)] = report
        print(
            f"| SAMO {precision}, compute={compute} | {report.states:,} | {traced:,} | "
            f"{report.states / phi:.2f} |"
        )
    plain, traced = traced_states(
        lambda: DenseMLP(dense.weights, dense.biases),
        lambda m: m.train_step(x, y, optimizer=Adam()),
    )
    print(
        f"| dense float32 Adam (held between steps: W, m, v) | {16 * phi:,} (16 phi) | "
        f"{traced:,} | {traced / phi:.2f} |"
    )
    step, state_bytes = torch_pruned(dense, masks)
    step(x, y)
    measured_torch = state_bytes()
    print(
        f"| PyTorch prune.custom_from_mask + Adam (tensors) | {24 * phi:,} (24 phi) | "
        f"{measured_torch:,} | {measured_torch / phi:.2f} |"
    )
    print(f"| mixed-precision default (formula) | {20 * phi:,} (20 phi) | | 20.00 |")
    print(
        f"| SAMO formula 2 phi + 24 f phi | {int(2 * phi + 24 * (1 - P) * phi):,} | | "
        f"{2 + 24 * (1 - P):.2f} |"
    )
    fp32, bf16 = reports[("fp32", "sparse")], reports[("bf16", "dense")]
    print("\n| target | saving | target met |")
    print("| --- | ---: | --- |")
    for name, ours, base, goal in (
        ("SAMO fp32 vs dense float32 Adam (16 phi)", fp32.states, 16 * phi, 0.64),
        ("SAMO fp32 vs PyTorch pruning (measured)", fp32.states, measured_torch, 0.76),
        ("SAMO bf16 (dense compute, as published) vs 20 phi", bf16.states, 20 * phi, 0.78),
    ):
        saving = 1 - ours / base
        print(
            f"| {name} >= {goal:.0%} below | {saving:.1%} | {'yes' if saving >= goal else 'NO'} |"
        )
    print("\n```\n" + bf16.format() + "\n```")


# ---------------------------------------------------------------------------- accuracy
def mnist():
    images, labels = load_mnist_test()
    x = images.reshape(len(images), -1).astype(np.float32) / 255.0
    return x[:8000], labels[:8000], x[8000:], labels[8000:]


def accuracy(epochs: int = 12) -> None:
    x_train, y_train, x_test, y_test = mnist()
    dense = DenseMLP.init(LENET_300_100, seed=0)
    bird = EarlyBird(P)
    ticket = found = None
    start = time.perf_counter()
    for epoch in range(epochs):
        dense.fit(
            x_train, y_train, batch_size=64, optimizer=Adam(lr=1e-3), seed=epoch, progress=False
        )
        if ticket is None and bird.update(dense.weights):
            ticket, found = [w.copy() for w in dense.weights], epoch + 1
            ticket_biases, ticket_masks = [b.copy() for b in dense.biases], bird.mask_
    dense_seconds = time.perf_counter() - start
    if ticket is None:  # no Early-Bird ticket within the epochs: prune the final model
        ticket, ticket_biases, ticket_masks = dense.weights, dense.biases, bird.mask_
    dense_acc = dense.score(x_test, y_test)
    print("\n### Accuracy: LeNet-300-100 (266,200 weights), MNIST 8,000 / 2,000, Adam 1e-3\n")
    print(
        f"Early-Bird (p = {P}, 5 masks, Hamming 0.1): "
        + (f"ticket found after epoch {found}" if found else f"not found in {epochs} epochs")
        + "; distances "
        + ", ".join(f"{d:.3f}" for d in bird.distances_ if d == d)
    )
    print("\n| model | held-out accuracy | training time |")
    print("| --- | ---: | ---: |")
    print(f"| dense, {epochs} epochs | {dense_acc:.4f} | {dense_seconds:.1f} s |")
    results = {}
    for precision in ("fp32", "bf16"):
        model = CompressedMLP(ticket, ticket_masks, ticket_biases, precision=precision)
        start = time.perf_counter()
        model.fit(
            x_train, y_train, batch_size=64, epochs=epochs, optimizer=Adam(lr=1e-3), progress=False
        )
        results[precision] = model.score(x_test, y_test)
        print(
            f"| Early-Bird ticket p = {P}, compressed Adam {precision}, {epochs} epochs | "
            f"{results[precision]:.4f} | {time.perf_counter() - start:.1f} s |"
        )
    gap = (dense_acc - results["fp32"]) * 100
    bf = abs(results["fp32"] - results["bf16"]) * 100
    print(
        f"\npruned fp32 {gap:+.2f} points below dense (target <= 1.0: "
        f"{'met' if gap <= 1.0 else 'MISSED'}); bf16 {bf:.2f} points from fp32 (target <= 0.5: "
        f"{'met' if bf <= 0.5 else 'MISSED'})"
    )


# ---------------------------------------------------------------------------- speed
def speed() -> None:
    dense = DenseMLP.init(MLP_1024_3, seed=0)
    masks = magnitude_masks(dense.weights, P)
    x, y = batch(784, 64)
    opt = Adam()
    masked = DenseMLP(dense.weights, dense.biases, masks=masks)
    rows = {
        "dense with mask (no compression, BLAS)": best_ms(
            lambda: masked.train_step(x, y, optimizer=opt)
        )
    }
    for precision in ("fp32", "bf16"):
        for compute in ("dense", "sparse"):
            model = dense.prune(masks, precision=precision, compute=compute)
            rows[f"SAMO {precision}, compute={compute}"] = best_ms(
                lambda m=model: m.train_step(x, y, optimizer=opt)
            )
    step, _ = torch_pruned(dense, masks)
    rows["PyTorch pruned (custom_from_mask), 1 thread"] = best_ms(lambda: step(x, y))
    print(f"\n### Speed: one training step, 784-1024-1024-1024-10, p = {P}, batch 64, Adam\n")
    print("| step | best of 7 (ms) |")
    print("| --- | ---: |")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.2f} |")
    base = rows["dense with mask (no compression, BLAS)"]
    ratio = rows["SAMO fp32, compute=dense"] / base
    torch_ratio = (
        rows["PyTorch pruned (custom_from_mask), 1 thread"] / rows["SAMO fp32, compute=sparse"]
    )
    print(
        f"\ncompression overhead: SAMO fp32 dense compute / dense with mask = {ratio:.2f} "
        f"(target <= 1.15: {'met' if ratio <= 1.15 else 'MISSED'}); PyTorch pruned / SAMO "
        f"sparse = {torch_ratio:.2f} (target > 1: {'met' if torch_ratio > 1 else 'MISSED'})"
    )
    # the forward product of one 1024 x 1024 layer at 10% density, batch 64
    rng = np.random.default_rng(1)
    w = rng.uniform(-1, 1, (1024, 1024)).astype(np.float32)
    mask = magnitude_masks([w], P)[0]
    index = np.flatnonzero(mask).astype(np.int32)
    values = w.reshape(-1)[index]
    ptr = np.empty(1025, dtype=np.int64)
    row_pointers(index, 1024, 1024, ptr)
    xt = rng.uniform(0, 1, (1024, 64)).astype(np.float32)
    out = np.empty((1024, 64), dtype=np.float32)
    wm = np.where(mask, w, 0).astype(np.float32)
    sparse_ms = best_ms(lambda: flat_forward(xt, ptr, index, 1024, values, out), 21)
    dense_ms = best_ms(lambda: wm.T @ xt, 21)
    print(
        f"\nforward of one 1024 x 1024 layer at 10% density, batch 64: compressed kernel "
        f"{sparse_ms:.3f} ms, dense BLAS {dense_ms:.3f} ms"
    )


# ---------------------------------------------------------------------------- clusters
def cluster(workers: int):
    """A LocalCluster with Dask's defaults (its worker profiler on) and its client."""
    from distributed import Client, LocalCluster

    c = LocalCluster(
        n_workers=workers, threads_per_worker=1, dashboard_address=":0", host="127.0.0.1"
    )
    return c, Client(c)


def dasknn_cluster(workers: int):
    """``dasknn.runtime.cluster.local_cluster`` (Dask's worker profiler off, short records) and
    its client."""
    from distributed import Client

    from dasknn.runtime.cluster import local_cluster

    c = local_cluster(workers)
    return c, Client(c)


#: The bubble section's clusters: Dask's defaults, dasknn's own.
CLUSTERS = {"dask": cluster, "dasknn": dasknn_cluster}


def _median(breakdowns, field: str) -> float:
    return statistics.median(getattr(b, field) for b in breakdowns)


def _worker_threads(dask_worker) -> dict:
    """For ``Client.run``: the thread settings a worker computes with, and its OS threads."""
    import numba

    with open("/proc/self/status") as status:
        threads = next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")
    names += ("MALLOC_TRIM_THRESHOLD_",)
    return {
        "env": {name: os.environ.get(name) for name in names},
        "numba threads": numba.get_num_threads(),
        "OS threads": threads,
        "Dask task threads": dask_worker.state.nthreads,
    }


def _time_passes(stack, xt, delta, first_stage: bool, repeat: int) -> dict[str, np.ndarray]:
    """Per kind (F, B): ``(wall s, thread CPU s, minor page faults)`` of ``repeat`` forward and
    backward passes of ``stack`` on the feature-major ``xt``, the backward from ``delta``."""
    import resource

    def clock():
        faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        return np.array([time.perf_counter(), time.thread_time(), faults], dtype=float)

    out = {"F": [], "B": []}
    for n in range(repeat + 1):
        start = clock()
        layers = stack.forward(xt, activate_last=not first_stage)
        middle = clock()
        stack.backward(xt, layers, delta, first=True, input_delta=not first_stage)
        end = clock()
        if n:  # the first is a warm-up
            out["F"].append(middle - start)
            out["B"].append(end - middle)
    return {kind: np.median(v, axis=0) for kind, v in out.items()}




def pass_anatomy(client, model, bounds, micro_rows: int, repeat: int = 5) -> None:
    """Each stage's forward and backward pass (its layers' products, as in the pipeline) timed
    in this process, on its worker alone, and on both workers at once: wall-clock and thread
    CPU time and minor page faults, medians of ``repeat``. Shows whether a pass is slower in the
    cluster because the worker runs it slower (CPU time up: the other worker's pass on the other
    core) or because its thread waits for a core (wall above CPU time)."""
    rng = np.random.default_rng(1)
    layers, activations = model.stack.layers, model.stack.activations
    stacks, inputs = [], []
    for a, b in bounds:
        stacks.append(
            CompressedStack(
                [(layers[k].master, layers[k].index, layers[k].shape) for k in range(a, b)],
                [layers[k].bias for k in range(a, b)],
                activations[a:b],
                model.precision,
                model.compute,
            )
        )
        n_in, n_out = layers[a].shape[0], layers[b - 1].shape[1]
        xt = rng.uniform(0, 1, (n_in, micro_rows)).astype(np.float32)
        inputs.append((xt, rng.standard_normal((n_out, micro_rows)).astype(np.float32)))
    addresses = sorted(client.scheduler_info()["workers"])

    def on_worker(s: int):
        return client.submit(
            _time_passes, stacks[s], *inputs[s], s == 0, repeat, workers=[addresses[s]],
            allow_other_workers=False, pure=False,
        )  # fmt: skip

    rows = {}
    for s, stack in enumerate(stacks):
        rows[("one process", s)] = _time_passes(stack, *inputs[s], s == 0, repeat)
    for s in range(len(stacks)):
        rows[("its worker, the other idle", s)] = on_worker(s).result()
    together = [on_worker(s) for s in range(len(stacks))]
    for s, future in enumerate(together):
        rows[("both workers at once", s)] = future.result()
    print("\n| where | stage | forward: wall / CPU ms, faults | backward: wall / CPU ms, faults |")
    print("| --- | ---: | ---: | ---: |")
    for (where, s), found in rows.items():
        cells = [
            f"{found[kind][0] * 1e3:.1f} / {found[kind][1] * 1e3:.1f}, {found[kind][2]:.0f}"
            for kind in "FB"
        ]
        print(f"| {where} | {s} | {cells[0]} | {cells[1]} |")


def _fresh_delta(n: int, rows: int, seed: int) -> np.ndarray:
    """Task: a float32 ``(n, rows)`` array, made on the worker that runs it."""
    return np.random.default_rng(seed).standard_normal((n, rows)).astype(np.float32)


def _backward_sources(stack, xt, received, copied, m: int) -> dict[str, np.ndarray]:
    """Task: ``(wall s, thread CPU s, minor faults)`` of stage 0's backward pass, right after its
    forward pass, on ``received`` (an array fetched from another worker, as it arrived), on a
    copy of ``copied`` (another fetched array) this thread made, and on an array this thread
    made; then on the first of ``m`` microbatches stashed by ``m`` forward passes (a cold stash,
    as under GPipe) against the last of them (warm)."""
    import resource

    def timed(delta, layers):
        def clock():
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            return np.array([time.perf_counter(), time.thread_time(), faults], dtype=float)

        start = clock()
        stack.backward(xt, layers, delta, first=True, input_delta=False)
        return clock() - start

    local = np.random.default_rng(0).standard_normal(received.shape).astype(np.float32)
    copy = np.array(copied)
    out = {
        "received delta": timed(received, stack.forward(xt, activate_last=False)),
        "copy of a received delta": timed(copy, stack.forward(xt, activate_last=False)),
        "delta made on this thread": timed(local, stack.forward(xt, activate_last=False)),
    }
    stash = [stack.forward(xt, activate_last=False) for _ in range(m)]
    out[f"stash of {m} microbatches, the first (cold)"] = timed(local, stash[0])
    out[f"stash of {m} microbatches, the last (warm)"] = timed(local, stash[-1])
    return out


def received(micro_rows: int = 2048, repeat: int = 7, m: int = 4) -> None:
    """Stage 0's backward pass of the bubble network on one worker (malloc tuned, the other
    worker idle but for making the arrays): on a delta fetched from the other worker against a
    copy of one and one made locally, and on a cold stash against a warm one."""
    rng = np.random.default_rng(0)
    sizes = (64,) + (1024,) * 5
    weights = [
        rng.uniform(-1, 1, (a, b)) * np.sqrt(6 / a)
        for a, b in zip(sizes[:-1], sizes[1:], strict=True)
    ]
    model = CompressedMLP(
        weights, magnitude_masks(weights, P), activation="relu", loss="mse", compute="dense",
        precision="fp32",
    )  # fmt: skip
    a, b = balanced_bounds(model, 2)[0]
    layers = model.stack.layers
    stack = CompressedStack(
        [(layers[k].master, layers[k].index, layers[k].shape) for k in range(a, b)],
        [layers[k].bias for k in range(a, b)],
        model.stack.activations[a:b],
        model.precision,
        model.compute,
    )
    xt = rng.uniform(0, 1, (sizes[0], micro_rows)).astype(np.float32)
    n_out = layers[b - 1].shape[1]
    c, client = cluster(2)
    with c, client:
        client.register_plugin(ReuseFreedMemory(), name="samo-bench-reuse-freed-memory")
        here, there = sorted(client.scheduler_info()["workers"])
        [stack_here] = client.scatter([stack], workers=[here], broadcast=False)
        [xt_here] = client.scatter([xt], workers=[here], broadcast=False)
        found = {}
        for n in range(repeat + 1):
            deltas = [
                client.submit(
                    _fresh_delta, n_out, micro_rows, 2 * n + i, workers=[there],
                    allow_other_workers=False, pure=False,
                )  # fmt: skip
                for i in range(2)
            ]
            result = client.submit(
                _backward_sources, stack_here, xt_here, *deltas, m, workers=[here],
                allow_other_workers=False, pure=False,
            ).result()  # fmt: skip
            if n:  # the first is a warm-up
                for key, value in result.items():
                    found.setdefault(key, []).append(value)
    print(
        f"\n### Stage 0's backward pass on one worker (microbatch of {micro_rows} rows, median "
        f"of {repeat}, freed memory reused)\n"
    )
    print("| backward pass on | wall ms | CPU ms | minor faults |")
    print("| --- | ---: | ---: | ---: |")
    for key, values in found.items():
        wall, cpu, faults = np.median(np.array(values), axis=0)
        print(f"| {key} | {wall * 1e3:.1f} | {cpu * 1e3:.1f} | {faults:.0f} |")


def _pass_usage(report: dict, stages: int) -> dict:
    """Per (stage, kind): the step's passes' wall and CPU seconds, minor page faults,
    involuntary context switches and migrations between CPUs."""
    out = {}
    for s in range(stages):
        events = report[(s, 0)]["events"]
        usage = report[(s, 0)]["usage"]
        for (kind, _, start, end), (_, _, cpu, *counts) in zip(events, usage, strict=True):
            if kind in "FB":
                out.setdefault((s, kind), []).append((end - start, cpu, *counts))
    return out


def _log_collections(dask_worker) -> None:
    """For ``Client.run``: keep the start and end (``time.perf_counter``) and generation of
    every cyclic garbage collection of the worker's process in ``dask_worker.samo_collections``.
    """
    import gc

    log: list = []
    begun: dict = {}

    def callback(phase, info):
        if phase == "start":
            begun["t"] = time.perf_counter()
        else:
            end = time.perf_counter()
            log.append((begun.get("t", end), end, info["generation"]))

    dask_worker.samo_collections = log
    gc.callbacks.append(callback)


def _process_state(dask_worker) -> dict:
    """For ``Client.run``: the worker's collections so far (emptied), its process's CPU seconds
    (all threads), its anonymous huge pages (kB), the CPUs it may run on, and the migrations
    between CPUs so far of its task threads (Dask's executor's)."""
    import resource
    import threading

    found = list(dask_worker.samo_collections)
    dask_worker.samo_collections.clear()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    huge = 0
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("AnonHugePages:"):
                huge = int(line.split()[1])
    return {
        "collections": found,
        "cpu": usage.ru_utime + usage.ru_stime,
        "huge kB": huge,
        "cpus": sorted(os.sched_getaffinity(0)),
        "migrations": sum(
            migrations(t.native_id)
            for t in threading.enumerate()
            if "Dask-Default-Threads" in t.name
        ),
    }


def _collected_in_passes(events: list, collections: list) -> tuple[int, float]:
    """How many of ``collections`` (start, end, generation) overlap a pass of ``events`` and
    their seconds inside the passes."""
    count, seconds = 0, 0.0
    for start, end, _ in collections:
        inside = sum(max(0.0, min(end, e[3]) - max(start, e[2])) for e in events if e[0] in "FB")
        if inside > 0:
            count += 1
            seconds += inside
    return count, seconds


def _machine_cpu() -> np.ndarray:
    """CPU seconds so far of the machine's processes other than this one and its children (the
    workers, their nannies), and the machine's steal time."""
    import psutil

    times = psutil.cpu_times()
    busy = sum(times) - times.idle - getattr(times, "iowait", 0.0)
    here = psutil.Process()
    own = 0.0
    for process in [here, *here.children(recursive=True)]:
        try:
            own += sum(process.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return np.array([busy - own, getattr(times, "steal", 0.0)])


def _busy_split(forward: list, backward: list) -> list[float]:
    """A stage's busy ms a microbatch, from its passes' usage: the mean forward plus the mean
    backward pass; of it the CPU time and the time waiting for a core; the median forward plus
    the median backward pass, and the rest above them (the slow passes' share)."""
    f, b = np.array(forward) * 1e3, np.array(backward) * 1e3
    busy = f[:, 0].mean() + b[:, 0].mean()
    cpu = f[:, 1].mean() + b[:, 1].mean()
    medians = np.median(f[:, 0]) + np.median(b[:, 0])
    return [busy, cpu, busy - cpu, medians, busy - medians]


def _spread_row(label: str, found: list) -> str:
    """A markdown row of one stage and kind's passes: wall ms (min / median / max), CPU ms
    (median), wall / CPU, involuntary switches and migrations (medians and most in a pass)."""
    a = np.array(found)
    wall, cpu = a[:, 0] * 1e3, a[:, 1] * 1e3
    return (
        f"| {label} | {len(a)} | {wall.min():.1f} / {np.median(wall):.1f} / {wall.max():.1f} | "
        f"{cpu.min():.1f} / {np.median(cpu):.1f} / {cpu.max():.1f} | "
        f"{np.median(wall / cpu):.2f} | {np.median(a[:, 3]):.0f} ({a[:, 3].max():.0f}) | "
        f"{np.median(a[:, 4]):.0f} ({a[:, 4].max():.0f}) |"
    )


def bubble(
    micro_rows: int = 2048,
    steps: int = 3,
    ms: tuple[int, ...] = (2, 4, 8),
    modes: tuple[str, ...] = BUBBLE_MODES,
    clusters: tuple[str, ...] = ("dask",),
) -> None:
    """The bubble section; ``modes``: ``"tasks"`` or ``"posted"`` (``DistributedCompressedMLP``'s
    ``messages``) with its other options at their defaults, each also with ``"-fresh"``
    (``reuse_memory=False``) and ``"-pinned"`` (``pin_cores=True``); ``clusters``:
    :data:`CLUSTERS`, each running every mode."""
    rng = np.random.default_rng(0)
    # 64-1024-1024-1024-1024-1024: the narrow first layer (1/16 of the others) needs no input
    # gradient, so stage 0 = layers 1-3 and stage 1 = layers 4-5 carry equal forward and equal
    # backward products (within 1/16 of a layer), as the cost split chooses
    sizes = (64,) + (1024,) * 5
    weights = [
        rng.uniform(-1, 1, (a, b)) * np.sqrt(6 / a)
        for a, b in zip(sizes[:-1], sizes[1:], strict=True)
    ]
    masks = magnitude_masks(weights, P)
    probe = CompressedMLP(weights, masks, loss="mse", compute="dense")
    bounds = balanced_bounds(probe, 2)
    costs = layer_costs(probe.layer_shapes, [a * b for a, b in probe.layer_shapes])
    stage_costs = [sum(costs[a:b]) / 2**20 for a, b in bounds]
    print(
        f"\n### Pipeline bubble: S = 2, {'-'.join(map(str, sizes))}, stages {bounds} (estimated "
        f"multiply-adds per sample {stage_costs[0]:.2f} M / {stage_costs[1]:.2f} M), GPipe, "
        f"dense compute fp32, microbatches of {micro_rows} rows, {steps} steps per m\n"
    )
    sources, usage, placement, machine, span_ms = {}, {}, {}, {}, {}
    print(
        "\n| messages | m | formula (S-1)/(m+S-1) | idle stage 0 / 1 | bubble (busiest "
        "stage's idle) | imbalance stage 0 / 1 | handover stage 0 / 1 (ms per pass) | "
        "within 0.05: idle 0 / 1, bubble | busy per microbatch, stage 0 / 1 (ratio) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for n_cluster, kind in enumerate(clusters):
        c, client = CLUSTERS[kind](2)
        with c, client:
            for address, found in sorted(client.run(_worker_threads).items()):
                print(f"worker {address} ({kind} cluster): {found}")
            client.run(_log_collections)
            anatomy = CompressedMLP(
                weights, masks, activation="relu", loss="mse", precision="fp32", compute="dense"
            )
            if n_cluster == 0:
                pass_anatomy(client, anatomy, bounds, micro_rows)
            for mode in modes:
                messages = mode.removesuffix("-pinned").removesuffix("-fresh")
                options = {"reuse_memory": "-fresh" not in mode}
                if mode.endswith("-pinned"):
                    options["pin_cores"] = True
                label = mode if len(clusters) == 1 else f"{kind}: {mode}"
                for m in ms:
                    model = CompressedMLP(
                        weights, masks, activation="relu", loss="mse", precision="fp32",
                        compute="dense",
                    )  # fmt: skip
                    x = rng.uniform(0, 1, (micro_rows * m, sizes[0])).astype(np.float32)
                    y = rng.uniform(0, 1, (micro_rows * m, sizes[-1])).astype(np.float32)
                    with DistributedCompressedMLP(
                        model, client, stages=2, microbatches=m, schedule="gpipe",
                        messages=messages, **options,
                    ) as pipe:  # fmt: skip
                        pipe.train_step(x, y, optimizer=Adam())
                        parts = {0: [], 1: []}
                        sources[(label, m)] = {0: [], 1: []}
                        cell = placement[(label, m)] = {s: [] for s in (0, 1)}
                        machine[(label, m)] = []
                        for _ in range(steps):
                            before = client.run(_process_state), _machine_cpu()
                            pipe.train_step(x, y, optimizer=Adam())
                            after = client.run(_process_state), _machine_cpu()
                            machine[(label, m)].append(after[1] - before[1])
                            before, after = before[0], after[0]
                            report = pipe.step_report()
                            for (s, _), breakdown in pipe.idle_breakdown().items():
                                parts[s].append(breakdown)
                            for (s, _), found in pipe.idle_sources().items():
                                sources[(label, m)][s].append(found)
                            for key, found in _pass_usage(report, 2).items():
                                usage.setdefault((label, m, *key), []).extend(found)
                            for s in (0, 1):
                                address, events = pipe.workers[(s, 0)], report[(s, 0)]["events"]
                                passes_cpu = sum(u[2] for u in report[(s, 0)]["usage"])
                                cell[s].append(
                                    (
                                        *_collected_in_passes(
                                            events, after[address]["collections"]
                                        ),
                                        after[address]["cpu"] - before[address]["cpu"]
                                        - passes_cpu,
                                        after[address]["huge kB"],
                                        after[address]["migrations"]
                                        - before[address]["migrations"],
                                    )
                                )  # fmt: skip
                    want = bubble_fraction(2, m)
                    idle = [_median(parts[s], "idle") for s in (0, 1)]
                    imbalance = [_median(parts[s], "imbalance") for s in (0, 1)]
                    handover = [_median(parts[s], "handover") for s in (0, 1)]
                    spans = [b.busy / (1 - b.idle) for b in parts[0]]
                    per_pass = [h * statistics.median(spans) / (2 * m) * 1e3 for h in handover]
                    bubble_part = _median(parts[0], "bubble")
                    per = [_median(parts[s], "busy") / m * 1e3 for s in (0, 1)]
                    ok = ["yes" if abs(g - want) <= 0.05 else "NO" for g in (*idle, bubble_part)]
                    span_ms[(label, m)] = statistics.median(spans) * 1e3
                    print(
                        f"| {label} | {m} | {want:.3f} | {idle[0]:.3f} / {idle[1]:.3f} | "
                        f"{bubble_part:.3f} | {imbalance[0]:.3f} / {imbalance[1]:.3f} | "
                        f"{handover[0]:.3f} / {handover[1]:.3f} ({per_pass[0]:.1f} / "
                        f"{per_pass[1]:.1f}) | {' / '.join(ok[:2])}, {ok[2]} | "
                        f"{per[0]:.0f} / {per[1]:.0f} ms ({max(per) / min(per):.3f}) |"
                    )
    print(
        "\n| messages | m | busy a microbatch (ms), stage 0 / 1 (ratio) | of it CPU | of it "
        "waiting for a core | at the median passes (F + B) | above the median passes | other "
        "processes' CPU a step (ms) | steal a step (ms) | forward-backward span (ms) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (label, m), found in machine.items():
        split = [_busy_split(usage[(label, m, s, "F")], usage[(label, m, s, "B")]) for s in (0, 1)]
        busy = [b[0] for b in split]
        others, steal = np.median(np.array(found), axis=0) * 1e3
        print(
            f"| {label} | {m} | {busy[0]:.0f} / {busy[1]:.0f} ({max(busy) / min(busy):.3f}) | "
            + " | ".join(f"{split[0][k]:.0f} / {split[1][k]:.0f}" for k in (1, 2, 3, 4))
            + f" | {others:.0f} | {steal:.0f} | {span_ms[(label, m)]:.0f} |"
        )
    print(
        "\n| messages | m | stage | idle | formula | + stage costs | + pass variation | "
        "+ handover | mean forward / backward (ms) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (messages, m), per_stage in sources.items():
        for s, found in per_stage.items():
            idle, formula = _median(found, "idle"), _median(found, "formula")
            added = [_median(found, f) for f in ("stage_costs", "pass_variation", "handover")]
            fb = [_median(found, f) * 1e3 for f in ("mean_forward", "mean_backward")]
            print(
                f"| {messages} | {m} | {s} | {idle:.3f} | {formula:.3f} | "
                + " | ".join(f"{v:+.3f}" for v in added)
                + f" | {fb[0]:.0f} / {fb[1]:.0f} |"
            )
    print(
        "\n| messages | m | stage | pass | wall ms | CPU ms | wall / CPU | minor faults |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for (messages, m, s, kind), found in sorted(usage.items()):
        wall, cpu, faults = np.median(np.array(found)[:, :3], axis=0)
        print(
            f"| {messages} | {m} | {s} | {kind} | {wall * 1e3:.1f} | {cpu * 1e3:.1f} | "
            f"{wall / cpu:.2f} | {faults:.0f} |"
        )
    print(
        "\n| messages | m | stage | pass | passes | wall ms min / median / max | CPU ms min / "
        "median / max | wall / CPU | involuntary switches (most) | migrations (most) |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (messages, m, s, kind), found in sorted(usage.items()):
        print(_spread_row(f"{messages} | {m} | {s} | {kind}", found))
    print(
        "\n| messages | m | stage | collections in passes a step (ms) | CPU of the worker's "
        "other threads a step (ms) | anonymous huge pages (MiB) | task thread's migrations a "
        "step |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (messages, m), per_stage in placement.items():  # fmt: skip
        for s, found in per_stage.items():
            a = np.median(np.array(found), axis=0)
            print(
                f"| {messages} | {m} | {s} | {a[0]:.0f} ({a[1] * 1e3:.1f}) | {a[2] * 1e3:.0f} | "
                f"{a[3] / 1024:.0f} | {a[4]:.0f} |"
            )
    print(
        "\n(idle = formula + stage costs + pass variation + handover, medians of the steps: "
        "the stages' unequal mean passes, unequal passes of one stage and kind, and the time "
        "passes started after the ideal timeline's start; pipeline_parallel.timeline)"
    )
    print(
        "\n(idle = bubble + imbalance; the bubble is the busiest stage's idle fraction, which the "
        "formula describes; the imbalance is the time a stage waits because the other is busier; "
        "the handover, part of the idle time, is the time a pass started after its inputs were "
        "ready: with messages='tasks' Dask's scheduler round trip and the message's transfer, "
        "with 'posted' the message's transfer)"
    )


def timed_steps(pipe, x, y, warmup: int, steps: int) -> tuple[int, float, str]:
    """``warmup`` untimed Adam steps of ``pipe`` on ``(x, y)``, then ``steps`` timed ones: the
    bytes a timed step moved between workers, the median seconds a step, and whether the bytes
    equal the formula."""
    for _ in range(warmup):  # kernels, plans, postboxes
        pipe.train_step(x, y, optimizer=Adam())
    pipe.reset_comm()  # the timed steps' traffic
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        pipe.train_step(x, y, optimizer=Adam())
        times.append(time.perf_counter() - start)
    report = pipe.comm_report()
    exact = "= formula" if report.exact else "differs from formula"
    return report.total() // report.steps, statistics.median(times), exact


def workers(rows: int = 256, microbatches: int = 4, steps: int = 5) -> None:
    dense = DenseMLP.init(MLP_1024_3, seed=0)
    masks = magnitude_masks(dense.weights, P)
    shapes = [w.shape for w in dense.weights]
    masked_bytes = dense_layer_bytes(shapes, arrays=5)  # W, float mask, gradient, two moments
    samo = dense.prune(masks)
    samo_bytes = compressed_layer_bytes(samo.stack, Adam())
    limit = max(sum(masked_bytes[a:b]) for a, b in split_stages(masked_bytes, 2))
    plans = {
        "dense with mask": plan_parallelism(masked_bytes, 2, limit),
        "SAMO fp32": plan_parallelism(samo_bytes, 2, limit),
    }
    x, y = batch(784, rows)
    print(
        f"\n### Fewer workers: 2 workers, per-worker limit {limit:,} B (the dense model with a "
        f"mask split in 2 stages), batch {rows}, {microbatches} microbatches\n"
    )
    print(
        "| model | plan (S x D) | state bytes per worker | bytes moved per step | "
        "time per step (median of 5) |"
    )
    print("| --- | --- | ---: | ---: | ---: |")
    c, client = cluster(2)
    with c, client:
        for name, plan in plans.items():
            compute = "dense" if name == "dense with mask" else "sparse"
            model = dense.prune(masks, compute=compute)
            with DistributedCompressedMLP(
                model,
                client,
                stages=plan.stages,
                replicas=plan.replicas,
                microbatches=microbatches,
            ) as pipe:
                moved, seconds, exact = timed_steps(pipe, x, y, 1, steps)
            print(
                f"| {name} | {plan.stages} x {plan.replicas} | {max(plan.stage_bytes):,} | "
                f"{moved:,} ({exact}) | {seconds * 1e3:.1f} ms |"
            )
    print(
        "\n(the dense model with a mask runs as compressed stages with dense compute: the same "
        "BLAS products; its state bytes are those of 5 dense float32 arrays per layer)"
    )


# ---------------------------------------------------------------------------- links
def links(replicas=(2, 4), rate: str = "1gbit", rows: int = 256, steps: int = 7) -> None:
    """Compressed-gradient data parallelism (SAMO) against dense-gradient data parallelism of
    the same network, D replicas on a :class:`~harness.NetCluster` of ``rate`` links, beside
    PyTorch DDP (gloo) training the masked model on the same links and batch."""
    from distributed import Client
    from harness import NetCluster, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        print(f"\n### Links: skipped ({reason})")
        return
    dense = DenseMLP.init(MLP_1024_3, seed=0)
    masks = magnitude_masks(dense.weights, P)
    every = [np.ones(w.shape, dtype=bool) for w in dense.weights]
    models = {
        "SAMO fp32, compressed gradients": dense.prune(masks),
        "dense gradients (every weight kept, dense compute)": dense.prune(every, compute="dense"),
    }
    x, y = batch(784, rows)
    print(
        f"\n### Links: 784-1024-1024-1024-10, p = {P}, batch {rows}, Adam, D replicas on "
        f"{rate} links (median of {steps} steps)\n"
    )
    print("| D | training | bytes a step | vs dense | time a step | dense / this |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).resolve().parents[1]))}
    env |= {var: "1" for var in _THREAD_VARS}
    for d in replicas:
        rows_of = {}
        with NetCluster(workers=d, rate=rate, env=env) as net, Client(net.address) as client:
            for name, model in models.items():
                with DistributedCompressedMLP(model, client, replicas=d) as pipe:
                    rows_of[name] = timed_steps(pipe, x, y, 2, steps)
            command = [__file__, "--ddp-rows", str(rows), "--ddp-steps", str(steps)]
            outputs = net.run_ranks(*command, env={**env, "GLOO_SOCKET_IFNAME": "eth0"})
        base_bytes, base_time, _ = rows_of["dense gradients (every weight kept, dense compute)"]
        for name, (moved, seconds, exact) in rows_of.items():
            print(
                f"| {d} | {name} | {moved:,} ({exact}) | {moved / base_bytes:.3f} | "
                f"{seconds * 1e3:.1f} ms | {base_time / seconds:.2f}x |"
            )
        if outputs[0] is not None:
            seconds = json.loads(outputs[0].strip().splitlines()[-1])["seconds"]
            n = sum(w.size + b.size for w, b in zip(dense.weights, dense.biases, strict=True))
            moved = 2 * (d - 1) * n * 4  # a ring allreduce of the dense gradients, float32
            print(
                f"| {d} | PyTorch DDP (gloo), masked model | {moved:,} (ring formula) | "
                f"{moved / base_bytes:.3f} | {seconds * 1e3:.1f} ms | {base_time / seconds:.2f}x |"
            )


def ddp_rank(rank: int, world: int, master: str, rows: int, steps: int) -> None:
    """One rank of PyTorch DDP (gloo) training the masked network on its rows of the batch;
    rank 0 prints the median step time as JSON (started by :meth:`NetCluster.run_ranks`)."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://{master}:29500", rank=rank, world_size=world
    )
    dense = DenseMLP.init(MLP_1024_3, seed=0)
    step, _ = torch_pruned(dense, magnitude_masks(dense.weights, P), ddp=True)
    x, y = batch(784, rows)
    mine = np.array_split(np.arange(rows), world)[rank]
    x, y = x[mine], y[mine]
    times = []
    for _ in range(2 + steps):
        dist.barrier()
        start = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - start)
    dist.barrier()
    if rank == 0:
        print(json.dumps({"seconds": statistics.median(times[2:])}), flush=True)
    dist.destroy_process_group()


SECTIONS = {
    "memory": memory,
    "accuracy": accuracy,
    "speed": speed,
    "bubble": bubble,
    "received": received,
    "workers": workers,
    "links": links,
}

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="SAMO against its baselines")
    parser.add_argument("sections", nargs="*", help=f"of {list(SECTIONS)} (default: all)")
    parser.add_argument(
        "--bubble-m", type=int, nargs="+", default=[2, 4, 8], help="microbatches (bubble)"
    )
    parser.add_argument("--bubble-steps", type=int, default=3, help="measured steps per m")
    parser.add_argument("--bubble-rows", type=int, default=2048, help="rows per microbatch")
    parser.add_argument(
        "--bubble-messages",
        nargs="+",
        default=list(BUBBLE_MODES),
        choices=[
            f"{messages}{reuse}{pin}"
            for messages in ("tasks", "posted")
            for reuse in ("", "-fresh")
            for pin in ("", "-pinned")
        ],
        help="how the pipeline's messages travel (bubble), the model's other options at their "
        "defaults; -fresh: reuse_memory=False, -pinned: pin_cores=True",
    )
    parser.add_argument(
        "--bubble-clusters",
        nargs="+",
        default=["dask"],
        choices=list(CLUSTERS),
        help="clusters to run the modes on (bubble): dask = Dask's defaults, dasknn = "
        "dasknn.runtime.cluster.local_cluster (worker profiler off)",
    )
    parser.add_argument(
        "--links-replicas", type=int, nargs="+", default=[2, 4], help="replicas D (links)"
    )
    parser.add_argument("--links-rate", default="1gbit", help="link rate, tc notation (links)")
    parser.add_argument("--links-rows", type=int, default=256, help="batch rows (links)")
    parser.add_argument("--links-steps", type=int, default=7, help="measured steps (links)")
    parser.add_argument("--ddp-rows", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ddp-steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.links_replicas) < 2:
        parser.error("--links-replicas: at least 2 replicas (one exchanges no gradients)")
    if args.rank is not None:  # one DDP rank of the links section (NetCluster.run_ranks)
        ddp_rank(args.rank, args.world, args.master, args.ddp_rows, args.ddp_steps)
        raise SystemExit
    unknown = [name for name in args.sections if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    print(f"machine: {describe()}; numpy {np.__version__}")
    for name in args.sections or list(SECTIONS):
        if name == "bubble":
            bubble(
                args.bubble_rows,
                args.bubble_steps,
                tuple(args.bubble_m),
                tuple(args.bubble_messages),
                tuple(args.bubble_clusters),
            )
        elif name == "links":
            links(
                tuple(args.links_replicas), args.links_rate, args.links_rows, args.links_steps
            )
        else:
            SECTIONS[name]()
