"""Model-parallel training of sparse MLPs on Dask: layout, communication plan, task graphs, and
the measured communication volume."""

from dasknn.model_parallel.comm import CommMonitor, CommReport, install_comm_monitor
from dasknn.model_parallel.model import DistributedSparseMLP
from dasknn.model_parallel.plan import CommPlan, LayerPartPlan, build_comm_plan, normalize_partition

__all__ = [
    "CommMonitor",
    "CommPlan",
    "CommReport",
    "DistributedSparseMLP",
    "LayerPartPlan",
    "build_comm_plan",
    "install_comm_monitor",
    "normalize_partition",
]
