"""D-SLIDE against PyTorch DistributedDataParallel (gloo) on links of a given rate, one run.

On a :class:`netcluster.NetCluster` (scheduler and ``P`` workers in their own network namespaces,
every link shaped to ``--rate``), with the sizes of ``benchmarks/slide.py``:

1. dasknn ``DistributedSampledMLP`` (one shard a worker): seconds a step and the bytes a step
   between workers, measured, beside the formula;
2. the same dasknn model with every neuron active (``active_fraction=1``: dense model
   parallelism);
3. PyTorch DDP over gloo, one process a worker (run as a task on the same workers), training the
   same network with a full softmax on ``B / P`` rows each: seconds a step; the bytes a step are
   those of its gradient allreduce (ring: ``2 (P - 1) / P`` times the parameter bytes sent by
   each worker).

Root only (namespaces). Usage::

    flock /tmp/dasknn-tests.lock python benchmarks/slide_net.py [--rate 1gbit] [--steps 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from distributed import Client
from harness import describe
from harness import NetCluster, unavailable_reason

from dasknn.datasets import make_extreme_classification
from dasknn.optim import Adam
from dasknn.runtime.cluster import scheduler_workers
from dasknn.sampled import SampledMLP
from dasknn.sampled_parallel import DistributedSampledMLP


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
        correction="none",  # SLIDE's sampled softmax, as run S2 measured
        hashing="plain",
        uniform_fraction=0.0,
        hidden_update="rows",
        optimizer=Adam(lr=3e-3),
        shards=args.workers,
        hogwild=False,
        seed=0,
    ).initialize(args.features, args.labels)
    with DistributedSampledMLP(model, client) as dist:
        rows = np.arange(args.batch)
        dist.train_step(data.X[rows], data.Y[rows])  # warm-up (compilation)
        dist.reset_transfers()
        start = time.perf_counter()
        for s in range(steps):
            rows = np.arange((s + 1) * args.batch, (s + 2) * args.batch)
            dist.train_step(data.X[rows], data.Y[rows])
        seconds = (time.perf_counter() - start) / steps
        measured = sum(dist.transfers().values()) / steps
        formula = sum(dist.predicted_bytes(args.batch).values())
    return seconds, measured, formula


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--features", type=int, default=100_000)
    parser.add_argument("--labels", type=int, default=200_000)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dense-steps", type=int, default=1)
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot run: {reason}")
    print(f"machine: {describe()}; links {args.rate}, P = {args.workers}")
    data = make_extreme_classification(
        n_samples=(args.steps + 2) * args.batch,
        n_features=args.features,
        n_labels=args.labels,
        seed=0,
    )
    # gloo picks its interface from the hostname (loopback here): name the namespace link
    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    with (
        NetCluster(workers=args.workers, rate=args.rate, env=env) as cluster,
        Client(cluster.address) as client,
    ):
        workers = sorted(scheduler_workers(client))
        sec, measured, formula = dslide_steps(client, data, args, 0.005, args.steps)
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
                args.workers,
                master,
                29511,
                args.features,
                args.labels,
                args.hidden,
                args.batch,
                37,
                args.steps,
                workers=[w],
                pure=False,
            )
            for rank, w in enumerate(workers)
        ]
        results = client.gather(futures)
        ddp_sec = max(r[0] for r in results)
        ddp_bytes = 2 * (args.workers - 1) / args.workers * results[0][1] * args.workers
        print(
            f"PyTorch DDP (gloo), full softmax: {ddp_sec:.3f} s a step, about "
            f"{ddp_bytes / 1e6:.1f} MB a step between workers (ring allreduce of "
            f"{results[0][1] / 1e6:.1f} MB of gradients); D-SLIDE is {ddp_sec / sec:.1f}x faster",
            flush=True,
        )
        dense_sec, dense_measured, _ = dslide_steps(client, data, args, 1.0, args.dense_steps)
        print(
            f"dasknn, every neuron active (dense model parallel): {dense_sec:.3f} s a step, "
            f"{dense_measured / 1e6:.3f} MB a step; D-SLIDE is {dense_sec / sec:.1f}x faster"
        )


if __name__ == "__main__":
    main()
