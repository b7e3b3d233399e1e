"""The life of a distributed model whose state on the workers one worker plugin owns.

The transfer monitor is held for the model (:mod:`dasknn.runtime.shared_plugins`), the bound on
Dask's key cache (:mod:`dasknn.runtime.key_cache`) installed and the plugin registered before the
model's values are placed; if placing them fails the model is closed again (the plugin and
everything it holds removed), and a ``with`` block closes the model at its end. Closing removes
the plugin, the bound and the model's hold on the monitor, which leaves with its last holder,
waiting for the workers at most ``step_timeout`` in all (:func:`unregister_within`, also used by
:class:`~dasknn.model_parallel.DistributedSparseMLP`, which installs its plugins itself).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Self

from dasknn.runtime.key_cache import install_key_cache_bound, remove_key_cache_bound
from dasknn.runtime.measure import install_comm_monitor, release_comm_monitor
from dasknn.runtime.waiting import call_at_most

__all__ = ["PluginOwner", "unregister_within"]


class PluginOwner:
    """Base of a distributed model that owns one worker plugin.

    A subclass sets ``client``, ``token``, ``plugin_name`` and ``step_timeout`` (seconds
    :meth:`_unregister` waits for the workers) and implements :meth:`close`,
    which calls :meth:`_unregister` while ``_open`` is true and does nothing after that.
    """

    client: Any
    token: str
    plugin_name: str
    step_timeout: float
    _open: bool = False

    def _register(self, plugin, place: Callable[[], None]) -> None:
        """Install the transfer monitor and the key-cache bound, register ``plugin`` on every
        worker under ``plugin_name``, then call ``place()``; close the model if it raises."""
        install_comm_monitor(self.client, self.token)
        try:
            install_key_cache_bound(self.client, self.token)
            try:
                self.client.register_plugin(plugin, name=self.plugin_name)
            except BaseException:
                remove_key_cache_bound(self.client, self.token)
                raise
        except BaseException:
            release_comm_monitor(self.client, self.token)
            raise
        self._open = True
        try:
            place()
        except BaseException:
            self.close()
            raise

    def _unregister(self, plugins: Sequence[str] = ()) -> None:
        """Remove the worker ``plugins`` (others the model registered), the plugin (with the
        state it owns), the key-cache bound and the model's hold on the transfer monitor, waiting
        for the workers at most ``step_timeout`` seconds in all (:func:`unregister_within`)."""
        unregister_within(self.client, self.token, [*plugins, self.plugin_name], self.step_timeout)

    def close(self) -> None:
        """Remove the plugin (with the state it owns); closing twice does nothing."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def unregister_within(
    client, token: str, plugins: Sequence[str], seconds: float, key_cache_bound: bool = True
) -> None:
    """Remove a model's worker ``plugins`` (in order), its key-cache bound (``key_cache_bound``)
    and its hold on the transfer monitor (the monitor goes with its last holder), waiting for
    the workers at most ``seconds`` in all.

    A worker that does not answer (stopped) is left to the scheduler, which removes them there
    when it goes on, or drops them with the worker (:func:`~dasknn.runtime.waiting.call_at_most`).
    The bound and the hold are removed also when a plugin's removal failed.
    """
    deadline = time.monotonic() + seconds

    def left() -> float:
        return max(deadline - time.monotonic(), 0.0)

    try:
        for name in plugins:
            call_at_most(lambda name=name: client.unregister_worker_plugin(name), left())
    finally:
        try:
            if key_cache_bound:
                remove_key_cache_bound(client, token, left())
        finally:
            release_comm_monitor(client, token, left())
