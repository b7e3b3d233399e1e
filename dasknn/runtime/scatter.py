"""Scattering data that the client may give up on: nothing of a scatter given up stays, on the
cluster or on the client, whether its workers take the data later or die first.

Dask's scheduler completes a ``Client.scatter`` the client has given up on: ``Scheduler.scatter``
waits for the workers' ``update_data`` (a worker stopped with ``SIGSTOP`` answers when it goes
on) and then registers the keys for the client (``Scheduler.update_data`` calls
``client_desires_keys``), however long ago the client cancelled its call. The client, holding no
future of those keys, never releases them, and they stay on the scheduler and the worker until
the client closes; a release sent before the registration is dropped by the scheduler (it knows
no such key yet). Here a caller that gives up does not cancel the client's call to the
scheduler, only its wait for it (``asyncio.shield``): the call goes on on the client's event loop
until the scheduler answers. Its futures are released then, or if the scheduler's scatter failed
(a worker that died, or that the scheduler removed, closes the scheduler's connection to it: the
scatter fails with ``CommClosedError`` at once, before any key is registered) nothing is left to
release. The client also holds a future of every key from before the scatter starts, released
when the call ends, so that a key the scheduler registered before its scatter failed (a
``broadcast`` whose copies failed) is released too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from distributed import Client, Future

__all__ = ["scatter_released_if_given_up"]


def _release_when_ended(claims: Sequence[Future], scattering: asyncio.Task) -> None:
    """Release the ``claims`` and, if the scatter ``scattering`` succeeded, its futures (the
    done-callback of a scatter whose caller did not take its result)."""
    for claim in claims:
        claim.release()
    if not scattering.cancelled() and scattering.exception() is None:
        for future in scattering.result().values():
            future.release()


async def scatter_released_if_given_up(
    client: Client, data: Mapping[Hashable, Any], **options: Any
) -> dict[Hashable, Future]:
    """``Client.scatter(data, direct=False, **options)`` as a coroutine of the synchronous
    ``client``, for :func:`~dasknn.runtime.waiting.run_watching` and
    :func:`~dasknn.runtime.waiting.run_naming_loss`: if the coroutine is cancelled (given up),
    the scatter goes on until the scheduler answers, and its keys are released then.

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
    for good, unknown to the scheduler. A scatter given up at a worker that does not answer
    (stopped) stays on the client's event loop, with its futures, until that worker goes on,
    dies or is removed.
    """
    claims = [Future(key, client) for key in data]
    scattering = asyncio.ensure_future(
        client.scatter(dict(data), direct=False, asynchronous=True, **options)
    )
    try:
        scattered = await asyncio.shield(scattering)
    except BaseException:
        scattering.add_done_callback(lambda ended: _release_when_ended(claims, ended))
        raise
    for claim in claims:
        claim.release()
    return scattered
