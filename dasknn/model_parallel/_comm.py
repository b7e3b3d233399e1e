"""Predicted traffic and the wire bytes Dask logged (see docs/training.md, Communication volume)."""

from __future__ import annotations

from collections.abc import Sequence

from dasknn.model_parallel._plan import CommPlan
from dasknn.runtime.comm_report import Key
from dasknn.runtime.keys import message_phase

__all__ = ["SOFTMAX_ITEMSIZE", "SOFTMAX_PART_ROWS", "predicted_counts", "wire_bytes"]

#: Rows of a part's softmax statistics per sample (peak, sum of exponentials, target sum).
SOFTMAX_PART_ROWS = 3
#: Bytes of one value of the softmax statistics (float64 whatever the model's dtype).
SOFTMAX_ITEMSIZE = 8


def predicted_counts(
    plan: CommPlan, part_workers: Sequence[str], batch: int, itemsize: int, backward: bool,
    microbatches: int = 1, posted: bool = False, softmax: bool = False,
) -> dict[Key, tuple[int, int]]:  # fmt: skip
    """``{(layer, phase, sender, receiver): (bytes, messages)}`` between workers for one batch of
    ``batch`` rows in ``microbatches`` blocks (``backward``: a training step).

    Forward, layer ``k``: every message ``(m, n, words)`` of ``plan.messages(k)`` between workers
    carries ``words * batch * itemsize`` bytes from ``m``'s worker to ``n``'s; backward (``k >= 2``)
    the same bytes go back. Messages: one per block and part pair with ``posted``, else one per
    block, sending part and receiving worker. ``softmax``: every part on a worker other than part
    0's sends ``3 * batch`` float64 statistics there (phase ``"other"`` of layer ``L``), which sends
    ``2 * batch`` back to every other worker, a message per block each.
    """
    out: dict[Key, list[int]] = {}

    def add(key: Key, nbytes: int, messages: int) -> None:
        row = out.setdefault(key, [0, 0])
        row[0] += nbytes
        row[1] += messages

    L = plan.n_layers
    for k in range(1, L + 1):
        senders, returners = set(), set()
        for m, n, words in plan.messages(k):
            wm, wn = part_workers[m], part_workers[n]
            if wm == wn:
                continue
            nbytes = words * batch * itemsize
            first = posted or (m, wn) not in senders
            senders.add((m, wn))
            add((k, "forward", wm, wn), nbytes, microbatches if first else 0)
            if backward and k >= 2:
                first = posted or (n, wm) not in returners
                returners.add((n, wm))
                add((k, "backward", wn, wm), nbytes, microbatches if first else 0)
    if softmax:
        root, part_stats = part_workers[0], SOFTMAX_PART_ROWS * batch * SOFTMAX_ITEMSIZE
        for w in part_workers:
            if w != root:
                add((L, "other", w, root), part_stats, microbatches)
        for w in sorted(set(part_workers) - {root}):
            add((L, "other", root, w), 2 * batch * SOFTMAX_ITEMSIZE, microbatches)
    return {key: (b, m) for key, (b, m) in out.items()}


def _outgoing_log(dask_worker, token, first_step):
    """``(messages, payload, wire bytes)`` of each logged transfer of the model from a step on."""
    entries = []
    for entry in dask_worker.transfer_outgoing_log:
        if entry.get("who") is None:
            continue
        keys = [
            key for key in entry["keys"] if (parsed := message_phase(key)) and parsed[0] == token
        ]
        if keys and all(key[1] >= first_step for key in keys):
            entries.append((len(keys), int(entry["total"]), int(entry["compressed"])))
    return entries


def wire_bytes(client, token: str, first_step: int) -> tuple[int, int, int]:
    """``(messages, payload bytes, wire bytes)`` of a model's messages from step ``first_step`` on,
    as the sending workers logged them (their logs keep only the most recent transfers)."""
    logs = client.run(_outgoing_log, token=token, first_step=first_step)
    entries = [entry for worker in logs.values() for entry in worker]
    return tuple(sum(column) for column in zip(*entries, strict=True)) if entries else (0, 0, 0)
