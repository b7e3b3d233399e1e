"""``EmbeddingMLP``: a one-process next-word model with a sparse embedding and dense layers.

The arithmetic is in :mod:`dasknn.model.embedding_network`; this class owns the values and the
optimizer state and follows the estimator conventions of :mod:`dasknn.model.window_estimator`.
``dasknn.DistributedEmbeddingMLP(model, client, ...)`` trains a copy of it on a cluster.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from numbers import Integral

import numpy as np

from dasknn.model.activations import get_activation
from dasknn.model.embedding_network import (
    COMBINES,
    EMBEDDING,
    OUTPUTS,
    SOFTMAX,
    EmbeddingSpec,
    apply_dense,
    apply_rows,
    batch_logits,
    gradients,
    unique_rows,
)
from dasknn.model.embedding_persistence import (
    EMBEDDING_FILE,
    EmbeddingRecord,
    embedding_identity,
    read_embedding,
    write_embedding,
)
from dasknn.model.sampled_softmax import SAMPLERS, sample_candidates, sampled_output
from dasknn.model.validation import check_float_dtype
from dasknn.model.window_estimator import WindowEstimator
from dasknn.optim import NONNEGATIVE_STATES, Optimizer, OptimizerSlots

__all__ = ["EmbeddingMLP", "split_output_table"]


def split_output_table(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The output layer's weight (H, n_classes) and bias of a table ``[W_out^T | b_out]``."""
    return np.ascontiguousarray(table[:, :-1].T), np.ascontiguousarray(table[:, -1])


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


