"""The sizes of a network (layers, inputs, outputs, neurons per layer) from its layer shapes."""

from __future__ import annotations

__all__ = ["LayerShapes"]


class LayerShapes:
    """The sizes of a network read from its ``layer_shapes``, the ``(n_in, n_out)`` of every
    layer (an attribute or a property of the model).

    Attributes
    ----------
    layer_shapes : list of (int, int)
    """

    layer_shapes: list[tuple[int, int]]

    @property
    def n_layers(self) -> int:
        """Number of weight layers ``L``."""
        return len(self.layer_shapes)

    @property
    def n_inputs(self) -> int:
        """Width ``n_0`` of an input sample."""
        return self.layer_shapes[0][0]

    @property
    def n_outputs(self) -> int:
        """Width ``n_L`` of the output layer."""
        return self.layer_shapes[-1][1]

    @property
    def layer_sizes(self) -> list[int]:
        """Neurons per layer ``[n_0, n_1, ..., n_L]``, inputs first."""
        return [self.n_inputs] + [shape[1] for shape in self.layer_shapes]
