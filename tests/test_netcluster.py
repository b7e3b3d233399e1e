"""The benchmarks' namespace cluster: shaped links, a working Dask cluster, nothing left behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from harness import NetCluster, unavailable_reason  # noqa: E402

from dasknn.runtime.cluster import scheduler_workers

pytestmark = pytest.mark.skipif(unavailable_reason() is not None,
                                reason=str(unavailable_reason()))


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.slow
def test_two_workers_on_shaped_links():
    from distributed import Client

    with NetCluster(workers=2, rate="1gbit") as cluster, Client(cluster.address) as client:
        workers = sorted(scheduler_workers(client))
        assert len(workers) == 2
        assert all(w.startswith("tcp://10.213.") for w in workers)
        source = client.submit(np.arange, 1_000_000, workers=[workers[0]], pure=False)
        total = client.submit(np.sum, source, workers=[workers[1]], pure=False)
        assert total.result() == np.arange(1_000_000).sum()
        qdisc = subprocess.run(
            ["ip", "netns", "exec", cluster.namespaces[1], "tc", "qdisc", "show", "dev", "eth0"],
            capture_output=True, text=True,
        ).stdout
        assert "tbf" in qdisc and "1Gbit" in qdisc
        # one process a worker's namespace, told its rank, the world and the master's address
        outputs = cluster.run_ranks("-c", "import sys; print(sys.argv[1:])", timeout=60)
        master = workers[0].removeprefix("tcp://").split(":")[0]
        for rank, out in enumerate(outputs):
            assert out.strip() == str(["--rank", str(rank), "--world", "2", "--master", master])
        failed = cluster.run_ranks("-c", "import sys; sys.exit(3)", timeout=60)
        assert failed == [None, None]
        names = cluster.namespaces
    assert not set(names) & set(_namespaces().split())


def test_bad_arguments():
    with pytest.raises(ValueError, match="rate"):
        NetCluster(workers=2, rate="fast")
    with pytest.raises(ValueError, match="workers"):
        NetCluster(workers=0)
