"""Optimizers for the sparse networks: SGD (momentum, Nesterov), Adam and AdamW.

An optimizer object holds only hyperparameters (immutable, validated when it is made, small enough
to travel in every task of a distributed step). The state it needs (momentum buffer, first and
second moments, step count) lives beside the parameters it belongs to: one :class:`ParamState`
per parameter array, i.e. per layer's stored weight values and per bias in one process, and per
weight chunk and bias chunk on the worker of the part in the model-parallel runtime. Every state
array has the length of its parameter array, so the weights' state covers the sparsity pattern
only. Whoever owns parameters keeps their states in an :class:`OptimizerSlots`, which makes them
on first use and starts them afresh when the optimizer changes. The updates follow
``torch.optim``'s formulas (see ``docs/training.md``) and run in the numba kernels of
:mod:`dasknn.kernels.optimizers`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import asdict, dataclass, field
from numbers import Real

import numpy as np

from dasknn.kernels.optimizers import adam_update, adam_update_rows, sgd_update

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "NONNEGATIVE_STATES",
    "Optimizer",
    "OptimizerSlots",
    "ParamState",
    "optimizer_config",
    "optimizer_from_config",
    "resolve_optimizer",
]

#: The state arrays that are means of squares (Adam's and AdamW's second moments): a stored
#: state with a negative value is refused on reading.
NONNEGATIVE_STATES = frozenset({"exp_avg_sq"})


def _number(name: str, value, low: float = 0.0, high: float | None = None) -> float:
    """``value`` as a float; ``ValueError`` unless it is a finite real in ``[low, high)``."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < low or (high is not None and value >= high):
        bounds = f"[{low:g}, {high:g})" if high is not None else f">= {low:g}"
        raise ValueError(f"{name} must be a finite number {bounds}, got {value}")
    return value


@dataclass
class ParamState:
    """Optimizer state of one parameter array: its step count and state arrays by name.

    Attributes
    ----------
    step : int
        Updates applied so far.
    arrays : dict of str to numpy.ndarray
        The optimizer's arrays (``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``, ...).
    """

    step: int = 0
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def copy(self) -> ParamState:
        """A copy with its own arrays."""
        return ParamState(step=self.step, arrays={k: v.copy() for k, v in self.arrays.items()})


@dataclass(frozen=True)
class Optimizer:
    """Base class: an optimizer's hyperparameters and its update of one parameter array.

    Attributes
    ----------
    lr : float
        Learning rate, a finite number >= 0.
    """

    lr: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _number("learning rate lr", self.lr))

    def init_state(self, param: np.ndarray) -> ParamState:
        """Fresh state for the parameter array ``param`` (zeros of its length and dtype)."""
        return ParamState()

    def update(self, param: np.ndarray, grad: np.ndarray, state: ParamState) -> None:
        """Apply one step to ``param`` (1-D, in place) from its gradient ``grad``."""
        raise NotImplementedError


@dataclass(frozen=True)
class SGD(Optimizer):
    """Stochastic gradient descent, as ``torch.optim.SGD``.

    Parameters
    ----------
    lr : float
        Learning rate, finite and >= 0.
    momentum : float
        Momentum factor, finite and >= 0 (0: plain SGD, no state).
    dampening : float
        Dampening of the momentum, in ``[0, 1]``.
    weight_decay : float
        L2 penalty added to the gradient (``g + weight_decay * param``), finite and >= 0.
    nesterov : bool
        Nesterov momentum (needs ``momentum > 0`` and ``dampening == 0``).

    Raises
    ------
    ValueError
        For a hyperparameter out of its range, NaN or infinite.
    """

    lr: float = 0.01
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "momentum", _number("momentum", self.momentum))
        object.__setattr__(self, "dampening", _number("dampening", self.dampening))
        if self.dampening > 1:
            raise ValueError(f"dampening must lie in [0, 1], got {self.dampening}")
        object.__setattr__(self, "weight_decay", _number("weight_decay", self.weight_decay))
        if not isinstance(self.nesterov, bool | np.bool_):
            raise ValueError(f"nesterov must be True or False, got {self.nesterov!r}")
        object.__setattr__(self, "nesterov", bool(self.nesterov))
        if self.nesterov and (self.momentum == 0 or self.dampening != 0):
            raise ValueError("Nesterov momentum requires momentum > 0 and dampening == 0")

    def init_state(self, param: np.ndarray) -> ParamState:
        """A zero momentum buffer of ``param``'s length (none without momentum)."""
        if self.momentum == 0:
            return ParamState()
        return ParamState(arrays={"momentum_buffer": np.zeros_like(param)})

    def update(self, param: np.ndarray, grad: np.ndarray, state: ParamState) -> None:
        """``param -= lr * g`` with weight decay and momentum folded into ``g``."""
        t = param.dtype.type
        buf = state.arrays.get("momentum_buffer", param[:0])
        sgd_update(
            param,
            grad,
            buf,
            t(self.lr),
            t(self.momentum),
            t(1.0 - self.dampening),
            t(self.weight_decay),
            self.nesterov,
            state.step == 0,
        )
        state.step += 1


