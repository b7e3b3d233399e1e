"""Checkpoints of a ``fit`` call: where a run stands, written to and found in a directory.

A checkpoint is a model file whose header also holds the :class:`Progress` of the ``fit`` call
that wrote it: the call's arguments and a digest of its data
(so a resume with other data or other batches is refused), the epoch and batch reached, the loss
summed so far in that epoch and the model's loss curves. ``fit(..., checkpoint=DIR)`` writes
``DIR/checkpoint-{batches:09d}.npz`` atomically and then removes the older ones, so the directory
always holds one complete checkpoint; ``resume=`` reads the newest.

One mechanism serves every kind of model: a :class:`CheckpointFormat` names how a model's record
is written and read (npz with a JSON header, no pickle) and what in it identifies the network. A
record is any object with a ``progress`` attribute (``None`` or the progress as JSON, written in
its file's header) and an ``optimizer`` attribute (``None`` or the optimizer of its last step).
:data:`MODEL_FILE` is that of :class:`~dasknn.model.persistence.ModelRecord` (the sparse MLPs);
the other models' persistence modules define theirs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dasknn.exceptions import WorkerLostError
from dasknn.model.persistence import ModelRecord, read_model, write_model

__all__ = [
    "MODEL_FILE",
    "CheckpointFormat",
    "Checkpointed",
    "Progress",
    "check_checkpoint_every",
    "check_same_model",
    "model_identity",
    "data_digest",
    "latest_checkpoint",
    "prepare_checkpoint_dir",
    "write_checkpoint",
]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"checkpoint-(\d{9})\.npz")


def data_digest(*arrays: np.ndarray) -> str:
    """BLAKE2b digest of the checked training data, its arrays in order (values, shapes and
    dtypes)."""
    digest = hashlib.blake2b(digest_size=16)
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.data)
    return digest.hexdigest()


@dataclass
class Progress:
    """Where a ``fit`` call stands.

    Attributes
    ----------
    call : dict
        The call's ``samples``, ``batch_size``, ``shuffle``, ``seed`` and ``data`` (the
        :func:`data_digest` of the checked ``X`` and ``Y``): a resume must repeat them. It may
        ask for more epochs (the epochs' orders are drawn one after the other from the seed, so
        the first ones are those of the shorter call).
    epoch, batch : int
        The next batch to train: batch ``batch`` of epoch ``epoch`` (0-based).
    batches_done : int
        Batches trained by the call so far.
    epoch_loss : float
        Sum over this epoch's trained batches of ``loss * rows``.
    loss_curve, batch_loss_curve : list of float
        The model's curves at this point.
    """

    call: dict
    epoch: int = 0
    batch: int = 0
    batches_done: int = 0
    epoch_loss: float = 0.0
    loss_curve: list[float] = field(default_factory=list)
    batch_loss_curve: list[float] = field(default_factory=list)

    def to_json(self) -> dict:
        """The progress as JSON data."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict, where: str) -> Progress:
        """The progress stored in a checkpoint; ``ValueError`` naming ``where`` if malformed."""
        try:
            progress = cls(**data)
            numbers = [progress.epoch, progress.batch, progress.batches_done]
            if not all(isinstance(n, int) and n >= 0 for n in numbers):
                raise ValueError("epoch, batch and batches_done must be integers >= 0")
            progress.epoch_loss = float(progress.epoch_loss)
            progress.loss_curve = [float(v) for v in progress.loss_curve]
            progress.batch_loss_curve = [float(v) for v in progress.batch_loss_curve]
            if not isinstance(progress.call, dict):
                raise ValueError("the call must be a JSON object")
            progress._check_position()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: malformed training progress: {exc}") from None
        return progress

    def _check_position(self) -> None:
        """``ValueError`` unless the position is one the call can reach: the batch within its
        epoch (``ceil(samples / batch_size)`` batches), ``batches_done`` equal to the batches of
        the epochs before plus ``batch``, a finite ``epoch_loss`` that is 0 at an epoch's start,
        and finite curves."""
        samples, batch_size = self.call.get("samples"), self.call.get("batch_size")
        for name, value in (("samples", samples), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"the call's {name} must be an integer >= 1, got {value!r}")
        per_epoch = -(-samples // batch_size)
        if self.batch >= per_epoch:
            raise ValueError(
                f"batch {self.batch} of epoch {self.epoch}, but the call has {per_epoch} "
                "batches an epoch"
            )
        if self.batches_done != self.epoch * per_epoch + self.batch:
            raise ValueError(
                f"batches_done {self.batches_done} is not epoch {self.epoch} x {per_epoch} "
                f"batches + batch {self.batch}"
            )
        if not np.isfinite(self.epoch_loss) or (self.batch == 0 and self.epoch_loss != 0):
            raise ValueError(f"epoch_loss {self.epoch_loss} at batch {self.batch}")
        if not np.isfinite(self.loss_curve).all() or not np.isfinite(self.batch_loss_curve).all():
            raise ValueError("the loss curves hold NaN or infinite values")

    def check_call(self, call: dict, epochs: int, where: str) -> None:
        """``ValueError`` naming ``where`` unless ``call`` repeats the checkpointed call and asks
        for at least the epochs already trained."""
        if epochs < self.epoch:
            raise ValueError(
                f"{where}: the checkpoint has trained {self.epoch} epochs, more than the "
                f"{epochs} asked for"
            )
        differ = [
            f"{name}={call.get(name)!r} (checkpoint: {self.call.get(name)!r})"
            for name in sorted(set(call) | set(self.call))
            if call.get(name) != self.call.get(name)
        ]
        if differ:
            data_only = all(d.startswith("data=") for d in differ)
            what = "data" if data_only else "arguments"
            raise ValueError(
                f"{where}: the checkpoint was written by a fit call with other {what}; resume "
                f"with the same data and arguments ({'; '.join(differ)})"
            )


def model_identity(record: ModelRecord) -> dict:
    """What makes two models the same network: layer sizes, pattern digest, activations, loss
    and dtype."""
    return {
        "layer_sizes": record.layer_sizes,
        "pattern": record.pattern,
        "activation": record.activation,
        "output_activation": record.output_activation,
        "loss": record.loss,
        "dtype": record.dtype,
    }


@dataclass(frozen=True)
class CheckpointFormat:
    """How the records of one kind of model are checkpointed.

    Attributes
    ----------
    write : callable
        ``write(path, record)``: write the record (with its ``progress``) atomically.
    read : callable
        ``read(path) -> record``: read it back, checked (``FileNotFoundError``, or a
        ``ValueError`` naming the file), with its ``progress`` (``None`` or a JSON object).
    identity : callable
        ``identity(record) -> dict``: what makes two records the same network (the estimator's
        ``_identity()`` returns the same keys).
    """

    write: Callable[[Path, Any], None]
    read: Callable[[Path], Any]
    identity: Callable[[Any], dict]


def check_same_model(
    record: Any, identity: dict, where: str, fmt: CheckpointFormat | None = None
) -> None:
    """``ValueError`` naming ``where`` unless ``record`` is the network ``identity`` describes
    (``fmt.identity``, default :func:`model_identity`)."""
    stored = (fmt or MODEL_FILE).identity(record)
    differ = [name for name in identity if identity[name] != stored[name]]
    if differ:
        details = "; ".join(
            f"{name}: this model {identity[name]!r}, checkpoint {stored[name]!r}"
            if name != "pattern"
            else "the sparsity patterns differ"
            for name in differ
        )
        raise ValueError(f"{where}: a checkpoint of another model ({details})")


#: The checkpoint format of :class:`~dasknn.model.persistence.ModelRecord` (``SparseMLP``,
#: ``DistributedSparseMLP``).
MODEL_FILE = CheckpointFormat(write_model, read_model, model_identity)


def check_checkpoint_every(every, batches_per_epoch: int) -> int:
    """Batches between checkpoints: ``every`` (an integer >= 1), default one epoch."""
    if every is None:
        return max(batches_per_epoch, 1)
    if isinstance(every, bool) or not isinstance(every, int | np.integer) or every < 1:
        raise ValueError(f"checkpoint_every must be an integer >= 1, got {every!r}")
    return int(every)


def prepare_checkpoint_dir(directory: str | os.PathLike) -> Path:
    """The checkpoint directory, created if missing (its parent must exist).

    Raises
    ------
    FileNotFoundError
        If the parent directory does not exist.
    NotADirectoryError
        If ``directory`` is a file.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"checkpoint directory {str(directory)!r} is a file")
    if not directory.parent.is_dir():
        raise FileNotFoundError(f"the parent of checkpoint directory {str(directory)!r} is missing")
    directory.mkdir(exist_ok=True)
    return directory


def _checkpoints(directory: Path) -> list[Path]:
    """The checkpoint files of ``directory``, oldest first."""
    return sorted(p for p in directory.iterdir() if _NAME.fullmatch(p.name))


def write_checkpoint(
    directory: Path, record: Any, progress: Progress, fmt: CheckpointFormat | None = None
) -> Path:
    """Write ``record`` with ``progress`` as the newest checkpoint of ``directory`` (atomically,
    with ``fmt.write``, default :data:`MODEL_FILE`), then remove the older ones; returns the
    file."""
    record.progress = progress.to_json()
    path = directory / f"checkpoint-{progress.batches_done:09d}.npz"
    (fmt or MODEL_FILE).write(path, record)
    for older in _checkpoints(directory):
        if older != path:
            older.unlink(missing_ok=True)
    return path


def latest_checkpoint(
    source: str | os.PathLike, fmt: CheckpointFormat | None = None
) -> tuple[Path, Any, Progress]:
    """Read the newest checkpoint of the directory ``source`` (or the checkpoint file itself)
    with ``fmt.read`` (default :data:`MODEL_FILE`).

    Raises
    ------
    FileNotFoundError
        If ``source`` does not exist or the directory holds no checkpoint.
    ValueError
        If the file is not a readable checkpoint (naming it).
    """
    source = Path(source)
    if source.is_dir():
        found = _checkpoints(source)
        if not found:
            raise FileNotFoundError(f"no checkpoint-*.npz in {str(source)!r} to resume from")
        source = found[-1]
    record = (fmt or MODEL_FILE).read(source)
    if record.progress is None:
        raise ValueError(f"{source}: a model file without training progress, not a checkpoint")
    return source, record, Progress.from_json(record.progress, str(source))


class Checkpointed:
    """What a model's ``fit`` needs to write checkpoints and resume from one, shared by every
    estimator loop (:class:`~dasknn.model.estimator.SparseEstimator`,
    :class:`~dasknn.model.step_loop.StepLoop`).

    A subclass sets :attr:`_checkpoint_format` and implements ``_identity()`` (the
    ``_checkpoint_format.identity`` of its network), ``_record()`` (its values and optimizer
    state as a record of that format) and ``_restore(record)``; it holds ``loss_curve_`` and
    ``batch_loss_curve_``.
    """

    #: How this model's records are checkpointed.
    _checkpoint_format: CheckpointFormat = MODEL_FILE

    def _identity(self) -> dict:
        """The ``identity`` of this model's network (see :class:`CheckpointFormat`)."""
        raise NotImplementedError

    def _record(self) -> Any:
        """The current values and optimizer state (and placement) as a record of
        :attr:`_checkpoint_format`."""
        raise NotImplementedError

    def _restore(self, record: Any) -> None:
        """Take the values and optimizer state of ``record`` (the same network)."""
        raise NotImplementedError

    def _data_digest(self, x, y) -> str:
        """The :func:`data_digest` of a ``fit`` call's checked data ``x``, ``y``."""
        return data_digest(x, y)

    def _open_checkpoints(
        self, x, y, *, batch_size: int, epochs: int, shuffle: bool, seed: int, optimizer,
        checkpoint, checkpoint_every, resume, extra_call: dict | None = None,
    ) -> tuple[Progress, Path | None, int]:  # fmt: skip
        """Check a ``fit`` call's checkpoint arguments on its checked data ``x``, ``y``; restore
        the ``resume`` checkpoint. Returns the call's progress (where it starts), the checkpoint
        directory (created, or ``None``) and the batches between checkpoints. ``extra_call``:
        more of the call (JSON values) that a resume must repeat.

        Raises
        ------
        ValueError
            For a bad ``checkpoint_every``, or a ``resume`` checkpoint of another network, other
            data or arguments, or another optimizer.
        """
        every = check_checkpoint_every(checkpoint_every, -(-x.shape[0] // batch_size))
        call = {}
        if checkpoint is not None or resume is not None:
            call = {
                "samples": x.shape[0],
                "batch_size": batch_size,
                "shuffle": bool(shuffle),
                "seed": int(seed),
                "data": self._data_digest(x, y),
                **(extra_call or {}),
            }
        state = Progress(call)
        if resume is not None:
            fmt = self._checkpoint_format
            where, record, state = latest_checkpoint(resume, fmt)
            check_same_model(record, self._identity(), str(where), fmt)
            state.check_call(call, epochs, str(where))
            trained_with = record.optimizer if state.batches_done else None
            if trained_with is not None and trained_with != optimizer:
                raise ValueError(
                    f"{where}: the checkpoint was trained with {record.optimizer!r}; resume with "
                    f"the same optimizer, not {optimizer!r}"
                )
            self._restore_checkpoint(record, state)
        directory = prepare_checkpoint_dir(checkpoint) if checkpoint is not None else None
        return state, directory, every

    def save(self, path: str | os.PathLike) -> None:
        """Write the model (its values and optimizer state, read from the workers where it is
        distributed) to the ``.npz`` file ``path`` atomically, in :attr:`_checkpoint_format`;
        the model's ``load`` reads it back."""
        self._checkpoint_format.write(path, self._record())

    def _save_checkpoint(self, directory: Path, state: Progress) -> Path:
        """Write the model with ``state`` and its loss curves as the newest checkpoint of
        ``directory``; returns the file."""
        state.loss_curve = list(self.loss_curve_)
        state.batch_loss_curve = list(self.batch_loss_curve_)
        return write_checkpoint(directory, self._record(), state, self._checkpoint_format)

    def _restore_checkpoint(self, record: Any, state: Progress) -> None:
        """Take the values, optimizer state and loss curves of a checkpoint."""
        self._restore(record)
        self.loss_curve_ = list(state.loss_curve)
        self.batch_loss_curve_ = list(state.batch_loss_curve)

    #: How many times one ``fit`` call restores its last checkpoint after a recoverable failure.
    max_recoveries = 3

    def _recoverable(self, error: Exception) -> bool:
        """Whether ``fit`` may restore its last checkpoint and go on after ``error`` (a lost
        worker)."""
        return isinstance(error, WorkerLostError)

    def _recovering(
        self, run: Callable[[Progress], None], state: Progress, saved: Callable[[], Path | None]
    ) -> None:
        """``run(state)``, the rest of a ``fit`` call from ``state``; after an error that
        :meth:`_recoverable` accepts, restore the call's last checkpoint (``saved()``, ``None``
        if none was written) and run again from there, at most :attr:`max_recoveries` times,
        each recovery logged as a warning (logger ``dasknn.model.checkpoint``).
        ``KeyboardInterrupt`` calls ``_interrupted()`` and is raised again."""
        recoveries = 0
        while True:
            try:
                run(state)
                return
            except KeyboardInterrupt:
                self._interrupted()
                raise
            except Exception as exc:
                if not self._recoverable(exc) or saved() is None:
                    raise
                if recoveries >= self.max_recoveries:
                    raise type(exc)(
                        f"{exc}; this fit call has restored its checkpoint {recoveries} times "
                        "already (max_recoveries) and stops here"
                    ) from exc
                recoveries += 1
                logger.warning(
                    "%s: %s; restoring the newest checkpoint of %s and going on (recovery %d "
                    "of at most %d in this fit call)",
                    type(self).__name__, exc, saved(), recoveries, self.max_recoveries,
                )  # fmt: skip
                state = self._restore_latest(saved())

    def _restore_latest(self, saved: Path) -> Progress:
        """Restore the checkpoint ``saved``; returns its progress."""
        _, record, state = latest_checkpoint(saved, self._checkpoint_format)
        self._restore_checkpoint(record, state)
        return state
