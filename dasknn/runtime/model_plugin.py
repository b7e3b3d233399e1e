"""The worker plugin that owns a distributed model's state on a worker, one base for every mode:
one plugin per model (named by its token), removed with its state by ``close()``."""

from __future__ import annotations

from typing import Any, ClassVar, Self

from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin

from dasknn.exceptions import ModelClosedError

__all__ = ["ModelPlugin", "call_plugin"]


class ModelPlugin(WorkerPlugin):
    """Base of the worker plugin that owns one distributed model's state on a worker.

    Subclasses set :attr:`kind`, create their state in ``setup`` and drop it in ``teardown``.

    Parameters
    ----------
    token : str
        The model's token; the plugin is registered as ``plugin_name(token)``.
    """

    #: The mode's short name, part of the plugin's name (``"model"``, ``"dp"``, ...).
    kind: ClassVar[str] = ""

    def __init__(self, token: str) -> None:
        self.token = token
        self.name = self.plugin_name(token)

    @classmethod
    def plugin_name(cls, token: str) -> str:
        """The name the plugin of model ``token`` is registered under on every worker."""
        return f"dasknn-{cls.kind}-{token}"

    @classmethod
    def on_worker(cls, token: str, worker=None) -> Self:
        """The plugin of model ``token`` on ``worker`` (default: the calling task's worker).

        Raises
        ------
        ModelClosedError
            If the worker holds no such plugin (the model was closed).
        """
        worker = get_worker() if worker is None else worker
        plugin = worker.plugins.get(cls.plugin_name(token))
        if plugin is None:
            raise ModelClosedError(
                f"worker {worker.address} holds no state of model {token} (closed?)"
            )
        return plugin


def call_plugin(name: str, method: str, *args: Any, dask_worker=None) -> Any:
    """``client.run`` body: ``method(*args)`` of the worker plugin ``name``."""
    return getattr(dask_worker.plugins[name], method)(*args)