@dataclass(frozen=True)
class Adam(Optimizer):
    """Adam with bias correction and coupled weight decay, as ``torch.optim.Adam``.

    Parameters
    ----------
    lr : float
        Learning rate, finite and >= 0.
    betas : (float, float)
        Decay rates of the first and second moments, each in ``[0, 1)``.
    eps : float
        Added to the denominator, finite and >= 0.
    weight_decay : float
        L2 penalty added to the gradient, finite and >= 0.

    Raises
    ------
    ValueError
        For a hyperparameter out of its range, NaN or infinite.
    """

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    #: Whether weight decay shrinks the parameters directly (AdamW) instead of adding to the
    #: gradient (Adam).
    decoupled = False

    def __post_init__(self) -> None:
        super().__post_init__()
        betas = tuple(self.betas) if isinstance(self.betas, tuple | list) else None
        if betas is None or len(betas) != 2:
            raise ValueError(f"betas must be a pair of numbers, got {self.betas!r}")
        betas = tuple(_number(f"betas[{i}]", b, 0.0, 1.0) for i, b in enumerate(betas))
        object.__setattr__(self, "betas", betas)
        object.__setattr__(self, "eps", _number("eps", self.eps))
        object.__setattr__(self, "weight_decay", _number("weight_decay", self.weight_decay))

    def init_state(self, param: np.ndarray) -> ParamState:
        """Zero first and second moments of ``param``'s length."""
        return ParamState(
            arrays={"exp_avg": np.zeros_like(param), "exp_avg_sq": np.zeros_like(param)}
        )

    def _scalars(self, dtype: np.dtype, step: int) -> tuple:
        """The kernel's scalars at step ``step`` (1 on the first), in ``dtype``."""
        t = dtype.type
        beta1, beta2 = self.betas
        bias_correction1 = 1.0 - beta1**step
        bias_correction2 = 1.0 - beta2**step
        decay = 1.0 - self.lr * self.weight_decay if self.decoupled else 1.0
        coupled = 0.0 if self.decoupled else self.weight_decay
        return (
            t(beta1),
            t(beta2),
            t(1.0 - beta1),
            t(1.0 - beta2),
            t(self.eps),
            t(coupled),
            t(decay),
            t(self.lr / bias_correction1),
            t(math.sqrt(bias_correction2)),
        )

    def update(self, param: np.ndarray, grad: np.ndarray, state: ParamState) -> None:
        """One bias-corrected Adam step (AdamW: after shrinking ``param`` by ``1 - lr * wd``)."""
        state.step += 1
        adam_update(
            param,
            grad,
            state.arrays["exp_avg"],
            state.arrays["exp_avg_sq"],
            *self._scalars(param.dtype, state.step),
        )

    def update_rows(
        self, param: np.ndarray, grad: np.ndarray, state: ParamState, rows: np.ndarray
    ) -> None:
        """One step on the rows ``rows`` of a 2-D ``param`` only (a sparse row update).

        The step count advances as in :meth:`update`; the other rows and their moments stay as
        they are (SLIDE's sparse Adam). With every row listed it is exactly :meth:`update`.
        """
        state.step += 1
        adam_update_rows(
            param,
            grad,
            state.arrays["exp_avg"],
            state.arrays["exp_avg_sq"],
            np.ascontiguousarray(rows, dtype=np.int64),
            *self._scalars(param.dtype, state.step),
        )


@dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay, as ``torch.optim.AdamW``.

    The same parameters as :class:`Adam`, but ``weight_decay`` (default ``0.01``) multiplies the
    parameters by ``1 - lr * weight_decay`` before the Adam step instead of entering the gradient.

    Parameters
    ----------
    lr, betas, eps : float
        As :class:`Adam`'s.
    weight_decay : float
        Decoupled weight decay (default ``0.01``).
    """

    weight_decay: float = 1e-2

    decoupled = True


class OptimizerSlots:
    """The optimizer state of a set of parameter arrays, kept while the optimizer stays the same.

    The state of an array (a :class:`ParamState`, under a key its owner chooses) is made by the
    optimizer's :meth:`~Optimizer.init_state` the first time it is asked for, and kept for later
    steps while they use an equal optimizer (same type and hyperparameters). A step with a
    different optimizer drops every held state first, so each array starts afresh.

    Parameters
    ----------
    optimizer : Optimizer or None
        The optimizer the ``states`` belong to (``None``: no state yet).
    states : mapping of key to ParamState, optional
        Held states (restored from a file or handed over), used as they are, not copied.

    Attributes
    ----------
    optimizer : Optimizer or None
        The optimizer of the last step (``None`` before the first).
    states : dict
        The state of every array stepped since the optimizer last changed, by key.
    """

    def __init__(
        self,
        optimizer: Optimizer | None = None,
        states: Mapping[Hashable, ParamState] | None = None,
    ) -> None:
        if optimizer is None and states:
            raise ValueError("optimizer states need the optimizer they belong to")
        self.optimizer = optimizer
        self.states: dict[Hashable, ParamState] = dict(states or {})

    def state(self, optimizer: Optimizer, key: Hashable, param: np.ndarray) -> ParamState:
        """The state of ``param`` (the array named ``key``) for a step of ``optimizer``.

        Every held state is dropped first when ``optimizer`` differs from the last one; the
        state of ``key`` is made for ``param`` when none is held.
        """
        if optimizer != self.optimizer:
            self.optimizer = optimizer
            self.states = {}
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = optimizer.init_state(param)
        return state

    def update(
        self, optimizer: Optimizer, key: Hashable, param: np.ndarray, grad: np.ndarray
    ) -> None:
        """One step of ``optimizer`` on ``param`` (in place) from ``grad``, with the state of
        ``key`` (see :meth:`state`)."""
        optimizer.update(param, grad, self.state(optimizer, key, param))

    def copy(self) -> OptimizerSlots:
        """A copy whose states have their own arrays (the optimizer is immutable, shared)."""
        return OptimizerSlots(self.optimizer, {k: s.copy() for k, s in self.states.items()})

    @property
    def nbytes(self) -> int:
        """Bytes of the held state arrays."""
        return sum(a.nbytes for s in self.states.values() for a in s.arrays.values())


def resolve_optimizer(lr: float | None, optimizer: Optimizer | None) -> Optimizer:
    """The optimizer of a training call: ``optimizer``, or plain ``SGD(lr)`` (``lr`` default
    0.01).

    Raises
    ------
    ValueError
        If both are given, ``optimizer`` is not an :class:`Optimizer`, or ``lr`` is invalid.
    """
    if optimizer is None:
        return SGD(lr=0.01 if lr is None else lr)
    if lr is not None:
        raise ValueError("give either lr (plain SGD) or optimizer, not both")
    if not isinstance(optimizer, Optimizer):
        raise ValueError(f"optimizer must be a dasknn.optim optimizer, got {optimizer!r}")
    return optimizer


_OPTIMIZERS = {cls.__name__: cls for cls in (SGD, Adam, AdamW)}


def optimizer_config(optimizer: Optimizer) -> dict:
    """The optimizer as plain JSON data: ``{"name": "Adam", "params": {"lr": ..., ...}}``.

    Parameters
    ----------
    optimizer : Optimizer
        Any optimizer of this module.

    Returns
    -------
    dict
        Its class name and hyperparameters; :func:`optimizer_from_config` makes it again.
    """
    params = asdict(optimizer)
    if "betas" in params:
        params["betas"] = list(params["betas"])
    return {"name": type(optimizer).__name__, "params": params}


def optimizer_from_config(config) -> Optimizer:
    """The optimizer described by :func:`optimizer_config`'s output (hyperparameters checked).

    Raises
    ------
    ValueError
        For an unknown optimizer name, unknown or missing hyperparameters, or invalid values.
    """
    if not isinstance(config, dict) or not isinstance(config.get("params"), dict):
        raise ValueError(f"an optimizer is {{'name': ..., 'params': {{...}}}}, got {config!r}")
    cls = _OPTIMIZERS.get(config.get("name"))
    if cls is None:
        raise ValueError(
            f"unknown optimizer {config.get('name')!r}; known: {', '.join(_OPTIMIZERS)}"
        )
    try:
        return cls(**config["params"])
    except TypeError as exc:
        raise ValueError(f"bad hyperparameters for {cls.__name__}: {exc}") from None
