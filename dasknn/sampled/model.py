"""The one-process sampled network (SLIDE): sparse input, a dense ReLU hidden layer, and a large
output layer of which each sample only computes an LSH-sampled active set under a softmax
normalised over that set.

With ``shards=P`` the output layer is cut into ``P`` shards that select their active neurons
independently, each exactly its budget, as the workers of the distributed model
(:class:`dasknn.sampled_parallel.DistributedSampledMLP`) do: the model then simulates ``P`` workers
in one process and selects the same active sets.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator
from typing import Self

import numpy as np
import scipy.sparse as sp

from dasknn.lsh import HashTables
from dasknn.model.checkpoint import Progress, data_digest
from dasknn.model.step_loop import StepLoop
from dasknn.optim import Adam, Optimizer, OptimizerSlots
from dasknn.sampled.checks import (
    check_features,
    check_hyperparameters,
    check_k,
    check_labels,
    check_positive_int,
)
from dasknn.sampled.layers import (
    ActiveSet,
    HiddenLayer,
    OutputShard,
    SamplingConfig,
    combine_statistics,
    merge_top_k,
    shard_bucket_cap,
)
from dasknn.sampled.persistence import (
    SAMPLED_FILE,
    STATE_KEYS,
    LayerRecord,
    SampledRecord,
    check_layer,
    check_tables,
    read_sampled,
    sampled_identity,
    write_sampled,
)
from dasknn.sampled.schedule import DecaySchedule, training_schedule
from dasknn.sampled.sharding import ShardMap

__all__ = [
    "SampledMLP",
    "SampledTraining",
    "check_seed",
    "epoch_batches",
    "initial_parameters",
    "label_rows",
    "precision_at_k",
    "predicted_precision_at_k",
    "training_optimizer",
]


def epoch_batches(n: int, batch_size: int, seed: int, epoch: int, shuffle: bool) -> Iterator:
    """The row numbers of each batch of one epoch (a permutation seeded by ``(seed, epoch)``)."""
    order = np.random.default_rng([seed, epoch, 0xE90C]).permutation(n) if shuffle else np.arange(n)
    for start in range(0, n, batch_size):
        yield np.sort(order[start : start + batch_size])


def training_optimizer(current: Optimizer, lr: float | None, optimizer: Optimizer | None):
    """The optimizer of a training call: ``Adam(lr=lr)``, ``optimizer``, or ``current``.

    Raises
    ------
    ValueError
        If both are given, ``lr`` is not a number > 0, or ``optimizer`` is not Adam or AdamW
        (the sampled layers' update kernels are Adam's).
    """
    if lr is not None and optimizer is not None:
        raise ValueError("give either lr or optimizer, not both")
    if lr is not None:
        return Adam(lr=lr)
    if optimizer is None:
        return current
    if not isinstance(optimizer, Adam):
        raise ValueError(f"optimizer must be dasknn.optim.Adam or AdamW, got {optimizer!r}")
    return optimizer


def check_seed(seed) -> int:
    """``seed`` as an int; ``ValueError`` unless it is an integer >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def initial_parameters(
    n_features: int, hidden: int, n_labels: int, dtype, seed: int
) -> dict[str, np.ndarray]:
    """Seeded initial parameters, as PyTorch initialises ``EmbeddingBag`` and ``Linear``:
    hidden weights ``N(0, 1)``, output weights ``U(-1/sqrt(H), 1/sqrt(H))``, biases zero.
    The output weights are neuron-major, ``(n_labels, hidden)``."""
    rng = np.random.default_rng([seed, 0x1417])
    bound = 1.0 / np.sqrt(hidden)
    return {
        "hidden_weights": rng.standard_normal((n_features, hidden)).astype(dtype),
        "hidden_bias": np.zeros(hidden, dtype=dtype),
        "output_weights": rng.uniform(-bound, bound, (n_labels, hidden)).astype(dtype),
        "output_bias": np.zeros(n_labels, dtype=dtype),
    }


def precision_at_k(predicted: np.ndarray, ptr: np.ndarray, ids: np.ndarray, k: int) -> float:
    """Mean over the rows of ``|top k ∩ labels| / k``; ``predicted`` is ``(n, >= k)``."""
    rows = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    hits = np.zeros(len(ptr) - 1)
    top = predicted[:, :k]
    for j in range(top.shape[1]):
        hits += np.bincount(rows, weights=(top[rows, j] == ids), minlength=len(hits))
    return float(hits.mean() / k)


