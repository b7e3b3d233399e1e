"""Scheduler plugins the models on one cluster share (the transfer monitor, the retirement
watch), held per model token and removed with their last holder; one held without a user stays."""

from __future__ import annotations

__all__ = ["hold_scheduler_plugin", "release_scheduler_plugin"]

#: The user a plugin is held for when installed without a model: never released.
FOR_EVER = None


def _add_user(dask_scheduler, name: str, user) -> None:
    plugin = dask_scheduler.plugins[name]
    plugin.users = getattr(plugin, "users", set()) | {user}


def _drop_user(dask_scheduler, name: str, user) -> bool:
    plugin = dask_scheduler.plugins.get(name)
    if plugin is None:
        return False
    users = getattr(plugin, "users", {FOR_EVER}) - {user}
    plugin.users = users
    if users:
        return False
    dask_scheduler.remove_plugin(name=name)
    return True


def hold_scheduler_plugin(client, plugin, name: str, user: str | None = FOR_EVER) -> None:
    """Register ``plugin`` under ``name`` (one already there is kept) held for ``user``.

    Parameters
    ----------
    client : distributed.Client
    plugin : distributed.diagnostics.plugin.SchedulerPlugin
        With ``idempotent = True``.
    name : str
    user : str or None
        The token of the model that uses it; ``None`` keeps it for the cluster's life.
    """
    client.register_plugin(plugin, name=name)
    client.run_on_scheduler(_add_user, name=name, user=user)


def release_scheduler_plugin(client, name: str, user: str) -> bool:
    """Drop ``user`` from the holders of the plugin ``name``; remove the plugin if none is left.

    Parameters
    ----------
    client, name, user
        As for :func:`hold_scheduler_plugin`.

    Returns
    -------
    bool
        Whether the plugin was removed (it had no other holder).
    """
    return client.run_on_scheduler(_drop_user, name=name, user=user)
