"""Model-parallel training of sparse MLPs on Dask (see docs/training.md)."""

from dasknn.model_parallel._model import DistributedSparseMLP
from dasknn.model_parallel._plan import (
    CommPlan,
    LayerPartPlan,
    build_comm_plan,
    normalize_partition,
)

__all__ = [
    "CommPlan", "DistributedSparseMLP", "LayerPartPlan", "build_comm_plan", "normalize_partition",
]
