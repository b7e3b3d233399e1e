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
from collections.abc import Callable, Iterator

import numpy as np
import scipy.sparse as sp
from tqdm import tqdm

from dasknn.exceptions import NonFiniteLossError
from dasknn.optim import Adam, Optimizer
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
)
from dasknn.sampled.schedule import DecaySchedule, training_schedule
from dasknn.sampled.sharding import ShardMap

__all__ = [
    "SampledMLP",
    "check_seed",
    "EpochBar",
    "epoch_batches",
    "epoch_loss",
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


def epoch_loss(
    train_batch: Callable[[sp.csr_matrix, np.ndarray, np.ndarray], float],
    X: sp.csr_matrix,
    ptr: np.ndarray,
    ids: np.ndarray,
    batch_size: int,
    seed: int,
    epoch: int,
    shuffle: bool,
) -> float:
    """Train one epoch and return its mean loss over the rows.

    Parameters
    ----------
    train_batch : callable
        ``train_batch(X_rows, ptr, ids)`` takes one step on a batch (its CSR labels) and returns
        the batch's mean loss.
    X : scipy.sparse.csr_matrix
        Checked features of every row.
    ptr, ids : numpy.ndarray
        Checked CSR labels of every row.
    batch_size, seed, epoch : int
        The batches of :func:`epoch_batches`.
    shuffle : bool

    Returns
    -------
    float
        The batch losses weighted by the batches' rows, divided by the rows of ``X``.
    """
    total = 0.0
    for rows in epoch_batches(X.shape[0], batch_size, seed, epoch, shuffle):
        batch_ptr, batch_ids = label_rows(ptr, ids, rows)
        total += train_batch(X[rows], batch_ptr, batch_ids) * len(rows)
    return total / X.shape[0]


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


class EpochBar:
    """A progress bar over one epoch's batches (nothing shown unless ``show``); ``wrap(step)``
    counts each call of ``step`` and shows its loss."""

    def __init__(self, rows: int, batch_size: int, epoch: int, show: bool) -> None:
        self.bar = tqdm(
            total=-(-rows // batch_size), desc=f"epoch {epoch + 1}", disable=not show, leave=True
        )

    def wrap(self, step: Callable[..., float]) -> Callable[..., float]:
        def counted(*args) -> float:
            loss = step(*args)
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
            return loss

        return counted

    def __enter__(self) -> EpochBar:
        return self

    def __exit__(self, *exc_info) -> None:
        self.bar.close()


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


class SampledMLP:
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
    n_steps_ : int
        Training steps taken.
    """

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
    ) -> SampledMLP:
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

        Returns
        -------
        SampledMLP
            This model.
        """
        return self._fit(X, Y, epochs, batch_size, shuffle, seed, progress, lr, optimizer, True)

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
    ) -> SampledMLP:
        """One epoch over ``(X, Y)`` (the arguments of :meth:`fit` but ``epochs``); returns the
        model. The learning rate stays constant unless ``decay_horizon`` is given."""
        return self._fit(X, Y, 1, batch_size, shuffle, seed, progress, lr, optimizer, False)

    def _fit(
        self, X, Y, epochs, batch_size, shuffle, seed, progress, lr, optimizer, whole: bool
    ) -> SampledMLP:
        """``epochs`` epochs; ``whole``: the call's steps are the schedule's (``fit``)."""
        check_positive_int("epochs", epochs)
        check_positive_int("batch_size", batch_size)
        chosen = training_optimizer(self.optimizer_, lr, optimizer)
        order_seed = self.seed if seed is None else check_seed(seed)
        X, ptr, ids = self._check_training(X, Y)
        self.optimizer_ = chosen
        steps = epochs * -(-X.shape[0] // batch_size) if whole else None
        self.schedule_ = training_schedule(self.lr_decay, self.decay_horizon, self.n_steps_, steps)
        for _ in range(epochs):
            with EpochBar(X.shape[0], batch_size, self.epochs_, progress) as bar:
                loss = epoch_loss(
                    bar.wrap(self._checked_batch), X, ptr, ids, batch_size, order_seed,
                    self.epochs_, shuffle,
                )  # fmt: skip
            self.epochs_ += 1
            self.loss_curve_.append(loss)
        return self

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

    def _checked_batch(self, X, ptr, ids) -> float:
        """:meth:`_train_batch`, raising :class:`NonFiniteLossError` if its loss is not finite."""
        loss = self._train_batch(X, ptr, ids)
        NonFiniteLossError.check([loss], self.n_steps_)
        return loss

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
