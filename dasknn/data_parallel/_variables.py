"""How much of each variable a worker touches per step (Parallax, 2.2): a variable's alpha is the
mean fraction of its elements a worker touches in a step (1 if dense); the model's alpha weights
each variable by its size."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dasknn.data_parallel._plan import StepPlan
from dasknn.model.embedding_network import EmbeddingSpec

__all__ = ["VariableStats", "classify"]


def classify(spec: EmbeddingSpec) -> dict[str, tuple[int, ...]]:
    """The shape of every variable: the sparse ones (embedding, sampled-softmax table), then the
    dense ones."""
    dense = zip(spec.dense_names(), spec.dense_shapes(), strict=True)
    return {**spec.sparse_shapes(), **{name: tuple(shape) for name, shape in dense}}


@dataclass
class VariableStats:
    """Running alpha of the variables ``shapes`` (:func:`classify`)."""

    shapes: dict[str, tuple[int, ...]]
    touched: dict[str, float] = field(default_factory=dict)
    samples: int = 0

    def record(self, plan: StepPlan) -> None:
        """Count one step of the plan ``plan`` (the distinct rows every worker touched)."""
        for name, shape in self.shapes.items():
            fraction = 1.0
            if name in plan.machines:  # a sparse variable
                touched = sum(len(batch.ids[name]) for batch in plan.batches)
                fraction = touched / (shape[0] * len(plan.batches))
            self.touched[name] = self.touched.get(name, 0.0) + fraction
        self.samples += 1

    def alpha(self) -> dict[str, float]:
        """Alpha per variable (empty before the first step)."""
        return {name: total / self.samples for name, total in self.touched.items()}

    def model_alpha(self) -> float | None:
        """The size-weighted alpha of the model (``None`` before the first step)."""
        if not self.samples:
            return None
        sizes = {name: int(np.prod(shape)) for name, shape in self.shapes.items()}
        return sum(a * sizes[name] for name, a in self.alpha().items()) / sum(sizes.values())
