"""``LayerSource``: a sparse network whose layers are made one at a time whenever they are asked
for (read from files or generated), so no process holds them all; a model-parallel model places
it a layer at a time (docs/training.md, "Networks made a layer at a time")."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import scipy.sparse as sp

from dasknn.model.activations import Activation
from dasknn.model.layer_shapes import LayerShapes
from dasknn.model.losses import Loss, network_functions
from dasknn.model.validation import check_bias, check_float_dtype, check_layer

__all__ = ["LayerSource"]


class _Biases(Sequence):
    """The biases of a :class:`LayerSource`, made when indexed: ``biases[k]`` of ``weights[k]``."""

    def __init__(self, make: Callable[[int], np.ndarray] | None, sizes: list[int], dtype) -> None:
        self._make, self._sizes, self._dtype = make, sizes, dtype

    def __len__(self) -> int:
        return len(self._sizes)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        size = self._sizes[k]
        if self._make is None:
            return np.zeros(size, dtype=self._dtype)
        k = range(len(self))[k]
        return check_bias(self._make(k), k, size, self._dtype)


class LayerSource(LayerShapes):
    """A feed-forward sparse network made a layer at a time, as often as asked.

    It stands for a :class:`~dasknn.model.SparseMLP` where the network is too large for one
    process: :class:`~dasknn.model_parallel.DistributedSparseMLP` reads it in passes (its
    partition, renumbering and placement) and holds two layers of it at most.

    Parameters
    ----------
    layers : callable
        ``layers()`` returns a new iterable of the weight matrices, scipy.sparse, ``weights[k]``
        of shape ``layer_shapes[k]``, in order and the same on every call (a generator function,
        or ``lambda: iter_network(spec)``).
    layer_shapes : sequence of (int, int)
        ``(n_k, n_{k+1})`` of every ``weights[k]``.
    biases : callable, optional
        ``biases(k)``: the bias of ``weights[k]``, length ``n_{k+1}``; zeros when omitted.
    activation, output_activation, loss, dtype
        As :class:`~dasknn.model.SparseMLP`'s.

    Raises
    ------
    ValueError
        On shapes that do not chain or no layer; a layer that is not what ``layer_shapes`` says,
        holds a NaN or infinite value, or a bias of the wrong length, when it is made.
    """

    def __init__(
        self,
        layers: Callable[[], Iterable],
        layer_shapes: Sequence[tuple[int, int]],
        biases: Callable[[int], np.ndarray] | None = None,
        activation: str | Activation = "sigmoid",
        output_activation: str | Activation | None = None,
        loss: str | Loss = "mse",
        dtype=np.float64,
    ) -> None:
        if not callable(layers):
            raise ValueError("layers must be a function returning a new iterable of the layers")
        self.dtype = check_float_dtype(dtype)
        self.activation, self.output_activation, self.loss = network_functions(
            activation, output_activation, loss
        )
        shapes = [(int(n_in), int(n_out)) for n_in, n_out in layer_shapes]
        if not shapes:
            raise ValueError("a network needs at least one weight matrix")
        for k in range(1, len(shapes)):
            if shapes[k][0] != shapes[k - 1][1]:
                raise ValueError(
                    f"layer {k + 1} has {shapes[k][0]} input neurons but layer {k} has "
                    f"{shapes[k - 1][1]} output neurons"
                )
        if min(min(shape) for shape in shapes) < 1:
            raise ValueError(f"every layer needs at least one neuron each side, got {shapes}")
        self.layer_shapes = shapes
        self._layers = layers
        self.biases = _Biases(biases, [n_out for _, n_out in shapes], self.dtype)

    def iter_weights(self) -> Iterator[sp.csr_matrix]:
        """The layers, made anew: CSR of ``dtype``, sorted duplicate-free indices, each checked
        as it is made.

        Raises
        ------
        ValueError
            Naming the first layer that is missing, extra, not of its shape, not a valid sparse
            matrix or holding a NaN or infinite value.
        """
        made = 0
        for k, layer in enumerate(self._layers()):
            if k >= self.n_layers:
                raise ValueError(f"the layers go on past the {self.n_layers} layer_shapes give")
            if getattr(layer, "shape", None) != self.layer_shapes[k]:
                raise ValueError(
                    f"weights[{k}] has shape {getattr(layer, 'shape', None)}, expected "
                    f"{self.layer_shapes[k]}"
                )
            yield check_layer(layer, k, self.dtype)
            made = k + 1
        if made != self.n_layers:
            raise ValueError(
                f"the layers end after {made} of the {self.n_layers} layer_shapes give"
            )

    def __repr__(self) -> str:
        return f"LayerSource(layer_sizes={self.layer_sizes}, dtype={self.dtype.name})"
