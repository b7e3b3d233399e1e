"""What the soak's workers grow by: their records, their heap and tracemalloc inside them.

Trains as ``benchmarks/soak.py`` does (P = 2, ``fit`` on 100 batches at a time, on the cluster and
client ``dasknn.runtime.cluster.open_client`` opens) and, after every ``fit`` call, samples in
every worker process:

- the resident size, and glibc's heap statistics (``mallinfo2``): the bytes malloc has handed out
  and not yet got back ("in use", heap and mapped blocks) and the bytes it holds free, so growth
  of the resident size with a flat "in use" is memory the allocator keeps (fragmentation), growth
  of "in use" is memory something holds;
- the entries (and for the profiler, the bytes) of the worker-side records: Dask's worker state
  (tasks, data, actors, the state machine's logs, the transfer logs, the batched stream's message
  record), the worker profiler's history (one tree of sampled call stacks per
  ``distributed.worker.profile.cycle``, kept in two deques of ``low-level-log-length`` entries),
  the fine metrics (``digests_total``), the system monitor, ``dask.utils.key_split``'s cache, the
  model's worker state (steps in flight, mailbox, posts) and the comm monitor's reporter;
- the objects the garbage collector tracks.

After ``--untraced`` batches it starts ``tracemalloc`` (``--frames`` frames) in every worker,
trains ``--first`` batches (so that every bounded record turns over once: an entry made before
tracing and replaced by a traced one reads as growth), takes a snapshot after a full collection,
trains ``--window`` batches (fewer if ``--max-seconds`` runs out first) and prints, per worker,
what grew between the two snapshots by traceback, the largest single blocks held, and the
resident size before and after ``malloc_trim(0)``.

Usage::

    flock /tmp/dasknn-tests.lock timeout 360 python benchmarks/soak_worker_trace.py
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import time
import tracemalloc
from contextlib import ExitStack

import numpy as np
import psutil
from dask.utils import key_split
from machine import describe
from soak import soak_problem
from soak_trace import growth_lines, short_path

from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel.worker_state import ModelState
from dasknn.runtime.cluster import open_client
from dasknn.runtime.measure import TransferReporter

MIB = 2**20
_IGNORE = [tracemalloc.Filter(False, tracemalloc.__file__)]


_MALLINFO2_FIELDS = (
    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
)


def _heap() -> dict[str, float]:
    """glibc's heap in MiB: ``in use`` (allocated and not freed, heap and mapped blocks),
    ``free`` (freed, kept in the heap); empty without glibc's ``mallinfo2``."""
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    # made here: this script's functions travel to the workers pickled, a ctypes class cannot
    fields = [(name, ctypes.c_size_t) for name in _MALLINFO2_FIELDS]
    mallinfo2.restype = type("MallInfo2", (ctypes.Structure,), {"_fields_": fields})
    info = mallinfo2()
    return {"in use": (info.uordblks + info.hblkhd) / MIB, "free": info.fordblks / MIB}


def _deep_size(obj, seen: set[int]) -> int:
    """Bytes of ``obj`` and everything it holds through dicts, lists, tuples and deques (each
    object counted once across calls sharing ``seen``)."""
    stack, total = [obj], 0
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset) or type(item).__name__ == "deque":
            stack.extend(item)
    return total


def _records(dask_worker) -> dict[str, float]:
    """Entries of the worker-side records (see the module docstring); the profiler's in MiB."""
    state = dask_worker.state
    seen: set[int] = set()
    profile = _deep_size(dask_worker.profile_history, seen)
    profile += _deep_size(dask_worker.profile_keys_history, seen)
    sizes = {
        "tasks": len(state.tasks),
        "data": len(dask_worker.data),
        "actors": len(state.actors),
        "state logs": len(state.log) + len(state.stimulus_log),
        "transfer logs": len(dask_worker.transfer_incoming_log)
        + len(dask_worker.transfer_outgoing_log),
        "stream record": len(dask_worker.batched_stream.recent_message_log),
        "profiles": len(dask_worker.profile_history),
        "profile MiB": profile / MIB,
        "digests": len(dask_worker.digests_total),
        "monitor": max(map(len, dask_worker.monitor.quantities.values()), default=0),
        "key_split cache": key_split.cache_info().currsize,
        "gc objects": len(gc.get_objects()),
    }
    for plugin in dask_worker.plugins.values():
        if isinstance(plugin, ModelState):
            sizes["model steps"] = len(plugin.steps)
            sizes["mailbox"] = len(plugin.mailbox)
        elif isinstance(plugin, TransferReporter):
            sizes["fetches"] = len(plugin._senders)
    return sizes


def _sample(dask_worker) -> dict[str, float]:
    """Seconds since the worker started, resident size, heap, traced memory (MiB), records."""
    traced = tracemalloc.get_traced_memory()[0] / MIB if tracemalloc.is_tracing() else 0.0
    rss = psutil.Process(os.getpid()).memory_info().rss / MIB
    up = time.time() - psutil.Process(os.getpid()).create_time()
    return {"s": up, "rss": rss, **_heap(), "traced": traced, **_records(dask_worker)}


