"""The memory a model-parallel step reuses: the step arrays of the workers' pools
(dasknn.runtime.buffers) and the plugin that keeps freed buffers (dasknn.runtime.worker_memory)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.model_parallel._worker_state import ModelState
from dasknn.runtime.worker_memory import PLUGIN_NAME

glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the tuning applies to glibc's malloc"
)

_FAULTS = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from dasknn.runtime.worker_memory import restore_malloc, tune_malloc
    if sys.argv[1] in ("tuned", "restored"):
        assert tune_malloc()
    if sys.argv[1] == "restored":
        assert restore_malloc()
    def churn():
        for _ in range(20):  # what a layer step does: allocate and fill 8 MiB, then free it
            a = np.empty(2**20)
            a[:] = 1.0
            del a
    churn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    churn()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _page_faults(mode: str) -> int:
    """Minor page faults of 20 allocate-fill-free rounds of 8 MiB, in a fresh process started
    with the environment Dask gives its workers (``MALLOC_TRIM_THRESHOLD_=65536``)."""
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.slow
@glibc_only
def test_tuned_malloc_reuses_freed_buffers_until_restored():
    untuned, tuned = _page_faults("untuned"), _page_faults("tuned")
    restored = _page_faults("restored")
    # Untuned, every round's buffer is new memory from the kernel (hundreds of faults a round
    # even where the kernel maps several pages per fault); tuned, the same memory is reused;
    # restored, the process is back to the nanny's setting.
    assert untuned >= 20 * 100, untuned
    assert tuned <= untuned // 20, (tuned, untuned)
    assert restored >= untuned // 2, (restored, untuned)


def _memory_plugins(client) -> set[str]:
    names = client.run(lambda dask_worker: sorted(dask_worker.plugins))
    return {n for names in names.values() for n in names if n.startswith(PLUGIN_NAME)}


def _holders(client) -> dict[str, tuple[bool, int]]:
    return client.run(
        lambda dask_worker: (
            dask_worker.__dict__.get("dasknn_malloc_tuned", False),
            len(dask_worker.__dict__.get("dasknn_malloc_holders", ())),
        )
    )


@glibc_only
def test_reuse_memory_is_on_by_default_and_undone_on_close(dask_client):
    model = SparseMLP.radixnet(32, 2, seed=0)
    parts = [np.zeros(32, dtype=int)] * 3
    with DistributedSparseMLP(model, dask_client, partition=parts, nparts=1, reuse_memory=False):
        assert _memory_plugins(dask_client) == set()  # malloc left alone
        assert set(_holders(dask_client).values()) == {(False, 0)}
    first = DistributedSparseMLP(model, dask_client, partition=parts, nparts=1)
    try:
        assert _memory_plugins(dask_client) == {f"{PLUGIN_NAME}-{first.token}"}
        with DistributedSparseMLP(model, dask_client, partition=parts, nparts=1):
            assert set(_holders(dask_client).values()) == {(True, 2)}
        assert set(_holders(dask_client).values()) == {(True, 1)}  # the first still holds it
    finally:
        first.close()
    assert _memory_plugins(dask_client) == set()
    assert set(_holders(dask_client).values()) == {(False, 0)}  # thresholds restored


def _pooled(client, token: str) -> dict[str, int]:
    def count(dask_worker) -> int:
        pool = ModelState.on_worker(token, dask_worker).buffers
        return sum(len(free) for free in pool._free.values())

    return client.run(count)


@pytest.mark.parametrize("messages", ["posted", "tasks"])
def test_training_steps_reuse_the_arrays_of_the_steps_before(dask_client, messages):
    model = SparseMLP.radixnet(64, 3, n_outputs=8, seed=0, dtype=np.float32)
    rng = np.random.default_rng(0)
    x = rng.random((64, 64), dtype=np.float32)
    y = rng.random((64, 8), dtype=np.float32)
    with DistributedSparseMLP(model, dask_client, nparts=2, messages=messages,
                              microbatches=2) as dist:  # fmt: skip
        dist.fit(x, y, batch_size=16, lr=0.1, progress=False, shuffle=False)  # 4 steps
        after_one_epoch = _pooled(dask_client, dist.token)
        dist.fit(x, y, batch_size=16, epochs=3, lr=0.1, progress=False, shuffle=False)
        # every step's arrays are back in the pools, and the next steps took them again
        # instead of new ones: the pools hold as many as after the first epoch
        assert all(n > 0 for n in after_one_epoch.values()), after_one_epoch
        assert _pooled(dask_client, dist.token) == after_one_epoch

