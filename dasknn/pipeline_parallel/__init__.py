"""Pipeline (inter-layer) and compressed-gradient data parallelism of pruned networks (SAMO):
stages of consecutive layers, GPipe and 1F1B schedules as task-graph dependencies, replicas that
allreduce only the unpruned gradients, and the planner that picks stages and replicas from a
memory limit."""

from dasknn.pipeline_parallel._model import (
    DistributedCompressedMLP,
    IdleBreakdown,
    balanced_bounds,
)
from dasknn.pipeline_parallel._plan import (
    ParallelPlan,
    compressed_layer_bytes,
    dense_layer_bytes,
    layer_costs,
    plan_parallelism,
    split_stages,
)
from dasknn.pipeline_parallel._schedule import SCHEDULES, bubble_fraction, stage_order

__all__ = [
    "SCHEDULES",
    "DistributedCompressedMLP",
    "IdleBreakdown",
    "ParallelPlan",
    "balanced_bounds",
    "bubble_fraction",
    "compressed_layer_bytes",
    "dense_layer_bytes",
    "layer_costs",
    "plan_parallelism",
    "split_stages",
    "stage_order",
]