def _start(frames: int, dask_worker) -> None:
    gc.collect()
    tracemalloc.start(frames)


def _mark(dask_worker) -> None:
    """Collect and keep a snapshot of the traced allocations held (on ``dask_worker``)."""
    gc.collect()
    dask_worker.soak_snapshot = tracemalloc.take_snapshot().filter_traces(_IGNORE)


def _largest(snapshot: tracemalloc.Snapshot, n: int) -> list[str]:
    """The ``n`` largest single blocks held, with the frame that allocated each."""
    traces = sorted(snapshot.traces, key=lambda trace: trace.size, reverse=True)[:n]
    frames = [trace.traceback[-1] for trace in traces]  # the most recent frame
    return [
        f"    {trace.size:10d} B  {short_path(frame.filename)}:{frame.lineno}"
        for trace, frame in zip(traces, frames, strict=True)
    ]


def _report(top: int, dask_worker) -> dict:
    """Collect, snapshot: what grew since :func:`_mark` by traceback, the largest blocks at
    both points; stop tracing; resident size before and after ``malloc_trim(0)``."""
    gc.collect()
    older = dask_worker.soak_snapshot
    del dask_worker.soak_snapshot
    newer = tracemalloc.take_snapshot().filter_traces(_IGNORE)
    tracemalloc.stop()
    held = [sum(t.size for t in snap.traces) / MIB for snap in (older, newer)]
    lines = [
        f"traced and held: {held[0]:.2f} MiB at the mark, {held[1]:.2f} MiB at the end",
        "grown since the mark (most recent call first):",
        *growth_lines(newer.compare_to(older, "traceback"), top),
        "largest blocks at the mark:",
        *_largest(older, 5),
        "largest blocks at the end:",
        *_largest(newer, 5),
    ]
    del older, newer
    gc.collect()
    rss = psutil.Process(os.getpid()).memory_info().rss / MIB
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    trimmed = psutil.Process(os.getpid()).memory_info().rss / MIB
    lines.append(f"rss {rss:.1f} MiB, {trimmed:.1f} MiB after malloc_trim(0)")
    return {"report": "\n".join(lines)}


def _slope(batches: list[int], values: list[float]) -> float:
    """Least-squares growth of ``values`` (MiB) per 1,000 batches."""
    return float(np.polyfit(np.array(batches) / 1000, np.array(values), 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--untraced", type=int, default=1200, help="batches before tracing")
    parser.add_argument("--warmup", type=int, default=500, help="batches left out of the fits")
    parser.add_argument("--first", type=int, default=200, help="traced batches to the mark")
    parser.add_argument("--window", type=int, default=400, help="traced batches after the mark")
    parser.add_argument("--max-seconds", type=float, default=100.0,
                        help="end the window early after this long")  # fmt: skip
    parser.add_argument("--every", type=int, default=100, help="batches per fit call")
    parser.add_argument("--neurons", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--frames", type=int, default=15)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    if any(n % args.every for n in (args.untraced, args.first, args.window)):
        parser.error("--untraced, --first and --window must be multiples of --every")
    print(describe(), f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', 'unset')}")
    model, x, y, parts = soak_problem(args.neurons, args.layers, args.every * args.batch_size)
    samples: dict[str, list[tuple[int, dict]]] = {}
    with ExitStack() as stack:
        client = open_client(stack, workers=2)  # as benchmarks/soak.py
        with DistributedSparseMLP(model, client, parts) as dist:
            done = 0

            def train(batches: int, limit: float = float("inf")) -> int:
                nonlocal done
                start, trained = time.perf_counter(), 0
                while trained < batches and time.perf_counter() - start < limit:
                    dist.fit(x, y, batch_size=args.batch_size, lr=0.01, progress=False,
                             shuffle=False)  # fmt: skip
                    trained += args.every
                    done += args.every
                    for address, sample in client.run(_sample).items():
                        samples.setdefault(address, []).append((done, sample))
                        print(f"{done:5d} {address.split(':')[-1]} " + " ".join(
                            f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in sample.items()), flush=True)  # fmt: skip
                return trained

            train(args.untraced)
            time.sleep(2)
            client.run(_start, args.frames)
            train(args.first)
            time.sleep(2)
            client.run(_mark)
            window = train(args.window, args.max_seconds)
            time.sleep(2)
            ends = client.run(_report, args.top)
    print(f"\nwindow: {window} traced batches after the mark")
    for address, series in samples.items():
        kept = [(b, s) for b, s in series if b > args.warmup and b <= args.untraced]
        fits = {
            name: _slope([b for b, _ in kept], [s[name] for _, s in kept])
            for name in ("rss", "in use", "free", "profile MiB")
            if kept and name in kept[0][1]
        }
        print(f"\n=== worker {address}: untraced batches {args.warmup}-{args.untraced}, MiB per "
              "1,000 batches: " + ", ".join(f"{k} {v:+.2f}" for k, v in fits.items()))  # fmt: skip
        print(ends[address]["report"])


if __name__ == "__main__":
    main()
