"""What one Dask span costs: the memory a standalone call (``train_step``) leaves on the scheduler
and on every worker for good.

Dask's scheduler starts a new default span whenever the cluster was idle and never forgets one
(``distributed.spans``: no configuration and no public call removes a span), so a model called one
step at a time adds a span per call: the span, the task groups it keeps (the scheduler drops them
from ``Scheduler.task_groups`` once their tasks are forgotten, the span keeps them), its metrics,
and on every worker the fine performance metrics keyed by span id (``Worker.digests_total`` and
``digests_max``).

After ``--warmup`` calls, ``tracemalloc`` starts in the client/scheduler process and every worker;
``--calls`` calls of ``train_step`` follow (one span each), then, after a full collection, a first
snapshot. The script then removes the spans of the first ``--calls - --keep`` of those calls from
the scheduler's span records (and their metrics from the workers) itself, as a measurement only
(the newest ``--keep`` spans stay, since Dask's bounded record of the last 100 computations also
keeps their task groups), collects and takes a second snapshot: what was freed, divided by the
spans removed, is the memory one span holds. Also printed: the growth per call between the start
of tracing and the first snapshot (everything a call leaves, spans included).

Usage::

    flock /tmp/dasknn-tests.lock python benchmarks/span_cost.py [--calls 300] [--keep 110]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import numpy as np
from distributed import Client, LocalCluster
from machine import describe

from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP

KIB = 2**10


def _traced() -> int:
    """Bytes traced and still held after a full collection."""
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def _start(dask_worker=None, dask_scheduler=None) -> int:
    gc.collect()
    tracemalloc.start(1)
    return _traced()


def _stop(dask_worker=None, dask_scheduler=None) -> None:
    tracemalloc.stop()


def _span_ids(dask_scheduler) -> list[str]:
    """Every span's id, oldest first."""
    return list(dask_scheduler.extensions["spans"].spans)


def _forget_spans(ids: list[str], dask_scheduler) -> dict:
    """Remove the spans ``ids`` (done, without children) from the scheduler's span records;
    the traced bytes before and after, and the spans and task groups removed."""
    before = _traced()
    ext = dask_scheduler.extensions["spans"]
    gone = {i for i in ids if i in ext.spans and ext.spans[i].done and not ext.spans[i].children}
    groups = sum(len(ext.spans[i].groups) for i in gone)
    for i in gone:
        del ext.spans[i]
    ext.root_spans[:] = [s for s in ext.root_spans if s.id not in gone]
    for index in (ext.spans_search_by_name, ext.spans_search_by_tag):
        for spans in index.values():
            spans[:] = [s for s in spans if s.id not in gone]
    return {"before": before, "after": _traced(), "spans": len(gone), "groups": groups}


def _forget_metrics(ids: list[str], dask_worker) -> dict:
    """Remove the worker's fine performance metrics of the spans ``ids`` (``digests_total``,
    ``digests_max``, and ``digests`` where crick keeps them); the traced bytes before and after
    and the entries removed."""
    before = _traced()
    ids = set(ids)
    records = [dask_worker.digests_total, dask_worker.digests_max, dask_worker.digests or {}]
    removed = 0
    for record in records:
        keys = [k for k in record if isinstance(k, tuple) and len(k) > 1 and k[1] in ids]
        for k in keys:
            del record[k]
        removed += len(keys)
    return {"before": before, "after": _traced(), "entries": removed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--keep", type=int, default=110, help="newest spans left in place")
    parser.add_argument("--neurons", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if not 0 <= args.keep < args.calls:
        parser.error("--keep must be >= 0 and below --calls")
    print(describe())
    model = SparseMLP.radixnet(neurons=args.neurons, layers=args.layers, seed=0)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(args.batch_size, model.n_inputs))
    y = rng.uniform(size=(args.batch_size, model.n_outputs))
    parts = [rng.integers(0, 2, size=n) for n in model.layer_sizes]
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
        DistributedSparseMLP(model, client, parts) as dist,
    ):
        for _ in range(args.warmup):
            dist.train_step(x, y, lr=0.01)
        time.sleep(1)
        first = len(client.run_on_scheduler(_span_ids))
        start = {"scheduler": client.run_on_scheduler(_start), **client.run(_start)}
        clock = time.perf_counter()
        for _ in range(args.calls):
            dist.train_step(x, y, lr=0.01)
        wall = time.perf_counter() - clock
        time.sleep(2)  # the workers' last heartbeats carry the last spans' metrics
        ids = client.run_on_scheduler(_span_ids)
        new = ids[first:]
        forget = new[: len(new) - args.keep]
        freed = {"scheduler": client.run_on_scheduler(_forget_spans, forget)}
        freed.update(client.run(_forget_metrics, forget))
        client.run_on_scheduler(_stop)
        client.run(_stop)
    print(
        f"{args.calls} train_step calls in {wall:.1f} s ({wall / args.calls * 1e3:.1f} ms a call), "
        f"{len(new)} new spans; {len(forget)} of them removed for the measurement"
    )
    for name, record in freed.items():
        grown = (record["before"] - start[name]) / args.calls / KIB
        removed = record.get("spans") or len(forget)
        per_span = (record["before"] - record["after"]) / max(removed, 1) / KIB
        extra = ", ".join(f"{k} {v}" for k, v in record.items() if k not in ("before", "after"))
        print(
            f"  {name.split('//')[-1]:22s} grown {grown:6.2f} KiB per call; held by one span "
            f"{per_span:6.2f} KiB ({extra})"
        )


if __name__ == "__main__":
    main()
