"""Which strings stay alive in the soak's client/scheduler process, and what fills CPython's table
of interned strings there.

Trains as ``benchmarks/soak.py`` does (P = 2, ``fit`` on 100 batches at a time, on the cluster
and client ``dasknn.runtime.cluster.open_client`` opens; the LocalCluster's scheduler runs in this
process) and, after every ``fit`` call, prints for this process: the resident size,
``sys.getallocatedblocks()``, ``dask.utils.key_split``'s cache, the scheduler's spans, the
entries of their metadata (one per graph a span received) and its computations, and CPython's
dict of interned strings read in place (CPython 3.11: the static ``interned`` of ``libpython``,
found with ``nm``): its live strings (``ma_used``), its slots (``2 ** dk_log2_size``) and the
entries used since it was last rebuilt (``dk_nentries``; a deleted string's entry is not reused,
so the table is rebuilt when the entries reach two thirds of the slots, at three times its live
strings rounded up to a power of two: from 2^17 to 2^18 slots once more than 43,690 strings are
live).

It also prints, after every call, the interned strings alive then that were not at the previous
call, by pattern (digits and hex runs replaced): the interned strings that turn over.

At ``--first`` and ``--second`` batches and at the end it takes a census after a full collection:
every ``str`` referenced by an object the collector tracks, or by an untracked container
(dict, list, tuple, set) below one, with the object that holds it, and every string in the
interned table. From the second census on it prints the strings alive then whose value was not
alive at the first, grouped by holder (type, and for the objects holding most of them the objects
that refer to them), by pattern (digits and hex runs replaced) and by ``key_split``, and how many
of them are interned; the string objects reachable then that were not at the first (new copies of
old values included), by holder; the growth of the objects the collector tracks, by type; and,
for the types ``--follow`` names, how many objects are new since the first census and, for two of
them, the chain of objects that refer to them. The first census keeps only the strings' hashes
and the objects' ids, so it keeps no string alive.

Over ``--watch`` batches after ``--first`` it reads the interned table's entries before and after
every call of ``msgpack.loads`` (msgpack interns the string map keys it unpacks),
``pickle.loads`` (pickle interns the attribute names it restores) and ``sys.intern`` (dask's
``key_split`` interns the prefixes it returns) in this process, wrapped for the window only,
and prints the entries each used and what the calls that used entries inserted (read from the
table's new entries), returned or were given, beside the entries used elsewhere: what uses up the
table. (It records patterns as bytes: a pattern that is the string itself would keep a map key
alive, and a live interned string takes no new entry when it is interned again.)

Usage::

    flock /tmp/dasknn-tests.lock timeout 360 python benchmarks/soak_strings.py
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import pickle
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from contextlib import ExitStack

import msgpack
import psutil
from dask.utils import key_split
from machine import describe
from soak import soak_problem

from dasknn.model_parallel import DistributedSparseMLP
from dasknn.runtime.cluster import open_client

MIB = 2**20
_CONTAINERS = (dict, list, tuple, set, frozenset)
_HEX = re.compile(r"[0-9a-f]{8,}")
_DIGITS = re.compile(r"\d+")
#: Referrers that are this script's own iterations, not holders.
_NOT_HOLDERS = {"frame", "cell", "list_iterator", "dict_valueiterator", "generator"}


def _interned_address() -> int:
    """Address of CPython 3.11's dict of interned strings (``static PyObject *interned`` in
    ``Objects/unicodeobject.c``), from ``libpython``'s symbol table."""
    if sys.version_info[:2] != (3, 11):
        raise RuntimeError(
            f"the interned table is read as laid out in CPython 3.11, not {sys.version}"
        )
    library = next(line.split()[-1] for line in open("/proc/self/maps") if "libpython3" in line)
    symbols = {}
    listing = subprocess.run(["nm", library], capture_output=True, text=True, check=True).stdout
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] in ("interned", "Py_Initialize"):
            symbols[parts[2]] = int(parts[0], 16)
    base = ctypes.cast(ctypes.pythonapi.Py_Initialize, ctypes.c_void_p).value
    base -= symbols["Py_Initialize"]
    return ctypes.c_void_p.from_address(base + symbols["interned"]).value


