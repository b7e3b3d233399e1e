"""Where a model's tasks run: the one ``workers=`` annotation that pins every key to a worker."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial

__all__ = ["KeyPlacement", "by_sender", "same"]


class KeyPlacement:
    """``workers=`` annotation of a graph: key ``key`` runs on ``workers[position(key)]``.

    Dask evaluates a callable annotation once per key; submitted with
    ``allow_other_workers=False`` it pins every task of the graph to its worker.

    Parameters
    ----------
    workers : sequence or mapping of str
        Worker addresses, indexed by what ``position`` returns.
    position : callable
        A picklable function of a key (a module-level function, ``operator.itemgetter`` or a
        ``functools.partial`` of one): the index of its worker in ``workers``.
    """

    def __init__(
        self,
        workers: Sequence[str] | Mapping[Hashable, str],
        position: Callable[[Hashable], Hashable],
    ) -> None:
        self.workers = workers if isinstance(workers, Mapping) else list(workers)
        self.position = position

    def __call__(self, key) -> list[str]:
        return [self.workers[self.position(key)]]


def _sender(parse: Callable, key) -> int:
    return parse(key).sender


def by_sender(parse: Callable) -> Callable[[Hashable], int]:
    """The position function of keys whose parsed form (``parse(key)``, one of the key parsers of
    :mod:`dasknn.runtime.keys`) names a ``sender``: the task runs on its sender."""
    return partial(_sender, parse)


def same(key: Hashable) -> Hashable:
    """The position function of a placement whose ``workers`` is a mapping keyed by the keys."""
    return key
