"""Dask's serialization header keys held interned: the keys msgpack unpacks from Dask's messages
are the held strings (so they take no new entry of CPython's interned-string table), in the
client's process and, once a model's key-cache plugins are installed, in every worker's."""

from __future__ import annotations

import uuid

import msgpack
import numpy as np
from distributed.protocol import ToPickle, dumps, to_serialize

from dasknn.runtime.header_keys import HEADER_KEYS, held_header_keys, hold_header_keys
from dasknn.runtime.key_cache import install_key_cache_bound, remove_key_cache_bound


class _Opaque:
    """An object Dask serializes with pickle."""

    def __init__(self, value: int) -> None:
        self.value = value


def _map_keys(value, found: list) -> None:
    """Every string map key inside the unpacked msgpack ``value``, in ``found``."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                found.append(key)
            _map_keys(item, found)
    elif isinstance(value, list | tuple):
        for item in value:
            _map_keys(item, found)


def _unpacked_header_keys() -> list[str]:
    """The string map keys msgpack returns for the frames of a real Dask message carrying a
    numpy array, a large one (split frames), a collection and pickled objects."""
    message = {
        "op": "test",
        "array": to_serialize(np.arange(10.0)),
        "large": to_serialize(np.ones(2**20)),
        "collection": to_serialize([np.ones(3), _Opaque(1)]),
        "pickled": to_serialize(_Opaque(2)),
        "to_pickle": ToPickle(_Opaque(3)),
    }
    found: list[str] = []
    for frame in dumps(message):
        try:
            unpacked = msgpack.unpackb(bytes(frame), raw=False, strict_map_key=False)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            continue  # a data frame, not a header
        _map_keys(unpacked, found)
    return found


def test_unpacked_header_keys_are_the_held_strings():
    held = hold_header_keys()
    assert held == HEADER_KEYS and held is held_header_keys()
    keys = _unpacked_header_keys()
    non_identifiers = {key for key in keys if not key.isidentifier()}
    # Every non-identifier key of Dask's headers is held (a new one of a later Dask shows here),
    # and the message used most of them.
    assert non_identifiers <= set(HEADER_KEYS), non_identifiers - set(HEADER_KEYS)
    assert len(non_identifiers) >= 7, non_identifiers
    by_value = {key: key for key in held}
    for key in keys:
        if key in by_value:
            assert key is by_value[key], key  # the interned, held object: no new table entry


def _holds_unpacked_keys(dask_worker=None, dask_scheduler=None) -> bool:
    """Whether this process holds the header keys and msgpack returns the held objects."""
    from dasknn.runtime.header_keys import held_header_keys

    held = held_header_keys()
    packed = msgpack.packb(dict.fromkeys(HEADER_KEYS, 0))
    unpacked = list(msgpack.unpackb(packed))
    return bool(held) and all(a is b for a, b in zip(unpacked, held, strict=True))


def test_model_plugins_hold_the_keys_on_the_scheduler_and_every_worker(dask_client):
    token = uuid.uuid4().hex[:16]
    install_key_cache_bound(dask_client, token)
    try:
        assert dask_client.run_on_scheduler(_holds_unpacked_keys)
        assert all(dask_client.run(_holds_unpacked_keys).values())
    finally:
        remove_key_cache_bound(dask_client, token)

