"""Shared fixtures: the read-only data beside the project, and a real Dask LocalCluster."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _has_nvidia_gpu() -> bool:
    """True when this machine shows an NVIDIA GPU device node (checked without loading numba)."""
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir()


# The CUDA kernels run on numba's CUDA simulator where no GPU is present. The variable must be set
# before numba is imported here or in any worker process that the test clusters start.
if not _has_nvidia_gpu():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
OFFICIAL_1024 = SHARED / "data" / "graphchallenge" / "neuron1024"
MNIST_DIR = SHARED / "data" / "mnist"


SLOW_REASON = "slow test; run with --runslow (or -m slow)"


def pytest_addoption(parser):
    """``--runslow``: also run the tests marked ``slow`` (skipped by default; CI runs them)."""
    parser.addoption(
        "--runslow",
        action="store_true",
        default=False,
        help="also run the tests marked slow (skipped by default; .ci/run runs them)",
    )


#: ``dasknn precompile`` running in the background while the tests run (``pytest_sessionstart``).
_PRECOMPILE: list[subprocess.Popen] = []


def _lowest_priority() -> None:
    os.nice(19)


def pytest_sessionstart(session):
    """Start ``dasknn precompile`` at the lowest CPU priority: on a fresh clone it fills numba's
    cache with the kernels on the core the tests leave idle (the test process mostly waits for
    its workers), so that the tests and their workers load kernels instead of compiling them
    one after another. A kernel a test reaches first is compiled by the test as without it;
    the results are the same either way."""
    _PRECOMPILE.append(
        subprocess.Popen(
            [sys.executable, "-m", "dasknn", "precompile", "--quiet"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_lowest_priority,
        )
    )


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``slow`` unless ``--runslow`` is given or the ``-m`` expression
    names ``slow`` (``-m slow`` runs only them, ``-m "not slow"`` none of them)."""
    if config.getoption("--runslow") or "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason=SLOW_REASON)
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def official_1024_dir() -> Path:
    """The official 1024-neuron challenge network; skips when ``../shared`` is absent."""
    if not (OFFICIAL_1024 / "n1024-l1.tsv.gz").exists():
        pytest.skip("../shared/data/graphchallenge/neuron1024 is not available")
    return OFFICIAL_1024


@pytest.fixture(scope="session")
def shared_mnist_dir() -> Path:
    """The MNIST test set in ``../shared``; skips when absent."""
    if not (MNIST_DIR / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip("../shared/data/mnist is not available")
    return MNIST_DIR


@pytest.fixture(scope="session")
def dask_client():
    """A real ``distributed.LocalCluster`` (2 worker processes x 1 thread) and its client."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A one-node SLURM (munged, slurmctld, slurmd; Debian's ``slurm-wlm`` and ``munge``,
    installed with apt-get where missing) for the whole test run; yields its environment
    (``SLURM_CONF`` for ``sbatch``, ``squeue``, ``scancel``). Skips with the reason where that is
    impossible."""
    from system_packages import OneNodeSlurm, require_packages

    require_packages(
        {"munged": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm"}
    )
    system = OneNodeSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        system.start()
    except RuntimeError as exc:
        system.stop()
        pytest.skip(f"the one-node SLURM did not start: {exc}")
    try:
        yield system
    finally:
        system.stop()


@pytest.fixture(scope="session")
def chromium() -> str:
    """The headless browser (Debian's ``chromium``, installed with apt-get where missing)."""
    from system_packages import require_packages

    require_packages({"chromium": "chromium"})
    return shutil.which("chromium")


def pytest_terminal_summary(terminalreporter):
    """Print how long the apt-get installs of the test run took (CI runs them on a fresh
    machine)."""
    from system_packages import INSTALL_SECONDS

    for step, seconds in INSTALL_SECONDS.items():
        terminalreporter.write_line(f"{step}: {seconds:.1f} s")


def pytest_sessionfinish(session):
    """Collect garbage before the terminal summary: tasks that distributed left failing after a
    test cancelled a gather log their error with a formatted traceback when collected, and a
    collection that falls inside a later ``ast.parse`` (pytest's rewriting of a plugin module
    imported at the summary) makes CPython 3.11.7 fail with "SystemError: AST constructor
    recursion depth mismatch". Stop ``dasknn precompile`` if it still runs (a short run)."""
    gc.collect()
    for process in _PRECOMPILE:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def short_switch_interval():
    """The module's simulated kernels run with a short thread switch interval in this process
    (``tests/simulator_threads.py``); on a GPU nothing changes."""
    from simulator_threads import simulator_switch_interval  # numba after NUMBA_ENABLE_CUDASIM

    with simulator_switch_interval():
        yield


@pytest.fixture(scope="module")
def simulator_dask_client(dask_client):
    """The shared ``dask_client`` fixture for a module whose engine tests simulate the CUDA
    kernels in its workers: they switch threads more often while the module runs
    (``tests/simulator_threads.py``); on a GPU nothing changes."""
    from simulator_threads import workers_switch_interval  # numba after NUMBA_ENABLE_CUDASIM

    with workers_switch_interval(dask_client):
        yield dask_client