def _interned_dict(address: int) -> dict:
    return ctypes.cast(address, ctypes.py_object).value


def _table(address: int) -> dict[str, int]:
    """Live strings, slots and entries used of the interned table at ``address``
    (``PyDictObject`` and ``PyDictKeysObject`` of CPython 3.11)."""
    keys = ctypes.c_void_p.from_address(address + 32).value
    return {
        "live": ctypes.c_ssize_t.from_address(address + 16).value,
        "slots": 2 ** ctypes.c_uint8.from_address(keys + 8).value,
        "entries": ctypes.c_ssize_t.from_address(keys + 24).value,
    }


def _inserted(address: int, start: int) -> list[str]:
    """The live strings in the interned table's entries from ``start`` on (the strings inserted
    since the table had ``start`` entries; an entry whose string died is empty). The table's keys
    are all strings (``dk_kind`` 1), so each entry is a key and a value pointer."""
    keys = ctypes.c_void_p.from_address(address + 32).value
    entries = keys + 32 + (1 << ctypes.c_uint8.from_address(keys + 9).value)
    stop = ctypes.c_ssize_t.from_address(keys + 24).value
    inserted = []
    for index in range(start, stop):
        pointer = ctypes.c_void_p.from_address(entries + 16 * index).value
        if pointer:
            inserted.append(ctypes.cast(pointer, ctypes.py_object).value)
    return inserted


def _is_interned(text: str) -> bool:
    """The ``interned`` bits of ``PyASCIIObject.state`` (CPython 3.11, offset 32)."""
    return bool(ctypes.c_uint32.from_address(id(text) + 32).value & 3)


def _sample(address: int, dask_scheduler=None) -> str:
    """This process's sizes; with ``dask_scheduler``, also the scheduler's spans, the entries of
    their metadata's ``collections`` (one per graph a span received) and its computations."""
    table = _table(address)
    rss = psutil.Process(os.getpid()).memory_info().rss / MIB
    text = (
        f"rss {rss:7.1f} MiB  blocks {sys.getallocatedblocks():8d}  key_split cache "
        f"{key_split.cache_info().currsize:5d}  interned: live {table['live']:6d} slots "
        f"{table['slots']:6d} entries {table['entries']:6d}"
    )
    if dask_scheduler is not None:
        spans = dask_scheduler.extensions["spans"].spans.values()
        collections = sum(len((span.metadata or {}).get("collections", ())) for span in spans)
        text += (
            f"  spans {len(spans)} (collections {collections}) "
            f"computations {len(dask_scheduler.computations)}"
        )
    return text


def _pattern(text: str) -> str:
    return _DIGITS.sub("<n>", _HEX.sub("<hex>", text))[:70]


def _holders() -> dict[int, tuple[str, int]]:
    """Every ``str`` referenced by an object the collector tracks, or by an untracked container
    below one: ``{id(str): (str, id(holder))}`` (the first holder found)."""
    found: dict[int, tuple[str, int]] = {}
    seen: set[int] = set()
    tracked = gc.get_objects()
    pending = [(obj, id(obj)) for obj in tracked]
    while pending:
        obj, holder = pending.pop()
        for ref in gc.get_referents(obj):
            if type(ref) is str:
                if id(ref) not in found:
                    found[id(ref)] = (ref, id(obj))
            elif isinstance(ref, _CONTAINERS) and not gc.is_tracked(ref) and id(ref) not in seen:
                seen.add(id(ref))
                pending.append((ref, id(ref)))
    return found


def _describe(obj) -> str:
    name = type(obj).__qualname__
    if isinstance(obj, _CONTAINERS):
        return f"{name} of {len(obj)}"
    return name


