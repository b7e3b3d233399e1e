"""A numba-cuda that cannot compile kernels with the installed numpy: one clear error, early.

numba-cuda 0.30.4 with numpy 2.5.2 fails at each process's first CUDA kernel compile, because numpy
2.5 removed ``numpy.row_stack`` and numba-cuda's numpy lowering registers an overload of it. Here a
process (or a worker, through a preload that runs before anything imports numba) is given a numpy
without ``row_stack``, as numpy 2.5 is, and
:func:`dasknn.kernels.cuda_inference.check_cuda_compiler` must name the versions, the missing
function and what to install, before anything is scheduled.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Client, LocalCluster
from stopped_workers import wait_until_empty

from dasknn.cli import main
from dasknn.datasets import radixnet, write_sparse_tsv
from dasknn.kernels.cuda_inference import check_cuda_compiler, cuda_runtime

ROOT = Path(__file__).resolve().parents[1]

# numpy 2.5 has no ``row_stack``, neither as an attribute nor in ``__all__`` (a worker runs its
# preload twice: imported, then reloaded).
WITHOUT_ROW_STACK = (
    "import numpy\n"
    "if hasattr(numpy, 'row_stack'):\n"
    "    del numpy.row_stack\n"
    "    numpy.__all__.remove('row_stack')\n"
)


def test_the_installed_numba_compiles_with_the_installed_numpy():
    check_cuda_compiler()


def test_a_numpy_without_row_stack_is_named_once_per_process():
    script = WITHOUT_ROW_STACK + (
        "from dasknn.kernels.cuda_inference import check_cuda_compiler\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        check_cuda_compiler()\n"
        "    except RuntimeError as error:\n"
        "        print(error)\n"
        "    else:\n"
        "        print('no error')\n"
        "    numpy.row_stack = numpy.vstack  # the result of the first check is kept\n"
    )
    # the checkout first, then whatever the run was given (a --target install, as on the GPU
    # machine, where distributed is found only there)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
    message = lines[0]
    assert f"numba {metadata.version('numba')}" in message
    assert f"cannot compile CUDA kernels with numpy {np.__version__}" in message
    assert "AttributeError: module 'numpy' has no attribute 'row_stack'" in message
    major, minor = np.__version__.split(".")[:2]
    assert f"python3 -m pip install 'numpy<{major}.{minor}'" in message
    assert "numba-cuda release that supports" in message


def _scheduler_tasks(dask_scheduler=None) -> list[str]:
    return list(dask_scheduler.tasks)


def _has_row_stack() -> bool:
    return hasattr(np, "row_stack")


@pytest.mark.skipif(cuda_runtime() != "simulator", reason="the workers run numba's simulator")
def test_workers_whose_numba_cannot_compile_are_named_before_anything_runs(tmp_path, capsys):
    net = tmp_path / "net"
    net.mkdir()
    for k, w in enumerate(radixnet(64, 2, seed=1), start=1):
        write_sparse_tsv(net / f"n64-l{k}.tsv", w)
    inputs = tmp_path / "x.tsv"
    x = sp.random(8, 64, density=0.5, random_state=0, format="csr")
    x.data[:] = 1.0
    write_sparse_tsv(inputs, x)
    out = tmp_path / "cats.tsv"
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            preload=[WITHOUT_ROW_STACK],
        ) as cluster,
        Client(cluster) as client,
    ):
        assert client.run(_has_row_stack) == {cluster.workers[0].worker_address: False}
        code = main(
            [
                "challenge",
                "--network",
                str(net),
                "--inputs",
                str(inputs),
                "--bias",
                "-0.3",
                "--device",
                "cuda",
                "--categories",
                str(out),
                "--quiet",
                "--scheduler",
                cluster.scheduler_address,
            ]
        )
        err = capsys.readouterr().err.strip()
        worker = cluster.workers[0].worker_address
        assert code == 2
        assert "\n" not in err
        assert err.startswith(f"dasknn challenge: error: worker {worker}: ")
        assert f"cannot compile CUDA kernels with numpy {np.__version__}" in err
        assert "no attribute 'row_stack'" in err and "python3 -m pip install 'numpy<" in err
        assert not out.exists()
        wait_until_empty(
            lambda: client.run_on_scheduler(_scheduler_tasks),
            5,
            "a key of the run stayed on the scheduler",
        )
