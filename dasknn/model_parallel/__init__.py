"""Model-parallel training of sparse MLPs on Dask: layout, communication plan, task graphs, and
the measured communication volume beside the plan's prediction."""

from dasknn.model_parallel._model import DistributedSparseMLP
from dasknn.model_parallel._plan import (
    CommPlan,
    LayerPartPlan,
    build_comm_plan,
    normalize_partition,
)

__all__ = [
    "CommPlan",
    "DistributedSparseMLP",
    "LayerPartPlan",
    "build_comm_plan",
    "normalize_partition",
]
