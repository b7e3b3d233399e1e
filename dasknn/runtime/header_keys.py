"""Keep the string keys of Dask's serialization headers interned for the life of a process, so
msgpack's interning of them takes no new entries of CPython's interned-string table per message.
Called in the client's process and, through the key-cache plugins, on the scheduler and workers.
See docs/reliability.md, "Long runs: memory (soak)"."""

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
