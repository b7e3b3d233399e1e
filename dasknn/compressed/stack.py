"""Compressed model states of a run of layers (SAMO) and their forward, backward and update.

Each layer's states share one sorted flat index; compute weights are the compressed values
(``compute="sparse"``, :mod:`dasknn.kernels.compressed`) or, as published, a dense storage-dtype
matrix (``"dense"``); a stack's gradients are one flat buffer for one allreduce (docs/samo.md).
Activations are passed in (``forward(z)``, ``derivative(z, a)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dasknn.compressed.index import bits_view, check_index, row_pointers
from dasknn.compressed.precision import Precision
from dasknn.kernels import compressed as kernels
from dasknn.optim import Optimizer, OptimizerSlots, ParamState

__all__ = ["COMPUTES", "CompressedLayer", "CompressedStack"]

COMPUTES = ("sparse", "dense")

#: ``take(shape, dtype)``: an uninitialized C-contiguous array for a pass (``numpy.empty``, or
#: one of a worker's reused buffers).
Take = Callable[..., np.ndarray]


def check_compute(compute: str) -> str:
    """``compute`` if it is one of :data:`COMPUTES`; ``ValueError`` otherwise."""
    if compute not in COMPUTES:
        raise ValueError(f"unknown compute {compute!r}; expected one of {COMPUTES}")
    return compute


class CompressedLayer:
    """One pruned layer's compressed states.

    Parameters
    ----------
    values : 1-D array
        The layer's weights at ``index`` (cast to the arithmetic dtype).
    index : 1-D int array
        Sorted flat positions of the unpruned entries (checked).
    shape : (n_in, n_out)
    bias : 1-D array of length ``n_out``
    precision : Precision
    compute : {"sparse", "dense"}
    grad : 1-D array
        This layer's slice of the stack's gradient buffer (storage dtype, ``nnz + n_out``).
    grad32 : 1-D array or None
        Its slice of the float32 gradient buffer (16-bit storage only).
    """

    def __init__(
        self,
        values: np.ndarray,
        index: np.ndarray,
        shape: tuple[int, int],
        bias: np.ndarray,
        precision: Precision,
        compute: str,
        grad: np.ndarray,
        grad32: np.ndarray | None,
    ) -> None:
        self.shape = (int(shape[0]), int(shape[1]))
        self.index = check_index(index, self.shape)
        self.row_ptr = row_pointers(self.index, self.shape)
        self.precision = precision
        self.compute = check_compute(compute)
        arith = precision.arithmetic
        self.master = np.array(values, dtype=arith, copy=True)
        self.bias = np.array(bias, dtype=arith, copy=True)
        if self.master.shape != self.index.shape:
            raise ValueError(f"{self.master.size} values for an index of {self.index.size}")
        if self.bias.shape != (self.shape[1],):
            raise ValueError(f"the bias must have length {self.shape[1]}, got {self.bias.shape}")
        nnz = self.index.size
        self.grad_w, self.grad_b = grad[:nnz], grad[nnz:]
        self.grad32_w = self.grad32_b = None
        if grad32 is not None:
            self.grad32_w, self.grad32_b = grad32[:nnz], grad32[nnz:]
        # 16-bit compressed compute weights (sparse compute with a 16-bit storage)
        self.values16 = None
        if compute == "sparse" and precision.mixed:
            self.values16 = np.empty(nnz, dtype=precision.storage)
        # dense compute weights (SAMO as published), storage dtype
        self.dense = None
        if compute == "dense":
            self.dense = np.empty(self.shape, dtype=precision.storage)
        self.refresh()
        self.slots = OptimizerSlots()

    @property
    def nnz(self) -> int:
        """Number of unpruned weights."""
        return int(self.index.size)

    def refresh(self) -> None:
        """Rebuild the compute weights from the master copy (downcast, then expand if dense)."""
        if self.values16 is not None:
            self.values16[...] = self.master.astype(self.precision.storage)
        if self.dense is not None:
            compressed = self.master.astype(self.precision.storage)  # SAMO's temporary copy
            kernels.expand(bits_view(compressed), self.index, bits_view(self.dense))

    def _sparse_values(self) -> np.ndarray:
        if self.values16 is None:
            return self.master
        return self.values16.astype(self.precision.arithmetic)

    def _dense_weights(self) -> np.ndarray:
        if self.precision.mixed:
            return self.dense.astype(self.precision.arithmetic)
        return self.dense

    def forward(self, at: np.ndarray, take: Take = np.empty) -> np.ndarray:
        """Feature-major pre-activations ``W.T @ at + b`` of the feature-major inputs ``at``, in
        an array of ``take(shape, dtype)``."""
        zt = take((self.shape[1], at.shape[1]), self.precision.arithmetic)
        if self.compute == "dense":
            np.matmul(self._dense_weights().T, at, out=zt)
        else:
            kernels.flat_forward(
                at, self.row_ptr, self.index, self.shape[1], self._sparse_values(), zt
            )
        zt += self.bias[:, None]
        return zt

    def backward_input(self, deltat: np.ndarray, take: Take = np.empty) -> np.ndarray:
        """``W @ deltat``: the feature-major partial sums of the layer's inputs, in an array of
        ``take(shape, dtype)``."""
        st = take((self.shape[0], deltat.shape[1]), self.precision.arithmetic)
        if self.compute == "dense":
            return np.matmul(self._dense_weights(), deltat, out=st)
        kernels.flat_backward(
            deltat, self.row_ptr, self.index, self.shape[1], self._sparse_values(), st
        )
        return st

    def add_gradient(self, at_prev: np.ndarray, deltat: np.ndarray, first: bool) -> None:
        """Compute the layer's compressed gradient from its inputs and output deltas and store it
        (``first``) or add it to the one held (microbatches of one step)."""
        direct = not self.precision.mixed and self.compute == "sparse"
        if direct:
            kernels.flat_masked_grad(
                at_prev, deltat, self.row_ptr, self.index, self.shape[1], not first, self.grad_w
            )
        else:
            if self.compute == "dense":
                dense_grad = at_prev @ deltat.T  # one layer, compressed at once
                fresh = np.empty(self.nnz, dtype=dense_grad.dtype)
                kernels.compress(dense_grad, self.index, fresh)
                del dense_grad
            else:
                fresh = np.empty(self.nnz, dtype=self.precision.arithmetic)
                kernels.flat_masked_grad(
                    at_prev, deltat, self.row_ptr, self.index, self.shape[1], False, fresh
                )
            with np.errstate(over="ignore"):  # fp16 overflow: inf, found before the update
                if first:
                    self.grad_w[...] = fresh
                else:
                    self.grad_w[...] = self.grad_w.astype(fresh.dtype) + fresh
        bias = deltat.sum(axis=1)
        with np.errstate(over="ignore"):
            if first:
                self.grad_b[...] = bias
            else:
                self.grad_b[...] = self.grad_b.astype(bias.dtype) + bias

    def apply(self, optimizer: Optimizer, inv_scale: float) -> None:
        """One optimizer step on the master weights and bias from the stored gradient times
        ``inv_scale`` (state kept while the optimizer stays equal); compute weights rebuilt."""
        if self.grad32_w is None:
            grad_w, grad_b = self.grad_w, self.grad_b
            if inv_scale != 1.0:
                grad_w, grad_b = grad_w * inv_scale, grad_b * inv_scale
        else:
            self.grad32_w[...] = self.grad_w
            self.grad32_b[...] = self.grad_b
            if inv_scale != 1.0:
                self.grad32_w *= inv_scale
                self.grad32_b *= inv_scale
            grad_w, grad_b = self.grad32_w, self.grad32_b
        self.slots.update(optimizer, "weights", self.master, grad_w)
        self.slots.update(optimizer, "bias", self.bias, grad_b)
        self.refresh()

    @property
    def optimizer_state(self) -> tuple[ParamState, ParamState] | None:
        """The optimizer state of the master weights and of the bias, ``None`` before both
        were stepped."""
        weights, bias = self.slots.states.get("weights"), self.slots.states.get("bias")
        return None if weights is None or bias is None else (weights, bias)

    def restore_optimizer_state(
        self, optimizer: Optimizer, state: tuple[ParamState, ParamState]
    ) -> None:
        """Hold ``state`` (master weights, bias) as ``optimizer``'s, for its next step."""
        self.slots = OptimizerSlots(optimizer, {"weights": state[0], "bias": state[1]})

    def dense_weights(self) -> np.ndarray:
        """The layer's master weights as a dense arithmetic-dtype array."""
        out = np.zeros(self.shape, dtype=self.precision.arithmetic)
        out.reshape(-1)[self.index] = self.master
        return out

    def state_bytes(self) -> dict[str, int]:
        """Bytes held, by category (see :func:`dasknn.compressed.memory.memory_report`)."""
        weights = self.master.nbytes + self.bias.nbytes
        if self.values16 is not None:
            weights += self.values16.nbytes
        if self.dense is not None:
            weights += self.dense.nbytes
        gradients = self.grad_w.nbytes + self.grad_b.nbytes
        if self.grad32_w is not None:
            gradients += self.grad32_w.nbytes + self.grad32_b.nbytes
        return {
            "weights": weights,
            "gradients": gradients,
            "optimizer_states": self.slots.nbytes,
            "index": self.index.nbytes + self.row_ptr.nbytes,
        }


