"""What an emptied ``dask.utils.key_split`` cache costs: the time of one call on a key the cache
holds (a hit) and on one it does not (a miss, the prefix computed again), and the time of
emptying a full cache, for the keys ``dasknn.runtime.key_cache`` bounds (step keys of the
model-parallel trainer) and for Dask's usual key shapes.

Usage::

    flock /tmp/dasknn-tests.lock python benchmarks/key_split_cost.py [--keys 1000]
"""

from __future__ import annotations

import argparse
import time
import uuid

from dask.utils import key_split
from machine import describe

from dasknn.runtime.keys import new_token, phase_names, step_key


def _key_sets(n: int) -> dict[str, list]:
    """``n`` distinct keys of each shape."""
    name = phase_names(new_token())["run"]
    hex_name = f"getitem-{uuid.uuid4().hex}"
    return {
        "step key (tuple)": [step_key(name, i, 1, 0, -1, 0) for i in range(n)],
        "dask tuple key": [(hex_name, i) for i in range(n)],
        "dask string key": [f"inc-{uuid.uuid4().hex}" for _ in range(n)],
    }


def _per_call_us(keys: list, clear_first: bool, repeats: int) -> float:
    """Best mean time of one ``key_split`` call over ``keys`` in microseconds."""
    best = float("inf")
    for _ in range(repeats):
        if clear_first:
            key_split.cache_clear()
        else:
            for key in keys:
                key_split(key)
        start = time.perf_counter()
        for key in keys:
            key_split(key)
        best = min(best, (time.perf_counter() - start) / len(keys))
    return best * 1e6


def _clear_us(keys: list, repeats: int) -> float:
    """Best time of emptying a cache that holds ``keys``, in microseconds."""
    best = float("inf")
    for _ in range(repeats):
        key_split.cache_clear()
        for key in keys:
            key_split(key)
        start = time.perf_counter()
        key_split.cache_clear()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys per shape")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(describe())
    print(f"{args.keys} distinct keys each, best of {args.repeats}:")
    for shape, keys in _key_sets(args.keys).items():
        hit = _per_call_us(keys, clear_first=False, repeats=args.repeats)
        miss = _per_call_us(keys, clear_first=True, repeats=args.repeats)
        clear = _clear_us(keys, args.repeats)
        print(f"  {shape:18s} hit {hit:6.3f} us  miss {miss:6.3f} us  (+{miss - hit:.3f} us a "
              f"recomputed prefix)  emptying {args.keys} entries {clear:7.1f} us")  # fmt: skip


if __name__ == "__main__":
    main()