def _referrers(obj, exclude: set[int]) -> list[str]:
    """Who refers to ``obj``: the referrers' types, and for a dict the key ``obj`` is under and
    that dict's own referrers."""
    lines = []
    for ref in gc.get_referrers(obj):
        if id(ref) in exclude or type(ref).__name__ == "frame":
            continue
        text = _describe(ref)
        if isinstance(ref, dict):
            key = next((k for k, v in ref.items() if v is obj), None)
            owners = [_describe(o) for o in gc.get_referrers(ref) if id(o) not in exclude]
            text += f"[{key!r}] of {', '.join(owners[:3]) or 'nothing tracked'}"
        lines.append(text)
    return lines[:4]


def _census(name: str, top: int, follow: list[str], address: int, dask_scheduler) -> str:
    """Take a census; the first one keeps the hashes of the strings alive, later ones print the
    strings alive now whose value was not alive at the first, grouped."""
    gc.collect()
    found = _holders()
    interned = {id(text): text for text in _interned_dict(address)}
    reachable_interned = sum(_is_interned(text) for text, _ in found.values())
    head = (
        f"=== census at {name}: {len(found)} strings reachable ({reachable_interned} interned), "
        f"{len(interned)} interned in all; {_sample(address)}"
    )
    types = Counter(type(obj).__qualname__ for obj in gc.get_objects())
    first = getattr(dask_scheduler, "strings_first", None)
    if first is None:
        dask_scheduler.strings_first = frozenset(hash(s) for s, _ in found.values()) | frozenset(
            hash(s) for s in interned.values()
        )
        dask_scheduler.strings_types = types
        dask_scheduler.strings_ids = frozenset(found)
        dask_scheduler.strings_followed = frozenset(
            id(obj) for obj in gc.get_objects() if type(obj).__qualname__ in follow
        )
        return head
    types.subtract(dask_scheduler.strings_types)
    copies = [(s, h) for i, (s, h) in found.items() if i not in dask_scheduler.strings_ids]
    new = {i: (s, h) for i, (s, h) in found.items() if hash(s) not in first}
    unreached = [s for i, s in interned.items() if i not in found and hash(s) not in first]
    by_holder: Counter = Counter()
    by_object: Counter = Counter()
    by_pattern: Counter = Counter()
    by_prefix: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    objects = {id(obj): obj for obj in gc.get_objects()}
    untracked, parents = {}, {}
    for obj in list(objects.values()):
        for ref in gc.get_referents(obj):
            if isinstance(ref, _CONTAINERS) and not gc.is_tracked(ref):
                untracked.setdefault(id(ref), ref)
                parents.setdefault(id(ref), obj)

    def where(holder: int) -> str:
        if holder in objects:
            return _describe(objects[holder]).split(" of ")[0]
        inner, outer = untracked.get(holder), parents.get(holder)
        return f"untracked {type(inner).__qualname__} in {type(outer).__qualname__}"

    copies_by_holder = Counter(f"{where(h)}: {_pattern(s)[:40]!r}" for s, h in copies)
    for text, holder in new.values():
        kind = "interned" if _is_interned(text) else "not interned"
        by_holder[f"{where(holder)} ({kind})"] += 1
        by_object[holder] += 1
        pattern = _pattern(text)
        by_pattern[pattern] += 1
        if len(examples[pattern]) < 2:
            examples[pattern].append(text[:60])
        by_prefix[key_split(text)] += 1
    alive = {hash(s) for s, _ in found.values()} | {hash(s) for s in interned.values()}
    lines = [
        head,
        f"alive now, not alive at the first census: {len(new)} reachable strings "
        f"({sum(_is_interned(s) for s, _ in new.values())} interned, "
        f"{sum(sys.getsizeof(s) for s, _ in new.values()) / MIB:.2f} MiB), and {len(unreached)} "
        f"interned strings no tracked object refers to; gone since the first: "
        f"{len(first - alive)}",
        "by holder:",
        *(f"  {n:7d}  {where}" for where, n in by_holder.most_common(top)),
        "by pattern:",
        *(f"  {n:7d}  {p!r}  e.g. {examples[p]}" for p, n in by_pattern.most_common(top)),
        "by key_split:",
        *(f"  {n:7d}  {p[:60]!r}" for p, n in by_prefix.most_common(top)),
        "interned, held by no tracked object, by pattern:",
        *(f"  {n:7d}  {p!r}" for p, n in Counter(map(_pattern, unreached)).most_common(top)),
        "objects tracked by the collector, by type, grown since the first census: "
        + ", ".join(f"{name} {n:+d}" for name, n in types.most_common(top)),
        f"string objects reachable now that were not at the first census (new copies of old "
        f"values included): {len(copies)}, by holder and pattern:",
        *(f"  {n:7d}  {w}" for w, n in copies_by_holder.most_common(top)),
        "objects holding most new strings, and who refers to them:",
    ]
    exclude = {id(found), id(new), id(objects), id(untracked), id(parents), id(interned)}
    for holder, n in by_object.most_common(min(top, 6)):
        obj = objects[holder] if holder in objects else untracked.get(holder)
        lines.append(f"  {n:7d}  {_describe(obj)}: {'; '.join(_referrers(obj, exclude))}")
    followed = [
        obj
        for obj in objects.values()
        if type(obj).__qualname__ in follow and id(obj) not in dask_scheduler.strings_followed
    ]
    exclude.add(id(followed))
    for name in follow:
        sample = [obj for obj in followed if type(obj).__qualname__ == name]
        lines.append(f"new {name} since the first census: {len(sample)}; who holds two of them:")
        for index in range(min(2, len(sample))):  # no slice: it would refer to the objects
            lines.append(f"    {' <- '.join(_chain(sample[index], exclude | {id(sample)}))}")
    return "\n".join(lines)


