"""Keep the string keys of Dask's serialization headers interned for the life of a process.

msgpack interns every string map key it unpacks (``PyUnicode_InternInPlace``), and every message
Dask reads carries serialization headers whose keys are strings such as ``"type-serialized"`` or
``"split-offsets"``. Dask holds none of these strings between messages (as constants in its code
they are not interned: they are not identifiers), so each message interns them afresh and frees
them again. CPython's dict of interned strings never reuses the entry of a deleted key: each
such key takes a new entry, about 11 a training step in the model-parallel soak, until the table
is full and rebuilt larger. Without the held keys, the soak's client/scheduler process reaches
that rebuild between batches 1,400 and 1,500, and it adds about 1.9 MiB at once (a table of 2^18
slots, 3.67 MiB, for one of 2^17), which reads as growth over a 2,000-batch soak
(``docs/reliability.md``, ``## Long runs: memory (soak)``).

:func:`hold_header_keys` interns :data:`HEADER_KEYS` and keeps them in this module: a key msgpack
unpacks then finds the live interned string and takes no new entry. dasknn calls it in every
process where it talks to Dask: the client's (:mod:`dasknn.runtime.cluster`, where the local
cluster's scheduler runs too) and, through the key-cache plugins every distributed model installs
(:mod:`dasknn.runtime.key_cache`), the scheduler's and every worker's. It changes no message and
no result. If Dask renames a key, the held string is merely unused (a few hundred bytes in all)
and the renamed one is interned afresh per message.
"""

from __future__ import annotations

import sys

__all__ = ["HEADER_KEYS", "held_header_keys", "hold_header_keys"]

#: The string keys of Dask's serialization headers (``distributed.protocol``, 2025-2026) that are
#: not Python identifiers, so nothing else keeps them interned.
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
    """Intern :data:`HEADER_KEYS` and keep them alive in this process (idempotent); returns the
    held strings."""
    global _held
    if not _held:
        _held = tuple(sys.intern(key) for key in HEADER_KEYS)
    return _held


def held_header_keys() -> tuple[str, ...]:
    """The strings :func:`hold_header_keys` keeps in this process (empty before its first call)."""
    return _held
