"""Pipeline and compressed-gradient data parallelism of pruned networks (SAMO); see docs/samo.md."""

from dasknn.pipeline_parallel._model import DistributedCompressedMLP
from dasknn.pipeline_parallel._plan import (
    ParallelPlan,
    balanced_bounds,
    compressed_layer_bytes,
    dense_layer_bytes,
    layer_costs,
    plan_parallelism,
    split_stages,
)
from dasknn.pipeline_parallel._schedule import SCHEDULES, bubble_fraction, stage_order
from dasknn.pipeline_parallel._timeline import IdleBreakdown

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