class CompressedStack:
    """A run of consecutive compressed layers: the whole model, or one pipeline stage.

    Parameters
    ----------
    weights : sequence of (values, index, shape)
        Per layer, its unpruned values, flat index and shape; consecutive shapes chain.
    biases : sequence of 1-D arrays
    activations : sequence
        Per layer, its activation (``forward(z)``, ``derivative(z, a)``).
    precision : Precision
    compute : {"sparse", "dense"}
    """

    def __init__(
        self,
        weights: Sequence[tuple],
        biases: Sequence[np.ndarray],
        activations: Sequence,
        precision: Precision,
        compute: str,
    ) -> None:
        check_compute(compute)
        self.precision = precision
        self.compute = compute
        self.activations = list(activations)
        sizes = [len(index) + int(shape[1]) for _, index, shape in weights]
        self.grad = np.zeros(sum(sizes), dtype=precision.storage)
        self.grad32 = np.zeros(self.grad.size, dtype=np.float32) if precision.mixed else None
        self.layers: list[CompressedLayer] = []
        start = 0
        for (values, index, shape), bias, size in zip(weights, biases, sizes, strict=True):
            grad32 = None if self.grad32 is None else self.grad32[start : start + size]
            self.layers.append(
                CompressedLayer(
                    values,
                    index,
                    shape,
                    bias,
                    precision,
                    compute,
                    self.grad[start : start + size],
                    grad32,
                )
            )
            start += size

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def forward(
        self, xt: np.ndarray, activate_last: bool = True, take: Take = np.empty
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Feature-major ``(z_k, a_k)`` of every layer of the stack from its inputs ``xt``, each
        an array of ``take(shape, dtype)`` (default: new); with ``activate_last`` false the last
        layer's activation is left to the caller and its pair is ``(z, z)``."""
        out = []
        at = xt
        last = self.n_layers - 1
        for k, (layer, activation) in enumerate(zip(self.layers, self.activations, strict=True)):
            zt = layer.forward(at, take)
            if activate_last or k < last:
                at = activation.forward(zt, out=take(zt.shape, zt.dtype))
            else:
                at = zt
            out.append((zt, at))
        return out

    def backward(
        self,
        xt: np.ndarray,
        layers: list[tuple[np.ndarray, np.ndarray]],
        deltat: np.ndarray,
        first: bool,
        input_delta: bool,
        take: Take = np.empty,
    ) -> np.ndarray | None:
        """Backward pass from the deltas of the last layer's pre-activations; each gradient
        stored (``first``) or added. Returns ``W_0 @ delta_0`` when ``input_delta``, else
        ``None``. The deltas and derivatives are arrays of ``take(shape, dtype)`` (default:
        new)."""
        for k in range(self.n_layers - 1, -1, -1):
            layer = self.layers[k]
            a_prev = xt if k == 0 else layers[k - 1][1]
            layer.add_gradient(a_prev, deltat, first)
            if k > 0:
                st = layer.backward_input(deltat, take)
                z, a = layers[k - 1]
                st *= self.activations[k - 1].derivative(z, a, out=take(z.shape, z.dtype))
                deltat = st
            elif input_delta:
                return layer.backward_input(deltat, take)
        return None

    def gradients_finite(self) -> bool:
        """Whether every stored gradient is finite (fp16 overflow check)."""
        return bool(np.isfinite(self.grad.astype(np.float32)).all())

    @property
    def optimizer(self) -> Optimizer | None:
        """The optimizer of the last step (``None`` before the first), the same in every layer."""
        return self.layers[0].slots.optimizer if self.layers else None

    def apply(self, optimizer: Optimizer, inv_scale: float = 1.0) -> None:
        """One optimizer step of every layer (state kept while the optimizer stays equal)."""
        for layer in self.layers:
            layer.apply(optimizer, inv_scale)

    def state_bytes(self) -> dict[str, int]:
        """Bytes held by the stack's states, by category."""
        total: dict[str, int] = {}
        for layer in self.layers:
            for key, value in layer.state_bytes().items():
                total[key] = total.get(key, 0) + value
        return total
