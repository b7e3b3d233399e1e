"""Model-parallel training of sparse MLPs on Dask: layout, communication plan, task graphs, and
the measured communication volume."""

from dasknn.parallel.comm import CommMonitor, CommReport, install_comm_monitor
from dasknn.parallel.model import DistributedSparseMLP
from dasknn.parallel.plan import CommPlan, LayerPartPlan, build_comm_plan, normalize_partition

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