def _chain(obj, exclude: set[int], depth: int = 6) -> list[str]:
    """``obj`` and its first referrer, that one's first referrer, ... (``depth`` levels), each
    described by type (and for a dict, the key it holds the previous one under)."""
    chain = [_describe(obj)]
    seen = {id(obj)}
    for _ in range(depth):
        refs = [
            ref
            for ref in gc.get_referrers(obj)
            if id(ref) not in exclude
            and id(ref) not in seen
            and type(ref).__name__ not in _NOT_HOLDERS
            and not (isinstance(ref, list) and len(ref) > 100_000)  # a gc.get_objects() list
        ]
        if not refs:
            break
        ref = min(refs, key=lambda r: isinstance(r, list | tuple | set))  # others first
        text = _describe(ref)
        if isinstance(ref, dict):
            text += f"[{next((k for k, v in ref.items() if v is obj), None)!r}]"
        chain.append(text + (f" (+{len(refs) - 1} more)" if len(refs) > 1 else ""))
        seen.update((id(ref), id(refs)))
        obj = ref
    return chain


def _watch_start(address: int, dask_scheduler) -> str:
    """From now, read the interned table's entries used before and after every call of
    ``msgpack.loads``, ``pickle.loads`` and ``sys.intern`` in this process, and record what each
    call that used entries was given or returned (by pattern)."""
    used: Counter = Counter()
    calls: Counter = Counter()
    what: Counter = Counter()
    originals = {"msgpack.loads": (msgpack, msgpack.loads), "pickle.loads": (pickle, pickle.loads)}
    originals["sys.intern"] = (sys, sys.intern)

    def watched(name, original):
        def call(*args, **kwargs):
            before = _table(address)["entries"]
            result = original(*args, **kwargs)
            after = _table(address)["entries"]
            if after != before:
                delta = after - before if after > before else 0  # a rebuild restarts the count
                used[name] += delta
                calls[name] += 1
                if name == "msgpack.loads" and after > before:
                    what.update(
                        (name, _pattern(text).encode()) for text in _inserted(address, before)
                    )
                elif name == "pickle.loads":
                    what[(name, type(result).__qualname__.encode())] += delta
                else:
                    what[(name, _pattern(args[0]).encode())] += delta
            return result

        return call

    for name, (module, original) in originals.items():
        setattr(module, name.split(".")[1], watched(name, original))
    dask_scheduler.strings_watch = (originals, used, calls, what, _table(address)["entries"])
    return _sample(address)


