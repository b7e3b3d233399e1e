"""Memory accounting of compressed model states, beside the SAMO paper's formulas (Singh &
Bhatele, Section III-D), in bytes, with ``phi`` weights before pruning and ``f = 1 - p``: mixed
precision with Adam ``20 phi``; SAMO ``2 phi + 24 f phi``; dense float32 Adam ``16 phi``; PyTorch's
pruning utilities with Adam ``24 phi`` (what each counts: docs/samo.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CATEGORIES", "MemoryReport", "formula_bytes", "FORMULAS"]

CATEGORIES = ("weights", "gradients", "optimizer_states", "index", "temporaries")

#: ``bytes / phi`` as a function of ``f``, by name.
FORMULAS = {
    "mixed_precision": lambda f: 20.0,
    "samo": lambda f: 2.0 + 24.0 * f,
    "dense_fp32_adam": lambda f: 16.0,
    "torch_prune_adam": lambda f: 24.0,
}


def formula_bytes(name: str, phi: int, sparsity: float) -> float:
    """Bytes of the model states of ``phi`` weights pruned to ``sparsity`` under formula ``name``.

    Parameters
    ----------
    name : str
        A key of :data:`FORMULAS`.
    phi : int
        Weights of the dense network.
    sparsity : float
        Share pruned, in ``[0, 1]``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        For an unknown ``name``.
    """
    if name not in FORMULAS:
        raise ValueError(f"unknown formula {name!r}; expected one of {sorted(FORMULAS)}")
    return FORMULAS[name](1.0 - sparsity) * phi


@dataclass
class MemoryReport:
    """Exact bytes of a model's states by category, and the paper's figures beside them.

    Attributes
    ----------
    categories : dict
        Bytes by category (:data:`CATEGORIES`, described in docs/samo.md).
    phi : int
        Weights before pruning.
    nnz : int
        Unpruned weights.
    precision, compute : str
    formulas : dict
        ``{name: bytes}`` of :data:`FORMULAS` at this ``phi`` and sparsity.
    """

    categories: dict[str, int]
    phi: int
    nnz: int
    precision: str
    compute: str
    formulas: dict[str, float] = field(default_factory=dict)

    @property
    def sparsity(self) -> float:
        return 1.0 - self.nnz / self.phi

    @property
    def total(self) -> int:
        """Bytes of every category together."""
        return sum(self.categories.values())

    @property
    def states(self) -> int:
        """Bytes of the model states the paper counts (every category but ``temporaries``)."""
        return self.total - self.categories.get("temporaries", 0)

    def format(self) -> str:
        """A small table: categories, total, and each formula with the saving against it."""
        lines = [
            f"model states: phi={self.phi}, nnz={self.nnz} (p={self.sparsity:.3f}), "
            f"precision={self.precision}, compute={self.compute}"
        ]
        for name in CATEGORIES:
            lines.append(f"  {name:17s} {self.categories.get(name, 0):>14,d} B")
        lines.append(f"  {'total':17s} {self.total:>14,d} B")
        for name, value in self.formulas.items():
            saving = 1.0 - self.states / value
            lines.append(f"  formula {name:17s} {value:>14,.0f} B  (states {saving:+.1%} below it)")
        return "\n".join(lines)
