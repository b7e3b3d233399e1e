"""Scattering data that the client may give up on: nothing of a scatter given up stays, on the
cluster or on the client, whether its workers take the data later or die first.
See docs/runtime.md, "Waiting with a time limit"."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from distributed import Client, Future

__all__ = ["scatter_released_if_given_up"]


def _release_when_ended(claims: Sequence[Future], scattering: asyncio.Task) -> None:
    """Release the ``claims`` and, if ``scattering`` succeeded, its futures."""
    for claim in claims:
        claim.release()
    if not scattering.cancelled() and scattering.exception() is None:
        for future in scattering.result().values():
            future.release()


async def scatter_released_if_given_up(
    client: Client, data: Mapping[Hashable, Any], **options: Any
) -> dict[Hashable, Future]:
    """``Client.scatter(data, direct=False, **options)`` as a coroutine for
    :func:`~dasknn.runtime.waiting.run_watching`: if it is cancelled, the scatter goes on until
    the scheduler answers and its keys are released then.

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