def predicted_precision_at_k(model, X, Y, k: int) -> float:
    """Precision@k of ``model.predict(X, k)`` against the labels ``Y``.

    Parameters
    ----------
    model : SampledMLP or DistributedSampledMLP
        A trained model: its ``predict``, ``n_features_in_``, ``n_labels_`` and ``dtype``.
    X : array-like or scipy.sparse matrix, shape (n, n_features_in_)
    Y : CSR matrix or sequence of label lists
        The labels of every row.
    k : int
        Predicted labels a row (>= 1).

    Returns
    -------
    float
        :func:`precision_at_k` of the predictions.

    Raises
    ------
    ValueError
        For a bad ``k``, features that are not finite or of the wrong width, or labels of
        another number of rows or outside ``[0, n_labels_)``, before anything is predicted.
    """
    k = check_k(k)
    X = check_features(X, model.n_features_in_, model.dtype)
    ptr, ids, _ = check_labels(Y, X.shape[0], model.n_labels_, training=False)
    return precision_at_k(model.predict(X, k), ptr, ids, k)


class SampledTraining(StepLoop):
    """``fit`` and ``partial_fit`` of the sampled models, one-process and distributed, on the
    shared loop (:class:`~dasknn.model.step_loop.StepLoop`): the batches of epoch ``e`` of the
    model drawn from ``(seed, e)``, the learning-rate schedule of ``lr_decay``, Adam only.

    A subclass holds the attributes of :class:`SampledMLP` that training reads (``seed``,
    ``optimizer_``, ``lr_decay``, ``decay_horizon``, ``n_steps_``, ``epochs_``, the curves),
    implements ``_check_training(X, Y)`` (the checked ``(X, ptr, ids)``), ``_train_batches``
    and the hooks of :class:`~dasknn.model.checkpoint.Checkpointed`.
    """

    # ------------------------------------------------------------ training
    def fit(
        self,
        X,
        Y,
        *,
        batch_size: int = 256,
        epochs: int = 1,
        lr: float | None = None,
        optimizer: Optimizer | None = None,
        shuffle: bool = True,
        seed: int | None = None,
        progress: bool = False,
        record_batches: bool = False,
        on_epoch: Callable[[int, float], None] | None = None,
        checkpoint: str | os.PathLike | None = None,
        checkpoint_every: int | None = None,
        resume: str | os.PathLike | None = None,
    ) -> Self:
        """Train ``epochs`` epochs of mini-batches; returns the model.

        The learning rate follows ``lr_decay`` over the ``epochs * ceil(n / batch_size)`` steps
        of the call (or over ``decay_horizon``).

        Parameters
        ----------
        X : (n, n_features) sparse matrix or array
        Y : (n, n_labels) sparse indicator matrix, or a sequence of label lists
            Every row needs at least one label. A sample's target is ``1 / |labels|`` on each.
        batch_size, epochs : int
        lr : float, optional
            Train with ``Adam(lr=lr)`` from now on (the sampled layers' kernels are Adam's).
        optimizer : dasknn.optim.Adam or AdamW, optional
            Train with it from now on; not together with ``lr``. Without either, the model's
            ``optimizer_`` goes on.
        shuffle : bool
        seed : int, optional
            Seed of the batches' order (default the model's ``seed``); epoch ``e`` of the
            model draws its order from ``(seed, e)``.
        progress : bool
            Show a progress bar of each epoch's batches.
        record_batches : bool
            Also append every batch's loss to ``batch_loss_curve_``.
        on_epoch : callable, optional
            Called after every epoch with its index in the call (from 0) and its mean loss.
        checkpoint : path, optional
            Directory (created if missing) where a checkpoint (the model file of :meth:`save`
            with the call's progress) is written atomically at the start, every
            ``checkpoint_every`` batches and at the end; the older ones are removed
            (:mod:`dasknn.model.checkpoint`). A distributed model that loses a worker restores
            the last one and trains on.
        checkpoint_every : int, optional
            Batches between checkpoints (default: one epoch).
        resume : path, optional
            A checkpoint directory (its newest checkpoint) or file written by a ``fit`` call
            with the same data and arguments (``epochs`` may be larger): the model takes its
            values, optimizer state, hash tables, counts and loss curves, and training goes on
            from the batch it had reached, to the values of an uninterrupted run.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Before any update, for malformed data or arguments, or a ``resume`` checkpoint of
            another network, other data or arguments, or another optimizer.
        NonFiniteLossError
            At the first step whose loss is not finite, naming it.
        """
        return self._fit(
            X, Y, epochs, batch_size, shuffle, seed, progress, lr, optimizer, True,
            record_batches=record_batches, on_epoch=on_epoch, checkpoint=checkpoint,
            checkpoint_every=checkpoint_every, resume=resume,
        )  # fmt: skip

    def partial_fit(
        self,
        X,
        Y,
        *,
        batch_size: int = 256,
        lr: float | None = None,
        optimizer: Optimizer | None = None,
        shuffle: bool = True,
        seed: int | None = None,
        progress: bool = False,
        record_batches: bool = False,
    ) -> Self:
        """One epoch over ``(X, Y)`` (the arguments of :meth:`fit` but ``epochs`` and the
        checkpoints); returns the model. The learning rate stays constant unless
        ``decay_horizon`` is given."""
        return self._fit(
            X, Y, 1, batch_size, shuffle, seed, progress, lr, optimizer, False,
            record_batches=record_batches,
        )  # fmt: skip

    def _fit(
        self, X, Y, epochs, batch_size, shuffle, seed, progress, lr, optimizer, whole: bool, *,
        record_batches: bool = False, on_epoch=None, checkpoint=None, checkpoint_every=None,
        resume=None,
    ):  # fmt: skip
        """``epochs`` epochs on the shared loop (:class:`~dasknn.model.step_loop.StepLoop`);
        ``whole``: the call's steps are the schedule's (``fit``)."""
        check_positive_int("epochs", epochs)
        check_positive_int("batch_size", batch_size)
        chosen = training_optimizer(self.optimizer_, lr, optimizer)
        order_seed = self.seed if seed is None else check_seed(seed)
        X, ptr, ids = self._check_training(X, Y)
        self.optimizer_ = chosen
        steps = epochs * -(-X.shape[0] // batch_size) if whole else None

        def start(at: Progress) -> None:  # the call began at step n_steps_ - batches_done
            self.optimizer_ = chosen
            begun = self.n_steps_ - at.batches_done
            self.schedule_ = training_schedule(self.lr_decay, self.decay_horizon, begun, steps)

        self._fit_loop(
            X, (ptr, ids), batch_size=batch_size, epochs=epochs, optimizer=chosen,
            shuffle=shuffle, seed=order_seed, progress=progress, record_batches=record_batches,
            checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume=resume,
            start=start, on_epoch=on_epoch, extra_call=_schedule_call(self, steps),
        )  # fmt: skip
        return self

    # ------------------------------------------------------------ the loop's hooks
    def _data_digest(self, x, y) -> str:
        ptr, ids = y
        return data_digest(x.indptr, x.indices, x.data, np.asarray(x.shape), ptr, ids)

    def _batch(self, x, y, rows: np.ndarray) -> tuple:
        """``(X_rows, ptr, ids)``: the rows' features and CSR labels."""
        return (x[rows], *label_rows(*y, rows))

    def _epoch_orders(self, n, batch_size, shuffle, seed, epochs, state: Progress) -> Iterator:
        """Epoch ``e`` of the call is the model's epoch ``epochs_ - state.epoch + e``."""
        first = self.epochs_ - state.epoch
        return (
            list(epoch_batches(n, batch_size, seed, first + e, shuffle)) for e in range(epochs)
        )

    def _epoch_ended(self) -> None:
        self.epochs_ += 1


class SampledMLP(SampledTraining):
    """A sparse-input network ``softmax(relu(X @ W1 + b1) @ W2 + b2)`` trained with LSH-sampled
    softmax (SLIDE, Chen et al. 2020; D-SLIDE's per-shard budgets, Yan et al. 2022).

    Every training sample computes the output layer on its *active set* only: per shard, its
    labels (forced) and a sample of the union of its buckets in ``n_tables`` hash tables of the
    shard's weight vectors, queried with the sample's hidden activation; the softmax is
    normalised over the union of the shards' active sets. See ``docs/sampled.md``.

    The defaults are the setup measured best at 200,000 labels, one epoch (``docs/benchmarks.md``,
    "LSH-sampled training"): the correction ``"logq"``, ``"mips"`` hashing, a uniform share of
    0.3, every hidden row updated, Adam at ``lr=1e-2`` falling linearly to zero over the last
    half of each ``fit`` (``lr_decay=0.5``), and a rehash every 10 steps.

    Parameters
    ----------
    hidden : int
        Hidden neurons.
    active_fraction : float in (0, 1]
        Share of each shard's neurons active per sample: a shard of ``n`` neurons selects exactly
        ``ceil(active_fraction * n)`` (``"fill"``) or at most that many (``"stop"``).
    hash_family : {"simhash", "dwta"}
    k, n_tables : int
        Hash functions per table and tables (``k`` bits a code for SimHash,
        ``k * log2(bin_size)`` for DWTA; at most 30).
    bin_size : int
        DWTA's bin size, a power of two >= 2.
    bucket_size : int
        Cap of a bucket of the whole layer (larger buckets keep a seeded uniform reservoir
        sample); each of the ``shards`` shards caps its buckets at ``ceil(bucket_size /
        shards)``, so a query finds about as many candidates with any number of shards.
    underflow : {"fill", "stop"}
        When a shard's buckets hold fewer candidates than its budget: fill with uniformly drawn
        neurons, or stop with the candidates.
    rehash_every, rebuild_every : int
        Steps between rebuilding the tables from the current weights, and between drawing new
        hash functions (and rebuilding). Adam moves the weights fast in the first steps, and
        tables 20 or 50 steps old miss the high logits (``docs/sampled.md``).
    correction : {"none", "logq"}
        The sampled softmax: ``"none"`` normalises over the active set as it is (SLIDE);
        ``"logq"`` lowers each active logit by the log of the probability that its neuron was
        chosen (``log q``: 0 for labels and for candidates that all fit the budget, ``log(r / C +
        (1 - r / C) need / free)`` for a candidate when ``r`` of ``C`` fit, ``log(need / free)``
        for the uniform fill; 0 for every neuron when the whole shard is active), so the
        normaliser and the gradient approximate the full softmax's. Default ``"logq"``, the
        higher one-epoch precision@1 (``docs/sampled.md``).
    hashing : {"plain", "mips"}
        What the tables hash: the weight vectors and the layer input as they are (SLIDE), or,
        for maximum inner product search, the weight vectors less their mean with the bias,
        scaled and completed to unit length, and the query ``(h, 1, 0)`` (simple-LSH, Neyshabur
        & Srebro 2015; :mod:`dasknn.lsh.mips`), so a neuron's chance of sharing a bucket grows
        with its logit rather than with its angle to ``h``. Default ``"mips"``: plain SimHash
        crowds most neurons into one bucket once ``"logq"`` trains (``docs/sampled.md``).
    uniform_fraction : float in [0, 1)
        Share of each shard's budget (``floor(uniform_fraction * budget)`` slots) that the
        candidates leave to the uniform fill, so that every neuron has a chance to be active and
        the correction ``"logq"`` stays unbiased when the buckets hold more candidates than the
        budget. Default 0.3, above 0.0 and 0.6 in precision@1 (``docs/sampled.md``); needs
        ``underflow="fill"`` (with ``"stop"`` set it to 0).
    hidden_update : {"rows", "all"}
        Which rows of the hidden weights Adam updates each step: those of the features present
        in the batch (sparse Adam), or all (a row absent from the batch moves on its moments, as
        ``torch.optim.Adam`` does with a dense ``EmbeddingBag`` gradient). Default ``"all"``,
        the higher precision@1 (``docs/sampled.md``).
    optimizer : dasknn.optim.Adam or AdamW, optional
        Default ``Adam(lr=1e-2)``, PyTorch's best rate of the grids measured and the best of the
        sampled model with ``"logq"`` (against 3e-3 and 2e-2, ``docs/sampled.md``). Rows of
        the output weights that a batch does not touch are not updated (sparse Adam; for the
        hidden weights see ``hidden_update``); the step count is global.
    lr_decay : float in [0, 1]
        Share of the training steps, at their end, over which the learning rate falls linearly
        to zero (0: a constant learning rate). The steps are those of each ``fit`` call (its
        epochs times its batches), or ``decay_horizon``. At 100,000 rows x 200,000 labels, one
        epoch, 0.5 gives the highest precision@1 of 0, 0.5 and 1 (``docs/benchmarks.md``).
    decay_horizon : int, optional
        Steps of the schedule, counted from the model's first step, for training in several
        calls (``fit`` per group of batches, ``partial_fit``, ``train_step``); after them the
        learning rate is 0. Without it each ``fit`` call decays over its own steps, and
        ``partial_fit`` and ``train_step`` keep the learning rate constant.
    shards : int
        Shards of the output layer (a distributed model has one a worker).
    hogwild : bool
        Process a batch's samples in parallel, accumulating gradients without locks; ``False``
        processes them in order (deterministic).
    dtype : {"float32", "float64"}
    seed : int

    Attributes
    ----------
    loss_curve_ : list of float
        Mean training loss of each epoch (batch losses before their update).
    batch_loss_curve_ : list of float
        The loss of every batch of the ``fit`` calls made with ``record_batches=True``.
    n_steps_ : int
        Training steps taken.
    epochs_ : int
        Epochs trained (epoch ``e`` of the model draws its batch order from ``(seed, e)``).
    """

    _checkpoint_format = SAMPLED_FILE

    def __init__(
        self,
        hidden: int = 128,
        active_fraction: float = 0.005,
        hash_family: str = "simhash",
        k: int = 9,
        n_tables: int = 50,
        bin_size: int = 8,
        bucket_size: int = 128,
        underflow: str = "fill",
        rehash_every: int = 10,
        rebuild_every: int = 500,
        correction: str = "logq",
        hashing: str = "mips",
        uniform_fraction: float = 0.3,
        hidden_update: str = "all",
        optimizer: Optimizer | None = None,
        lr_decay: float = 0.5,
        decay_horizon: int | None = None,
        shards: int = 1,
        hogwild: bool = True,
        dtype: str = "float32",
        seed: int = 0,
    ) -> None:
        self.hidden = hidden
        self.active_fraction = active_fraction
        self.hash_family = hash_family
        self.k = k
        self.n_tables = n_tables
        self.bin_size = bin_size
        self.bucket_size = bucket_size
        self.underflow = underflow
        self.rehash_every = rehash_every
        self.rebuild_every = rebuild_every
        self.correction = correction
        self.hashing = hashing
        self.uniform_fraction = uniform_fraction
        self.hidden_update = hidden_update
        self.optimizer = optimizer
        self.lr_decay = lr_decay
        self.decay_horizon = decay_horizon
        self.shards = shards
        self.hogwild = hogwild
        self.dtype = dtype
        self.seed = seed
        check_hyperparameters(self)
        self.optimizer_ = self._resolve_optimizer()
        self.loss_curve_: list[float] = []
        self.batch_loss_curve_: list[float] = []
        self.n_steps_ = 0
        self.epochs_ = 0
        self.schedule_: DecaySchedule | None = None
        self.n_features_in_: int | None = None
        self.n_labels_: int | None = None

    # ------------------------------------------------------------ set-up
    def get_params(self) -> dict:
        """The hyperparameters, as given to ``__init__`` (scikit-learn's convention):
        ``SampledMLP(**model.get_params())`` is an unfitted model with the same ones."""
        names = inspect.signature(type(self).__init__).parameters
        return {name: getattr(self, name) for name in names if name != "self"}

    def _resolve_optimizer(self) -> Adam:
        if self.optimizer is None:
            return Adam(lr=1e-2)
        if not isinstance(self.optimizer, Adam):
            raise ValueError(
                f"optimizer must be dasknn.optim.Adam or AdamW, got {self.optimizer!r}"
            )
        return self.optimizer

    def sampling_config(self) -> SamplingConfig:
        """The hyperparameters of the output shards' selection, as their layers take them."""
        return SamplingConfig(
            self.hash_family,
            self.k,
            self.n_tables,
            self.bin_size,
            self.bucket_size,
            float(self.active_fraction),
            self.underflow,
            self.rehash_every,
            self.rebuild_every,
            self.seed,
            self.correction,
            self.hashing,
            float(self.uniform_fraction),
            self.shards,
        )

    def initialize(self, n_features: int, n_labels: int) -> SampledMLP:
        """Draw the initial parameters and build the shards' tables; returns the model."""
        self.shard_map_ = ShardMap.make(n_labels, self.shards, self.seed)
        params = initial_parameters(n_features, self.hidden, n_labels, self.dtype, self.seed)
        self.set_parameters(params)
        return self

    def set_parameters(self, params: dict[str, np.ndarray]) -> SampledMLP:
        """Install parameters (keys of :func:`initial_parameters`) and rebuild the tables; the
        optimizer state starts afresh."""
        n_labels, hidden = params["output_weights"].shape
        if not hasattr(self, "shard_map_") or len(self.shard_map_.order) != n_labels:
            self.shard_map_ = ShardMap.make(n_labels, self.shards, self.seed)
        dtype = np.dtype(self.dtype)
        self.n_features_in_ = params["hidden_weights"].shape[0]
        self.n_labels_ = n_labels
        self.hidden_layer_ = HiddenLayer(
            params["hidden_weights"].astype(dtype),
            params["hidden_bias"].astype(dtype),
            self.hogwild,
            self.hidden_update == "all",
        )
        config = self.sampling_config()
        self.shards_ = [
            OutputShard(
                p,
                self.shard_map_.ids(p),
                params["output_weights"][self.shard_map_.ids(p)].astype(dtype),
                params["output_bias"][self.shard_map_.ids(p)].astype(dtype),
                config,
                self.hogwild,
            )
            for p in range(self.shards)
        ]
        return self

    def parameters(self) -> dict[str, np.ndarray]:
        """Copies of the parameters: ``hidden_weights`` ``(n_features, H)``, ``hidden_bias``,
        ``output_weights`` ``(N, H)`` (neuron-major: the transpose of the layer matrix in the
        ``(n_in, n_out)`` convention) and ``output_bias``."""
        self._check_fitted()
        out_w = np.empty((self.n_labels_, self.hidden), dtype=self.dtype)
        out_b = np.empty(self.n_labels_, dtype=self.dtype)
        for shard in self.shards_:
            out_w[shard.ids] = shard.weights
            out_b[shard.ids] = shard.bias
        return {
            "hidden_weights": self.hidden_layer_.weights.copy(),
            "hidden_bias": self.hidden_layer_.bias.copy(),
            "output_weights": out_w,
            "output_bias": out_b,
        }

    def _check_fitted(self) -> None:
        if self.n_labels_ is None:
            raise ValueError("the model has no parameters yet: call fit or initialize first")

    # ------------------------------------------------------------ data
    def _check_training(self, X, Y) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        X = check_features(X, self.n_features_in_, self.dtype)
        ptr, ids, width = check_labels(Y, X.shape[0], self.n_labels_, training=True)
        if self.n_labels_ is None:
            ShardMap.make(width, self.shards, self.seed)  # more shards than neurons
            self.initialize(X.shape[1], width)
        self.shard_map_.check_budgets(ptr, ids, self.active_fraction)
        return X, ptr, ids

    def _train_batches(self, batches: list, after, optimizer: Optimizer) -> list[float]:
        return [self._train_batch(X, ptr, ids) for X, ptr, ids in batches]

    def _interrupted(self) -> None:
        """A ``fit`` call was interrupted: a step runs whole in the process; nothing to do."""

    # ------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> None:
        """Write the model (hyperparameters, weights, biases, Adam state, hash tables, step and
        epoch counts, loss curve) to the ``.npz`` file ``path`` atomically, in the format of
        :mod:`dasknn.sampled.persistence`; :meth:`load` reads it back.

        Raises
        ------
        ValueError
            If the model has no parameters yet.
        """
        write_sampled(path, self._record())

    @classmethod
    def load(cls, path: str | os.PathLike) -> SampledMLP:
        """Read a model written by :meth:`save` (or a checkpoint), so that it trains on as the
        saved one would: the same steps, active sets and values. Its ``optimizer`` is the saved
        model's ``optimizer_``. Nothing is unpickled.

        Raises
        ------
        FileNotFoundError
            If ``path`` does not exist.
        ValueError
            Naming ``path``: not a sampled model file (not a zip archive, truncated, corrupt,
            another format), a newer format version, bad hyperparameters, arrays of the wrong
            shape or dtype or not finite, optimizer state or hash tables that do not fit.
        """
        record = read_sampled(path)
        try:
            return cls._of_record(record)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: invalid sampled model file: {exc}") from None

    @classmethod
    def _of_record(cls, record: SampledRecord) -> SampledMLP:
        """A model of ``record`` (its hyperparameters checked as the constructor's arguments,
        its arrays as :meth:`_restore` does; ``ValueError`` or ``TypeError`` otherwise)."""
        names = set(inspect.signature(cls.__init__).parameters) - {"self", "optimizer"}
        if set(record.params) != names:
            raise ValueError(f"the hyperparameters must be {sorted(names)}")
        model = cls(**record.params, optimizer=record.optimizer)
        if model._params_json() != record.params:
            raise ValueError("the hyperparameters do not hold after their checks")
        model._restore(record)
        return model

    def _params_json(self) -> dict:
        """The hyperparameters but ``optimizer``, as JSON values."""
        params = self.get_params()
        del params["optimizer"]
        for name in ("active_fraction", "uniform_fraction", "lr_decay"):
            params[name] = float(params[name])
        for name in ("hidden", "k", "n_tables", "bin_size", "bucket_size", "rehash_every",
                     "rebuild_every", "shards", "seed"):  # fmt: skip
            params[name] = int(params[name])
        if params["decay_horizon"] is not None:
            params["decay_horizon"] = int(params["decay_horizon"])
        params["hogwild"] = bool(params["hogwild"])
        params["dtype"] = str(np.dtype(params["dtype"]))
        return params

    def _identity(self) -> dict:
        return {
            "params": self._params_json(),
            "n_features": self.n_features_in_,
            "n_labels": self.n_labels_,
        }

    def _slot_states(self, slots: OptimizerSlots) -> dict | None:
        """The layer's optimizer state when it belongs to ``optimizer_`` (else the next step
        starts afresh, and nothing is kept)."""
        if slots.optimizer != self.optimizer_ or set(slots.states) != set(STATE_KEYS):
            return None
        return dict(slots.states)

    def _record(self) -> SampledRecord:
        """The model as a record (arrays shared, not copied)."""
        self._check_fitted()
        layer = self.hidden_layer_
        return SampledRecord(
            params=self._params_json(),
            n_features=self.n_features_in_,
            n_labels=self.n_labels_,
            hidden=LayerRecord(layer.weights, layer.bias, self._slot_states(layer.slots)),
            shards=[
                LayerRecord(
                    s.weights, s.bias, self._slot_states(s.slots), s.rebuilds, s.tables.arrays()
                )
                for s in self.shards_
            ],
            optimizer=self.optimizer_,
            n_steps=self.n_steps_,
            epochs=self.epochs_,
            loss_curve=list(self.loss_curve_),
        )

    def _restore(self, record: SampledRecord) -> None:
        """Take the values, optimizer state, hash tables, counts and loss curve of ``record``
        (a record of this network), each array checked first (``ValueError``)."""
        if sampled_identity(record) != {**self._identity(), "n_features": record.n_features,
                                        "n_labels": record.n_labels}:  # fmt: skip
            raise ValueError("a record of another network")
        if not isinstance(record.optimizer, Adam):
            raise ValueError(f"the optimizer must be Adam or AdamW, got {record.optimizer!r}")
        if len(record.shards) != self.shards:
            raise ValueError(f"{len(record.shards)} shards, expected {self.shards}")
        dtype = np.dtype(self.dtype)
        shard_map = ShardMap.make(record.n_labels, self.shards, self.seed)
        hidden_shape = (record.n_features, self.hidden)
        check_layer("hidden", record.hidden, hidden_shape, self.hidden, dtype, record.optimizer)
        cap = shard_bucket_cap(self.bucket_size, self.shards)
        for p, layer in enumerate(record.shards):
            n_p = len(shard_map.ids(p))
            check_layer(f"shard{p}", layer, (n_p, self.hidden), n_p, dtype, record.optimizer)
            check_tables(f"shard {p}", layer.tables, self.n_tables, n_p, cap)
        self.shard_map_ = shard_map
        self.n_features_in_, self.n_labels_ = record.n_features, record.n_labels
        self.hidden_layer_ = HiddenLayer(
            np.array(record.hidden.weights), np.array(record.hidden.bias), self.hogwild,
            self.hidden_update == "all",
        )  # fmt: skip
        self.hidden_layer_.slots = _slots(record.optimizer, record.hidden.states)
        config = self.sampling_config()
        self.shards_ = []
        for p, layer in enumerate(record.shards):
            ids = shard_map.ids(p)
            tables = HashTables(*(np.array(a) for a in layer.tables), len(ids), cap)
            shard = OutputShard(
                p, ids, np.array(layer.weights), np.array(layer.bias), config, self.hogwild,
                layer.rebuilds, tables,
            )  # fmt: skip
            shard.slots = _slots(record.optimizer, layer.states)
            self.shards_.append(shard)
        self.optimizer_ = record.optimizer
        self.n_steps_, self.epochs_ = record.n_steps, record.epochs
        self.loss_curve_ = list(record.loss_curve)

    def train_step(self, X, Y) -> float:
        """One step on the batch ``(X, Y)``; returns its loss before the update. The learning
        rate is constant unless ``decay_horizon`` is given."""
        X, ptr, ids = self._check_training(X, Y)
        self.schedule_ = training_schedule(self.lr_decay, self.decay_horizon, self.n_steps_, None)
        return self._train_batch(X, ptr, ids)

    def _forward(self, X, ptr, ids, active: list[ActiveSet] | None):
        hidden = self.hidden_layer_.forward(X)
        labels = self.shard_map_.split_labels(ptr, ids)
        if active is None:
            active = [
                shard.select(hidden, *labels[p], self.n_steps_)
                for p, shard in enumerate(self.shards_)
            ]
        logits = [shard.logits(hidden, a) for shard, a in zip(self.shards_, active, strict=True)]
        lse = combine_statistics([s for _, s in logits])
        return hidden, active, logits, lse

    def _backward(self, X, ptr, hidden, active, logits, lse) -> float:
        target = 1.0 / np.diff(ptr)
        grad_hidden = None
        loss = None
        for shard, a, (z, _) in zip(self.shards_, active, logits, strict=True):
            g, part = shard.backward(hidden, a, z, lse, target)
            grad_hidden = g if grad_hidden is None else grad_hidden + g
            loss = part if loss is None else loss + part
        self.hidden_layer_.backward(X, hidden, grad_hidden)
        return float(np.mean(loss))

    def _train_batch(self, X, ptr, ids) -> float:
        hidden, active, logits, lse = self._forward(X, ptr, ids, None)
        loss = self._backward(X, ptr, hidden, active, logits, lse)
        scale = 1.0 if self.schedule_ is None else self.schedule_.scale(self.n_steps_)
        for shard in self.shards_:
            shard.apply(self.optimizer_, scale)
        self.hidden_layer_.apply(self.optimizer_, scale)
        self.n_steps_ += 1
        for shard in self.shards_:
            shard.end_step(self.n_steps_)
        return loss

    # ------------------------------------------------------------ sampling
    def active_sets(self, X, Y=None) -> list[np.ndarray]:
        """The global ids each sample would activate at the current step: per sample, an array
        (labels first when ``Y`` is given, as in training; none forced without ``Y``)."""
        self._check_fitted()
        X = check_features(X, self.n_features_in_, self.dtype)
        if Y is None:
            ptr, ids = np.zeros(X.shape[0] + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
        else:
            ptr, ids, _ = check_labels(Y, X.shape[0], self.n_labels_, training=True)
            self.shard_map_.check_budgets(ptr, ids, self.active_fraction)
        hidden = self.hidden_layer_.forward(X)
        labels = self.shard_map_.split_labels(ptr, ids)
        chosen = [s.select(hidden, *labels[p], self.n_steps_) for p, s in enumerate(self.shards_)]
        pairs = list(zip(self.shards_, chosen, strict=True))
        return [
            np.concatenate([s.ids[a.active[b, : a.count[b]]] for s, a in pairs])
            for b in range(X.shape[0])
        ]

    def sampled_gradients(self, X, Y, active: list[ActiveSet]) -> tuple[float, dict]:
        """Loss and gradients of the sampled softmax with given active sets (one
        :class:`~dasknn.sampled.layers.ActiveSet` a shard, local ids, labels first); nothing is
        updated. Gradients are keyed as :meth:`parameters`."""
        X, ptr, ids = self._check_training(X, Y)
        hidden, active, logits, lse = self._forward(X, ptr, ids, active)
        loss = self._backward(X, ptr, hidden, active, logits, lse)
        layer = self.hidden_layer_
        grads = {"hidden_weights": layer.grad_w.copy(), "hidden_bias": layer.grad_b.copy()}
        layer.grad_w[:] = 0
        layer.grad_b[:] = 0
        layer.touched[:] = False
        out_w = np.zeros((self.n_labels_, self.hidden), dtype=self.dtype)
        out_b = np.zeros(self.n_labels_, dtype=self.dtype)
        for shard in self.shards_:
            out_w[shard.ids] = shard.grad_w
            out_b[shard.ids] = shard.grad_b
            shard.grad_w[:] = 0
            shard.grad_b[:] = 0
            shard.touched[:] = False
        grads.update(output_weights=out_w, output_bias=out_b)
        return loss, grads

    # ------------------------------------------------------------ inference
    def predict(self, X, k: int = 1, batch_size: int = 256) -> np.ndarray:
        """The ``k`` labels of highest score for each row, exact over all output neurons:
        ``(n, k)`` global ids, best first (ties: smaller id)."""
        self._check_fitted()
        k = check_k(k, self.n_labels_)
        X = check_features(X, self.n_features_in_, self.dtype)
        out = []
        for start in range(0, X.shape[0], batch_size):
            hidden = self.hidden_layer_.forward(X[start : start + batch_size])
            out.append(merge_top_k([s.top_k(hidden, k) for s in self.shards_], k))
        return np.concatenate(out)

    def precision_at_k(self, X, Y, k: int = 1) -> float:
        """Precision@k of :meth:`predict` against the labels ``Y``."""
        return predicted_precision_at_k(self, X, Y, k)

    def score(self, X, Y) -> float:
        """Precision@1 against the labels ``Y`` (higher is better, as scikit-learn expects): the
        fraction of rows whose top label is one of theirs."""
        return self.precision_at_k(X, Y, k=1)


def label_rows(ptr: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> tuple:
    """The CSR labels of the given rows."""
    counts = np.diff(ptr)[rows]
    new_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    take = np.concatenate([np.arange(ptr[r], ptr[r + 1]) for r in rows]) if len(rows) else []
    return new_ptr, ids[np.asarray(take, dtype=np.int64)]


def _slots(optimizer: Optimizer, states: dict | None) -> OptimizerSlots:
    """The optimizer slots of a layer restored from ``states`` (copies), or fresh ones."""
    if states is None:
        return OptimizerSlots()
    copies = {k: type(v)(v.step, {n: np.array(a) for n, a in v.arrays.items()})
              for k, v in states.items()}  # fmt: skip
    return OptimizerSlots(optimizer, copies)


def _schedule_call(model, steps: int | None) -> dict:
    """What of a ``fit`` call's learning-rate schedule a resume must repeat: the steps it decays
    over when they are the call's own (``lr_decay`` without ``decay_horizon``), which a call of
    other ``epochs`` would change."""
    if model.lr_decay == 0 or model.decay_horizon is not None or steps is None:
        return {}
    return {"schedule_steps": steps}
