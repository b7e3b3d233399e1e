"""The data-parallel view of a communication report: carried bytes and per-machine traffic."""

from __future__ import annotations

from collections import defaultdict

__all__ = ["machine_bytes", "machine_total", "split_carried"]


def split_carried(table: dict, carried: dict) -> dict:
    """``table`` (``{(variable, phase, sender, receiver): (bytes, messages)}``) with the bytes
    ``carried`` for another variable (``{(variable, phase, sender, receiver, other): bytes}``) moved
    to ``(other, phase, sender, receiver)``, with no message of its own."""
    out = dict(table)
    for (*message, other), nbytes in carried.items():
        message = tuple(message)
        if message in out:
            total, messages = out[message]
            out[message] = (total - nbytes, messages)
            rider_bytes, rider_messages = out.get((other, *message[1:]), (0, 0))
            out[(other, *message[1:])] = (rider_bytes + nbytes, rider_messages)
    return out


def _intra(report, key) -> bool:
    machine_of = report.details["machine_of"]
    return machine_of[key[2]] == machine_of[key[3]]


def machine_total(report, which: str = "measured", scope: str = "all") -> int:
    """Bytes of a data-parallel model's :class:`~dasknn.runtime.comm_report.CommReport`: ``scope``
    ``"all"``, ``"intra"`` (within machines) or ``"inter"`` (across machines)."""
    if scope not in ("all", "intra", "inter"):
        raise ValueError(f"scope must be 'all', 'intra' or 'inter', got {scope!r}")
    table = report.measured if which == "measured" else report.predicted
    return sum(
        b
        for k, (b, _) in table.items()
        if scope == "all" or (scope == "intra") == _intra(report, k)
    )


def machine_bytes(report, which: str = "measured", variable: str | None = None, phases=None):
    """Per machine, the bytes it sent plus received across machines (Kim et al., Table 3)."""
    machine_of = report.details["machine_of"]
    table = report.measured if which == "measured" else report.predicted
    out: dict = defaultdict(int)
    for k, (nbytes, _) in table.items():
        if _intra(report, k) or (variable is not None and k[0] != variable):
            continue
        if phases is not None and k[1] not in phases:
            continue
        out[machine_of[k[2]]] += nbytes
        out[machine_of[k[3]]] += nbytes
    return dict(out)