class EmbeddingMLP(WindowEstimator):
    """Embedding (V x d, the sparse variable) -> dense hidden layers -> softmax over classes.

    Parameters
    ----------
    vocab_size : int
        Rows ``V`` of the embedding.
    context : int
        Token ids per window ``c``.
    embed_dim : int
        Width ``d`` of an embedding row.
    hidden : sequence of int
        Widths of the dense hidden layers (may be empty).
    n_classes : int, optional
        Output classes (default ``vocab_size``: next-word prediction).
    combine : {"concat", "sum", "mean"}
        How the ``c`` rows of a window form the first layer's input.
    activation : str
        Hidden activation (``"relu"``, ``"sigmoid"``, ...).
    dtype : numpy dtype
        ``float32`` or ``float64``.
    seed : int
        Seed of the initial values: embedding ``N(0, 0.1^2)``, layers uniform in
        ``+-sqrt(6 / (fan_in + fan_out))`` (Glorot), biases 0; also of the candidate draws of
        the sampled softmax.
    output : {"softmax", "sampled"}
        Train with the full softmax, or with the sampled softmax of
        :mod:`dasknn.model.sampled_softmax` (``n_sampled`` candidates a step from ``sampler``,
        the logQ correction, accidental hits dropped); the output layer is then a row-sparse
        variable, stepped on the rows of the batch's labels and candidates only.
        ``predict``, ``predict_proba``, ``score`` and ``evaluate`` always use the full softmax.
    n_sampled : int
        Candidate classes per step (``output="sampled"``).
    sampler : {"log-uniform", "uniform"}
        The candidates' distribution (log-uniform assumes classes ordered by falling
        frequency, as the corpus loader's vocabulary is).

    Attributes
    ----------
    embedding : numpy.ndarray (V, d)
    weights, biases : lists of numpy.ndarray
        The dense layers, hidden ones first, shapes ``(n_in, n_out)`` and ``(n_out,)``.
    optimizer : Optimizer or None
        The optimizer of the last step; its state is kept while later steps use an equal one.
    n_steps_ : int
        Training steps taken (step ``t`` of the sampled softmax draws its candidates with
        ``t = n_steps_``).
    """

    def __init__(
        self,
        vocab_size: int,
        context: int,
        embed_dim: int = 32,
        hidden=(64,),
        n_classes: int | None = None,
        combine: str = "concat",
        activation: str = "relu",
        dtype=np.float32,
        seed: int = 0,
        output: str = "softmax",
        n_sampled: int = 64,
        sampler: str = "log-uniform",
    ) -> None:
        if combine not in COMBINES:
            raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        get_activation(activation)
        dtype = check_float_dtype(dtype)
        self.spec = EmbeddingSpec(
            vocab_size=_positive("vocab_size", vocab_size),
            context=_positive("context", context),
            embed_dim=_positive("embed_dim", embed_dim),
            hidden=tuple(_positive("hidden width", h) for h in hidden),
            n_classes=_positive("n_classes", vocab_size if n_classes is None else n_classes),
            combine=combine,
            activation=activation,
            dtype=dtype.name,
            output=output,
            n_sampled=_positive("n_sampled", n_sampled),
            sampler=sampler,
            sampler_seed=int(seed),
        )
        rng = np.random.default_rng(seed)
        self.embedding = (0.1 * rng.standard_normal((vocab_size, embed_dim))).astype(dtype)
        self.weights: list[np.ndarray] = []
        self.biases: list[np.ndarray] = []
        sizes = self.spec.layer_sizes
        for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
            bound = np.sqrt(6.0 / (n_in + n_out))
            self.weights.append(rng.uniform(-bound, bound, (n_in, n_out)).astype(dtype))
            self.biases.append(np.zeros(n_out, dtype=dtype))
        self._slots = OptimizerSlots()
        self.n_steps_ = 0
        self.loss_curve_: list[float] = []
        self.batch_loss_curve_: list[float] = []

    @property
    def optimizer(self) -> Optimizer | None:
        """The optimizer of the last step (``None`` before the first)."""
        return self._slots.optimizer

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.spec.dtype)

    def dense_variables(self) -> list[np.ndarray]:
        """The dense variables in the order of ``spec.dense_names()`` (views, not copies): every
        layer, or the hidden ones under the sampled softmax."""
        out = []
        for w, b in zip(self.weights, self.biases, strict=True):
            out += [w, b]
        return out[: len(self.spec.dense_names())]

    def output_table(self) -> np.ndarray:
        """The output layer as one table ``[W_out^T | b_out]`` (n_classes, H + 1), a copy."""
        return np.hstack([self.weights[-1].T, self.biases[-1][:, None]])

    def variables(self) -> dict[str, np.ndarray]:
        """Every variable by name: ``"embedding"``, the dense ones (views) and, under the
        sampled softmax, ``"softmax"`` (the output table, a copy)."""
        out = {
            EMBEDDING: self.embedding,
            **dict(zip(self.spec.dense_names(), self.dense_variables(), strict=True)),
        }
        if self.spec.sampled:
            out[SOFTMAX] = self.output_table()
        return out

    def candidates(self, step: int) -> np.ndarray:
        """The candidate classes the sampled softmax draws at training step ``step``."""
        s = self.spec
        return sample_candidates(s.n_classes, s.n_sampled, s.sampler, s.sampler_seed, step)

    @classmethod
    def _from_values(
        cls,
        spec: EmbeddingSpec,
        embedding: np.ndarray,
        weights: list[np.ndarray],
        biases: list[np.ndarray],
    ) -> EmbeddingMLP:
        """A model of ``spec`` holding these arrays (not copied; shapes and dtype those of
        ``spec``), with no optimizer state and empty curves."""
        model = object.__new__(cls)
        model.spec = spec
        model.embedding, model.weights, model.biases = embedding, weights, biases
        model._slots = OptimizerSlots()
        model.n_steps_ = 0
        model.loss_curve_, model.batch_loss_curve_ = [], []
        return model

    def copy(self) -> EmbeddingMLP:
        """A copy with the same values (no optimizer state, empty curves)."""
        other = self._from_values(
            self.spec,
            self.embedding.copy(),
            [w.copy() for w in self.weights],
            [b.copy() for b in self.biases],
        )
        other.n_steps_ = self.n_steps_
        return other

    def __repr__(self) -> str:
        s = self.spec
        return (
            f"EmbeddingMLP(vocab_size={s.vocab_size}, context={s.context}, "
            f"embed_dim={s.embed_dim}, hidden={s.hidden}, n_classes={s.n_classes}, "
            f"combine={s.combine!r}, dtype={s.dtype}, output={s.output!r})"
        )

    # ------------------------------------------------------------------ persistence
    _checkpoint_format = EMBEDDING_FILE

    def save(self, path: str | os.PathLike) -> None:
        """Write the model (spec, embedding, dense layers, step count, optimizer and its state)
        to the ``.npz`` file ``path`` atomically (format of
        :mod:`dasknn.model.embedding_persistence`); :meth:`load` reads it back."""
        write_embedding(path, self._record())

    @classmethod
    def load(cls, path: str | os.PathLike) -> EmbeddingMLP:
        """Read a model written by :meth:`save` (or a checkpoint), with its optimizer state, so
        that it trains on as the saved one would. Nothing is unpickled.

        Raises
        ------
        FileNotFoundError
            If ``path`` does not exist.
        ValueError
            Naming ``path``: not an embedding model file (not a zip archive, truncated,
            corrupt, another format), a newer format version, a bad spec, arrays of the wrong
            shape or dtype or not finite, optimizer state that does not fit.
        """
        record = read_embedding(path)
        try:
            return cls._of_record(record)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: invalid embedding model file: {exc}") from None

    @classmethod
    def _of_record(cls, record: EmbeddingRecord) -> EmbeddingMLP:
        """A model of ``record`` (its spec checked as the constructor's arguments, its arrays
        as :meth:`_restore` does; ``ValueError`` or ``TypeError`` otherwise)."""
        spec = record.spec
        names = set(EmbeddingSpec.__dataclass_fields__)
        if set(spec) != names:
            raise ValueError(f"the spec must have the fields {sorted(names)}")
        model = cls(
            spec["vocab_size"], spec["context"], spec["embed_dim"], spec["hidden"],
            spec["n_classes"], spec["combine"], spec["activation"], spec["dtype"],
            spec["sampler_seed"], spec["output"], spec["n_sampled"], spec["sampler"],
        )  # fmt: skip
        if embedding_identity(record) != model._identity():
            raise ValueError("the spec does not hold after its checks")
        model._restore(record)
        return model

    def _identity(self) -> dict:
        return embedding_identity(self._record(with_state=False))

    def _record(self, with_state: bool = True) -> EmbeddingRecord:
        """The model as a record (arrays shared, not copied)."""
        spec = asdict(self.spec)
        spec["hidden"] = list(spec["hidden"])
        record = EmbeddingRecord(
            spec, self.embedding, list(self.weights), list(self.biases), self.n_steps_
        )
        if with_state and self.optimizer is not None:
            record.optimizer, record.states = self.optimizer, dict(self._slots.states)
        return record

    def _state_params(self) -> dict[str, np.ndarray]:
        """The array each optimizer state key steps, as :meth:`_train_batch` hands it over."""
        params = {EMBEDDING: self.embedding}
        for name, param in zip(self.spec.dense_names(), self.dense_variables(), strict=True):
            params[name] = param.reshape(-1)
        if self.spec.sampled:
            params["softmax-weight"] = self.weights[-1].T
            params["softmax-bias"] = self.biases[-1][:, None]
        return params

    def _restore(self, record: EmbeddingRecord) -> None:
        """Take the values, step count and optimizer state of ``record`` (a record of this
        network), each array checked first (``ValueError``)."""
        if len(record.weights) != len(self.weights) or len(record.biases) != len(self.biases):
            raise ValueError(f"{len(self.weights)} dense layers expected")
        arrays = [("embedding", self.embedding, record.embedding)]
        for k in range(len(self.weights)):
            arrays += [(f"w{k}", self.weights[k], record.weights[k])]
            arrays += [(f"b{k}", self.biases[k], record.biases[k])]
        for name, mine, stored in arrays:
            if stored.shape != mine.shape or stored.dtype != mine.dtype:
                raise ValueError(
                    f"{name} has shape {stored.shape} and dtype {stored.dtype}, expected "
                    f"{mine.shape} {mine.dtype}"
                )
            if not np.isfinite(stored).all():
                raise ValueError(f"{name} holds NaN or infinite values")
        self.embedding = np.array(record.embedding)
        self.weights = [np.array(w) for w in record.weights]
        self.biases = [np.array(b) for b in record.biases]
        states = {}
        if record.optimizer is not None:
            params = self._state_params()
            for key, state in record.states.items():
                if key not in params:
                    raise ValueError(f"optimizer state of an unknown variable {key!r}")
                fresh = record.optimizer.init_state(params[key])
                if set(state.arrays) != set(fresh.arrays):
                    raise ValueError(
                        f"optimizer state of {key} holds {sorted(state.arrays)}, expected "
                        f"{sorted(fresh.arrays)}"
                    )
                for name, values in state.arrays.items():
                    want = fresh.arrays[name]
                    if values.shape != want.shape or values.dtype != want.dtype:
                        raise ValueError(f"optimizer state {key}.{name} has the wrong shape")
                    if not np.isfinite(values).all() or (
                        name in NONNEGATIVE_STATES and (values < 0).any()
                    ):
                        raise ValueError(f"optimizer state {key}.{name} holds bad values")
                copies = {n: np.array(v) for n, v in state.arrays.items()}
                states[key] = type(state)(state.step, copies)
        self._slots = OptimizerSlots(record.optimizer, states)
        self.n_steps_ = record.n_steps

    # ------------------------------------------------------------------ hooks
    def _interrupted(self) -> None:
        """A ``fit`` call was interrupted: a step runs whole in the process; nothing to do."""

    def _train_batch(self, ids: np.ndarray, labels: np.ndarray, optimizer: Optimizer) -> float:
        unique, inverse = unique_rows(ids)
        s = self.spec
        rows, output = {EMBEDDING: self.embedding[unique]}, None
        if s.sampled:
            output = sampled_output(labels, self.candidates(self.n_steps_), s.n_classes, s.sampler)
            rows[SOFTMAX] = self.output_table()[output.classes]
        dense = self.dense_variables()
        loss_sum, grads, grad_rows = gradients(
            s, rows, inverse, labels, output, dense, ids.shape[0]
        )
        if s.sampled:
            # the output table's rows, stepped as the weight's columns and the bias's entries
            weight = self.weights[-1].T
            bias = self.biases[-1][:, None]
            weight_state = self._slots.state(optimizer, "softmax-weight", weight)
            bias_state = self._slots.state(optimizer, "softmax-bias", bias)
            classes, grad_output = output.classes, grad_rows[SOFTMAX]
            apply_rows(optimizer, weight, weight_state, classes, grad_output[:, :-1])
            apply_rows(optimizer, bias, bias_state, classes, grad_output[:, -1:])
        state = self._slots.state(optimizer, EMBEDDING, self.embedding)
        apply_rows(optimizer, self.embedding, state, unique, grad_rows[EMBEDDING])
        for name, param, grad in zip(s.dense_names(), dense, grads, strict=True):
            state = self._slots.state(optimizer, name, param.reshape(-1))
            apply_dense(optimizer, param, grad, state)
        self.n_steps_ += 1
        return loss_sum / ids.shape[0]

    def _logits(self, ids: np.ndarray) -> np.ndarray:
        unique, inverse = unique_rows(ids)
        return batch_logits(self.spec, self.embedding[unique], inverse, self.weights, self.biases)
