"""Who holds the memory the soak grows by: tracemalloc in every process of the soak's run.

Trains as ``benchmarks/soak.py`` does (P = 2, ``fit`` on 100 batches at a time, on the cluster
and client ``dasknn.runtime.cluster.open_client`` opens). After the warm-up it runs a full garbage
collection and starts ``tracemalloc`` in the client/scheduler process and in every worker (and
takes a snapshot there); after ``--batches`` it collects and takes a second snapshot, after
``--window`` more (``--batches`` unless given) a third one, and prints, per process, what grew
between the second and the third by traceback (the largest ``--top``), what
``dask.utils.key_split``'s cache alone held (freed by clearing it) and what grew in the first
window (between the first and the second snapshot), then the resident size (slowed and inflated
by tracing) before and after ``malloc_trim(0)``, and the sizes of Dask's per-key records:
``key_split``'s cache, the scheduler's tasks, task groups, task prefixes, spans and their
groups, computations, the workers' tasks and data, and the entries and bytes (pickled objects
and serialized frames counted at their size) of the records Dask keeps of the last messages of
every batched stream (``distributed.admin.low-level-log-length`` entries each) and of its log
records (``distributed.admin.log-length``).

Usage::

    flock /tmp/dasknn-tests.lock python benchmarks/soak_trace.py [--warmup 500] [--batches 100]

While tracing, it prints after every ``fit`` call the resident size of the client/scheduler
process and the memory tracemalloc sees allocated there, to tell at which batch a step of the
resident size happens and whether Python's allocations (and numpy's, which tracemalloc sees) make
it.

A bounded record whose entries were made before tracing started shows as growth until it has
turned over once since: each untraced entry it drops is replaced by a traced one. So the first
``--batches`` must be long enough for every bounded record to turn over (Dask's
``distributed.admin.low-level-log-length`` entries of every batched stream: a few hundred batches
at Dask's 1,000, a few dozen at ``dasknn.runtime.cluster.LOW_LEVEL_LOG_LENGTH``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import pickle
import time
import tracemalloc
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import psutil
from dask.utils import key_split
from distributed import Scheduler
from distributed.batched import BatchedSend
from distributed.utils import DequeHandler
from machine import describe
from soak import soak_problem

from dasknn.model_parallel import DistributedSparseMLP
from dasknn.runtime.cluster import open_client

MIB = 2**20
_IGNORE = [tracemalloc.Filter(False, tracemalloc.__file__)]


def _rss() -> float:
    return psutil.Process(os.getpid()).memory_info().rss / MIB


def _payload_bytes(obj) -> int:
    """Approximate bytes a recorded message holds: containers walked, serialized frames and
    objects wrapped for pickling counted at their size."""
    if isinstance(obj, dict):
        return sum(_payload_bytes(k) + _payload_bytes(v) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return sum(_payload_bytes(item) for item in obj)
    if isinstance(obj, bytes | bytearray | memoryview):
        return len(obj)
    if isinstance(obj, str):
        return len(obj)
    frames = getattr(obj, "frames", None)
    if frames is not None:
        return sum(len(frame) for frame in frames)
    if hasattr(obj, "data") and type(obj).__name__ in ("ToPickle", "Pickled"):
        try:
            return len(pickle.dumps(obj.data, protocol=5))
        except Exception:
            return 0
    return 64


def _message_logs() -> dict[str, str]:
    """Entries and bytes of the message records of every batched stream in this process (the
    client's, the scheduler's or a worker's) and of Dask's log-record deques."""
    streams = [obj for obj in gc.get_objects() if isinstance(obj, BatchedSend)]
    logs = [stream.recent_message_log for stream in streams]
    records = [handler.deque for handler in DequeHandler._instances]
    return {
        "batched-stream message records": f"{len(logs)} streams, "
        f"{sum(len(log) for log in logs)} entries, "
        f"{sum(_payload_bytes(list(log)) for log in logs) / MIB:.2f} MiB",
        "log records": f"{len(records)} deques, {sum(len(d) for d in records)} entries",
    }


def _records(server) -> dict[str, int | str]:
    """Sizes of Dask's per-key records in the process of ``server`` (a scheduler or a worker)."""
    sizes: dict[str, int | str] = {"key_split cache": key_split.cache_info().currsize}
    sizes.update(_message_logs())
    if isinstance(server, Scheduler):
        spans = server.extensions["spans"]
        sizes.update(
            tasks=len(server.tasks),
            task_groups=len(server.task_groups),
            task_prefixes=len(server.task_prefixes),
            spans=len(spans.spans),
            span_groups=sum(len(span.groups) for span in spans.spans.values()),
            computations=len(server.computations),
        )
    else:
        sizes.update(tasks=len(server.state.tasks), data=len(server.data))
    return sizes


def _start(frames: int, dask_worker) -> dict:
    """Collect, then trace allocations from here on and keep a first snapshot (empty but for
    what the call itself allocates) on ``dask_worker``."""
    gc.collect()
    tracemalloc.start(frames)
    dask_worker.soak_first = tracemalloc.take_snapshot().filter_traces(_IGNORE)
    return {"rss": _rss(), **_records(dask_worker)}


def _traced_now(dask_scheduler=None) -> tuple[float, float]:
    """Resident size and the memory tracemalloc sees allocated now, in MiB."""
    return _rss(), tracemalloc.get_traced_memory()[0] / MIB


def _type_counts() -> Counter:
    """How many objects the garbage collector tracks, by type name."""
    return Counter(type(obj).__qualname__ for obj in gc.get_objects())


def _mark(dask_worker) -> dict:
    """Collect and keep a snapshot of the traced allocations still held and the counts of the
    objects by type (on ``dask_worker``)."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces(_IGNORE)
    dask_worker.soak_first_growth = snapshot.compare_to(dask_worker.soak_first, "traceback")
    del dask_worker.soak_first
    dask_worker.soak_snapshot = snapshot
    dask_worker.soak_types = _type_counts()
    return {"rss": _rss(), **_records(dask_worker)}


def short_path(filename: str) -> str:
    """``filename`` from ``site-packages/``, the Python library or this repository on."""
    for marker in ("site-packages/", "lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    root = str(Path(__file__).resolve().parents[1]) + os.sep
    return filename.removeprefix(root)


def _total(snapshot: tracemalloc.Snapshot) -> float:
    return sum(stat.size for stat in snapshot.statistics("filename")) / MIB


def _growth(newer: tracemalloc.Snapshot, older: tracemalloc.Snapshot, top: int) -> list[str]:
    """The ``top`` largest increases from ``older`` to ``newer``, by traceback."""
    return growth_lines(newer.compare_to(older, "traceback"), top)


def growth_lines(stats: list[tracemalloc.StatisticDiff], top: int) -> list[str]:
    """The ``top`` first of ``stats`` (largest increase first), with their tracebacks."""
    lines = []
    for stat in stats[:top]:
        lines.append(f"    {stat.size_diff / MIB:+7.3f} MiB {stat.count_diff:+8d} blocks")
        for frame in reversed(stat.traceback):
            lines.append(f"        {short_path(frame.filename)}:{frame.lineno}")
    return lines


def _report(top: int, dask_worker) -> dict:
    """Collect and snapshot again: what grew since :func:`_mark`; then clear
    ``dask.utils.key_split``'s cache, collect and snapshot: what the cache alone held. Stops
    tracing; the resident size before and after ``malloc_trim(0)``, the records' sizes."""
    gc.collect()
    older = dask_worker.soak_snapshot
    del dask_worker.soak_snapshot
    types = _type_counts()
    types.subtract(dask_worker.soak_types)
    del dask_worker.soak_types
    first_growth = dask_worker.soak_first_growth
    del dask_worker.soak_first_growth
    newer = tracemalloc.take_snapshot().filter_traces(_IGNORE)
    records = _records(dask_worker)
    key_split.cache_clear()
    gc.collect()
    cleared = tracemalloc.take_snapshot().filter_traces(_IGNORE)
    tracemalloc.stop()
    lines = [
        f"traced and held: {_total(older):.2f} MiB at the mark, {_total(newer):.2f} MiB at the "
        f"end, {_total(cleared):.2f} MiB after key_split.cache_clear()",
        "objects (tracked by the collector) grown since the mark, by type: "
        + ", ".join(f"{name} {n:+d}" for name, n in types.most_common(top)),
        "grown since the mark (most recent call first):",
        *_growth(newer, older, top),
        "freed by key_split.cache_clear():",
        *_growth(newer, cleared, top),
        "grown in the first window, from the start of tracing to the mark:",
        *growth_lines(first_growth, top),
    ]
    del older, newer, cleared, first_growth
    gc.collect()
    rss = _rss()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return {"rss": rss, "rss after malloc_trim": _rss(), **records, "report": "\n".join(lines)}


def _settle() -> None:
    """Let the client drop the futures of the last call and the cluster release their keys."""
    gc.collect()
    time.sleep(2)


def _train(
    dist: DistributedSparseMLP, x, y, batches: int, every: int, batch_size: int, done: int = 0
) -> float:
    """Train ``batches`` batches, ``every`` a ``fit`` call; with ``done`` > 0 (batches trained
    before, while tracing), print the client/scheduler process's resident and traced memory
    after every call."""
    start = time.perf_counter()
    for _ in range(batches // every):
        dist.fit(x, y, batch_size=batch_size, lr=0.01, progress=False, shuffle=False)
        if done:
            done += every
            rss, traced = dist.client.run_on_scheduler(_traced_now)
            print(f"  batch {done:6d}  {time.perf_counter() - start:6.1f} s  client/scheduler "
                  f"rss {rss:7.1f} MiB  traced {traced:7.2f} MiB", flush=True)  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument(
        "--batches", type=int, default=100, help="batches from the start of tracing to the mark"
    )
    parser.add_argument(
        "--window", type=int, help="batches from the mark to the end (default: --batches)"
    )
    parser.add_argument("--every", type=int, default=100, help="batches per fit call")
    parser.add_argument("--neurons", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--frames", type=int, default=25)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument(
        "--scheduler-only",
        action="store_true",
        help="trace the client/scheduler process only (the workers then run at full speed)",
    )
    args = parser.parse_args()
    if args.window is None:
        args.window = args.batches
    if any(n % args.every for n in (args.warmup, args.batches, args.window)) or not (
        args.batches and args.window
    ):
        parser.error("--warmup, --batches and --window must be multiples of --every (and > 0)")
    print(describe(), f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', 'unset')}")
    model, x, y, parts = soak_problem(args.neurons, args.layers, args.every * args.batch_size)
    with ExitStack() as stack:
        client = open_client(stack, workers=2)  # as benchmarks/soak.py
        with DistributedSparseMLP(model, client, parts) as dist:
            wall = _train(dist, x, y, args.warmup, args.every, args.batch_size)
            print(f"warm-up: {args.warmup} batches in {wall:.1f} s", flush=True)
            _settle()
            client.run_on_scheduler(_start, args.frames)
            if not args.scheduler_only:
                client.run(_start, args.frames)
            done = args.warmup
            wall = _train(dist, x, y, args.batches, args.every, args.batch_size, done)
            print(f"traced: {args.batches} batches in {wall:.1f} s", flush=True)
            _settle()
            marks = {"client/scheduler": client.run_on_scheduler(_mark)}
            if not args.scheduler_only:
                marks.update(client.run(_mark))
            done += args.batches
            wall = _train(dist, x, y, args.window, args.every, args.batch_size, done)
            print(f"traced: {args.window} more batches in {wall:.1f} s", flush=True)
            _settle()
            ends = {"client/scheduler": client.run_on_scheduler(_report, args.top)}
            if not args.scheduler_only:
                ends.update(client.run(_report, args.top))
    per = 1000 / args.window
    for name, end in ends.items():
        mark = marks[name]
        print(
            f"\n=== {name}: rss {mark['rss']:.1f} -> {end['rss']:.1f} MiB "
            f"({(end['rss'] - mark['rss']) * per:+.2f} MiB per 1,000 batches, traced), "
            f"{end['rss after malloc_trim']:.1f} after malloc_trim(0)"
        )
        for record, value in end.items():
            if record not in ("rss", "rss after malloc_trim", "report"):
                print(f"  {record}: {mark[record]} -> {value}")
        print(end["report"])


if __name__ == "__main__":
    main()
