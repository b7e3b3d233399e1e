"""What every distributed mode shares: the cluster to run on (local, a scheduler address,
dask-jobqueue batch jobs; TLS), the base of a distributed model and of its worker plugin, the
communication report, and the step timeout. See docs/runtime.md."""

from dasknn.runtime.cluster import local_cluster, local_cuda_cluster, open_client
from dasknn.runtime.comm_report import CommReport
from dasknn.runtime.distributed_model import DistributedModel
from dasknn.runtime.jobqueue import BATCH_SYSTEMS, JobqueueSpec, start_jobqueue_cluster
from dasknn.runtime.model_plugin import ModelPlugin
from dasknn.runtime.security import temporary_security, tls_security
from dasknn.runtime.step_timeout import DEFAULT_STEP_TIMEOUT

__all__ = [
    "BATCH_SYSTEMS",
    "DEFAULT_STEP_TIMEOUT",
    "CommReport",
    "DistributedModel",
    "JobqueueSpec",
    "ModelPlugin",
    "local_cluster",
    "local_cuda_cluster",
    "open_client",
    "start_jobqueue_cluster",
    "temporary_security",
    "tls_security",
]
