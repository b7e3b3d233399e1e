"""Dense and sparse variables, and how much of each a worker touches per step (alpha).

``alpha``: the mean fraction of a variable's elements a worker touches in a step (1 if dense);
the model's alpha weights each variable by its size (Parallax, 2.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dasknn.data_parallel._plan import StepPlan
from dasknn.model.embedding_network import EmbeddingSpec

__all__ = ["VariableInfo", "VariableStats", "classify"]


@dataclass(frozen=True)
class VariableInfo:
    """Name, shape and kind (``"dense"`` or ``"sparse"``) of one variable."""

    name: str
    shape: tuple[int, ...]
    kind: str

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


def classify(spec: EmbeddingSpec) -> list[VariableInfo]:
    """The model's variables: the sparse ones (embedding, sampled-softmax table), then the dense."""
    out = [VariableInfo(name, shape, "sparse") for name, shape in spec.sparse_shapes().items()]
    for name, shape in zip(spec.dense_names(), spec.dense_shapes(), strict=True):
        out.append(VariableInfo(name, tuple(shape), "dense"))
    return out


@dataclass
class VariableStats:
    """Running alpha of every variable."""

    variables: list[VariableInfo]
    touched: dict[str, float] = field(default_factory=dict)
    samples: int = 0

    def record(self, plan: StepPlan) -> None:
        """Count one step of the plan ``plan`` (the distinct rows every worker touched)."""
        for info in self.variables:
            if info.kind == "sparse":
                ids = [batch.ids[info.name] for batch in plan.batches]
                fraction = sum(len(u) for u in ids) / (info.shape[0] * len(ids))
            else:
                fraction = 1.0
            self.touched[info.name] = self.touched.get(info.name, 0.0) + fraction
        self.samples += 1

    def alpha(self) -> dict[str, float]:
        """Alpha per variable (empty before the first step)."""
        if not self.samples:
            return {}
        return {name: total / self.samples for name, total in self.touched.items()}

    def model_alpha(self) -> float | None:
        """The size-weighted alpha of the model (``None`` before the first step)."""
        alpha = self.alpha()
        if not alpha:
            return None
        sizes = {info.name: info.size for info in self.variables}
        return sum(alpha[name] * sizes[name] for name in alpha) / sum(sizes.values())
