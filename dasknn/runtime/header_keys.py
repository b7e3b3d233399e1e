"""Keep the string keys of Dask's serialization headers interned for the life of a process.

msgpack interns every string map key it unpacks, and CPython's table of interned strings never
reuses a deleted key's entry, so headers interned afresh per message grow that table until it
is rebuilt larger (a one-time MiB step). :func:`hold_header_keys` keeps :data:`HEADER_KEYS` alive
instead; dasknn calls it in the client's process (:mod:`dasknn.runtime.cluster`) and, through the
key-cache plugins (:mod:`dasknn.runtime.key_cache`), on the scheduler and every worker. It changes
no message. See docs/reliability.md, "Long runs: memory (soak)".
"""

from __future__ import annotations

import sys

__all__ = ["HEADER_KEYS", "held_header_keys", "hold_header_keys"]

#: The string keys of Dask's serialization headers that are not identifiers (not interned).
HEADER_KEYS = (
    "split-num-sub-frames",
    "split-offsets",
    "pickled-obj",
    "num-sub-frames",
    "type-serialized",
    "sub-headers",
    "is-collection",
    "frame-lengths",
    "sub-header",
)

_held: tuple[str, ...] = ()


def hold_header_keys() -> tuple[str, ...]:
    """Intern :data:`HEADER_KEYS` and keep them in this process (idempotent); returns them."""
    global _held
    if not _held:
        _held = tuple(sys.intern(key) for key in HEADER_KEYS)
    return _held


def held_header_keys() -> tuple[str, ...]:
    """The strings :func:`hold_header_keys` keeps in this process (empty before its first call)."""
    return _held
