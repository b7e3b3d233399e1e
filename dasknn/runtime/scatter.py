"""Scattering data that the client may give up on: the scattered keys leave the cluster once the
scheduler registers them, also when that happens after the client stopped waiting.

Dask's scheduler completes a ``Client.scatter`` the client has given up on: ``Scheduler.scatter``
waits for the workers' ``update_data`` (a worker stopped with ``SIGSTOP`` answers when it goes
on) and then registers the keys for the client (``Scheduler.update_data`` calls
``client_desires_keys``), however long ago the client cancelled its call. The client, holding no
future of those keys, never releases them, and they stay on the scheduler and the worker until
the client closes; a release sent before the registration is dropped by the scheduler (it knows
no such key yet). Here the client holds a future of every key from before the scatter starts:
the scheduler's registration finishes it (the ``key-in-memory`` report a client gets for a key
it wants), and a future whose scatter was given up releases its key then.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from distributed import Client, Future

__all__ = ["scatter_released_if_given_up"]


def _release(future: Future) -> None:
    """Release ``future``'s key (a done-callback)."""
    future.release()


async def scatter_released_if_given_up(
    client: Client, data: Mapping[Hashable, Any], **options: Any
) -> dict[Hashable, Future]:
    """``Client.scatter(data, direct=False, **options)`` as a coroutine of the synchronous
    ``client``, for :func:`~dasknn.runtime.waiting.run_watching` and
    :func:`~dasknn.runtime.waiting.run_naming_loss`: if the call is cancelled (given up) or fails,
    each key is released as soon as the scheduler registers it.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client.
    data : mapping
        The values by their keys (keys no future of ``client`` holds yet).
    **options
        ``Client.scatter``'s ``workers`` and ``broadcast``.

    Returns
    -------
    dict
        The future of every key.

    Notes
    -----
    The scatter goes through the scheduler (``direct=False``, whatever the client's
    ``direct_to_workers``): a direct scatter sends the data to the workers itself and tells the
    scheduler only afterwards, so a worker that takes the data after the client gave up keeps it
    for good, unknown to the scheduler. A scatter whose worker dies before taking the data is
    never registered: its future then stays pending on the client (no key on the cluster) until
    the client closes.
    """
    claims = [Future(key, client) for key in data]
    try:
        scattered = await client.scatter(dict(data), direct=False, asynchronous=True, **options)
    except BaseException:
        for claim in claims:
            claim.add_done_callback(_release)
        raise
    for claim in claims:
        claim.release()
    return scattered
