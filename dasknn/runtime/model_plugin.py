"""The worker plugin that owns a distributed model's state on a worker, one base for every mode.

A mode subclasses :class:`ModelPlugin`, sets its :attr:`~ModelPlugin.kind` and keeps its state
(weights, optimizer state, the values of the steps in flight) on the instance. The model
registers one plugin per model (:meth:`~dasknn.runtime.distributed_model.DistributedModel`
does it) under :meth:`ModelPlugin.plugin_name` of its token, so two models on one cluster never
share state; removing the plugin (the model's ``close()``) drops the state with it. Tasks find
the plugin of their worker with :meth:`ModelPlugin.on_worker`, client calls
(``client.run``) with :func:`call_plugin`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin

from dasknn.exceptions import ModelClosedError

__all__ = ["ModelPlugin", "call_plugin"]


class ModelPlugin(WorkerPlugin):
    """Base of the worker plugin that owns one distributed model's state on a worker.

    Subclasses set :attr:`kind`, create their state in ``setup`` (called when the plugin is
    registered on a worker, and on every worker that joins later) and drop it in ``teardown``
    (called when the plugin is removed or the worker closes).

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
        """The plugin of model ``token`` on ``worker`` (default: the worker running the calling
        task).

        Raises
        ------
        ModelClosedError
            If the worker holds no such plugin (the model was closed, or the worker joined
            after the plugin was removed).
        """
        worker = get_worker() if worker is None else worker
        plugin = worker.plugins.get(cls.plugin_name(token))
        if plugin is None:
            raise ModelClosedError(
                f"worker {worker.address} holds no state of model {token} (closed?)"
            )
        return plugin


def call_plugin(name: str, method: str, *args: Any, dask_worker=None) -> Any:
    """``client.run(call_plugin, name, method, *args)`` body: call ``method(*args)`` of the
    worker plugin registered as ``name`` on the worker running it and return its result
    (``dask_worker`` is passed by Dask)."""
    return getattr(dask_worker.plugins[name], method)(*args)