def _watch_stop(top: int, address: int, dask_scheduler) -> str:
    originals, used, calls, what, entries = dask_scheduler.strings_watch
    for name, (module, original) in originals.items():
        setattr(module, name.split(".")[1], original)
    del dask_scheduler.strings_watch
    total = _table(address)["entries"] - entries
    return "\n".join(
        [
            f"=== the watched window: the interned table used {total} entries; "
            + ", ".join(f"{used[n]} in {calls[n]} calls of {n}" for n in originals)
            + f", {total - sum(used.values())} elsewhere",
            "what those calls were given (sys.intern: entries by pattern), returned (pickle.loads:"
            " entries by type) or inserted (msgpack.loads: entries by pattern of the string):",
            *(f"  {n:7d}  {name:14s} {p.decode()!r}" for (name, p), n in what.most_common(top)),
        ]
    )


def _turnover(top: int, address: int, dask_scheduler) -> str:
    """Interned strings alive now that were not at the previous call, by pattern."""
    now = {hash(text): text for text in _interned_dict(address)}
    before = getattr(dask_scheduler, "strings_interned", None)
    dask_scheduler.strings_interned = frozenset(now)
    if before is None:
        return ""
    new = Counter(_pattern(text) for h, text in now.items() if h not in before)
    return f"  new interned alive {sum(new.values())}: " + ", ".join(
        f"{n} {p!r}" for p, n in new.most_common(top)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100, help="batches per fit call")
    parser.add_argument("--first", type=int, default=500, help="batches before the first census")
    parser.add_argument("--second", type=int, default=1500)
    parser.add_argument(
        "--watch", type=int, default=500, help="batches of watched interning calls after --first"
    )
    parser.add_argument("--neurons", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument(
        "--follow",
        default="PartPlacement,StepPriority,UUID,TaskGroup,method,defaultdict",
        help="types whose new objects (since the first census) are shown with who holds them",
    )
    args = parser.parse_args()
    print(describe(), sys.version.split()[0])
    model, x, y, parts = soak_problem(args.neurons, args.layers, args.every * args.batch_size)
    with ExitStack() as stack:
        client = open_client(stack, workers=2)  # as benchmarks/soak.py
        if client.run_on_scheduler(os.getpid) != os.getpid():
            raise RuntimeError("the scheduler must run in this process (a LocalCluster)")
        address = _interned_address()
        with DistributedSparseMLP(model, client, parts) as dist:
            print(f"     0 batches  {client.run_on_scheduler(_sample, address)}", flush=True)
            done, start = 0, time.perf_counter()
            while done < args.batches:
                dist.fit(x, y, batch_size=args.batch_size, lr=0.01, progress=False, shuffle=False)
                done += args.every
                print(
                    f"{done:6d} batches {time.perf_counter() - start:6.1f} s  "
                    f"{client.run_on_scheduler(_sample, address)}",
                    flush=True,
                )
                print(client.run_on_scheduler(_turnover, 3, address), flush=True)
                if done in (args.first, args.second) or done >= args.batches:
                    time.sleep(2)  # the futures of the last call released
                    print(
                        client.run_on_scheduler(
                            _census, f"{done} batches", args.top, args.follow.split(","), address
                        ),
                        flush=True,
                    )
                if done == args.first and args.watch:
                    sample = client.run_on_scheduler(_watch_start, address)
                    print(f"watching msgpack map keys: {sample}")
                if args.watch and done == args.first + args.watch:
                    print(client.run_on_scheduler(_watch_stop, args.top, address), flush=True)


if __name__ == "__main__":
    main()
