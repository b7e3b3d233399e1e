"""One data-parallel worker's compute against PyTorch's, one process and one thread each.

The large-vocabulary model of ``dataparallel.py --models zipf`` (V = 2^18, d = 256, mean of 4
Zipf-distributed ids, hidden 256 ReLU, 1,024 classes, float32), one worker's share of the global
batch of 1,024 windows (``--windows``, default 256: N = 4):

- **dasknn**: what a worker's ``compute`` does (``dasknn.data_parallel.steps.compute``): the
  forward and backward pass of ``batch_gradients`` on the batch's distinct rows (gather, hidden
  layer, output layer, softmax cross-entropy, backward, scatter-add into the rows' gradient),
  the dense gradients written into a new flat buffer, the temporaries in a ``Workspace`` kept
  from one step to the next (where the code has one);
- **PyTorch**: the same model's forward and backward (``EmbeddingBag(mode="mean",
  sparse=True)``, ``Linear``, ReLU, ``Linear``, ``cross_entropy``), as each DDP process of
  ``dataparallel.py`` runs it, gradients set to ``None`` before each pass.

Each runs in a child process with one thread (``NUMBA_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` = 1, ``torch.set_num_threads(1)``), the median of
``--repeats`` passes after a warm-up; once in a plain environment and once with the environment
Dask's nanny gives its workers (``distributed.nanny.pre-spawn-environ``: glibc's
``MALLOC_TRIM_THRESHOLD_``, which makes every large new array fresh memory from the system, its
pages faulted in again each step). DDP's processes run in the plain one. ``--code DIR`` times
the dasknn package found under ``DIR`` instead (a checkout of an earlier commit)::

    PYTHONPATH=. python3 benchmarks/dataparallel_compute.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import describe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ONE_THREAD = ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _median_ms(func, repeats: int) -> float:
    func()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def child(windows: int, repeats: int) -> dict:
    """Time both passes in this process (run with one thread by :func:`main`)."""
    from dataparallel import make_model, zipf_setup

    from dasknn.model import embedding_network as net

    setup = {**zipf_setup(1), "sampled": False}
    model = make_model(setup)
    X, y = setup["batches"][0]
    ids, labels = X[:windows].astype(np.int64), y[:windows].astype(np.int64)
    unique, inverse = net.unique_rows(ids)
    rows = model.embedding[unique]
    dense = model.dense_variables()
    weights, biases = dense[0::2], dense[1::2]
    total = sum(a.size for a in dense)
    denominator = len(setup["batches"][0][1])
    reuse = (net.Workspace(),) if hasattr(net, "Workspace") else ()

    def ours():
        out = (np.empty(total, dtype=np.float32),) if reuse else ()
        net.batch_gradients(
            model.spec, rows, inverse, labels, weights, biases, denominator, *reuse, *out
        )

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    emb = torch.nn.EmbeddingBag(setup["vocab"], setup["dim"], mode="mean", sparse=True)
    hidden = torch.nn.Linear(setup["dim"], setup["hidden"])
    output = torch.nn.Linear(setup["hidden"], setup["classes"])
    params = [*emb.parameters(), *hidden.parameters(), *output.parameters()]
    x, t = torch.from_numpy(ids), torch.from_numpy(labels)

    def theirs():
        for p in params:
            p.grad = None
        loss = torch.nn.functional.cross_entropy(output(torch.relu(hidden(emb(x)))), t)
        loss.backward()

    return {
        "dasknn": _median_ms(ours, repeats),
        "torch": _median_ms(theirs, repeats),
        "workspace": bool(reuse),
    }


def run_child(args, extra_env: dict) -> dict:
    env = {**os.environ, **dict.fromkeys(ONE_THREAD, "1"), **extra_env}
    env["PYTHONPATH"] = str(Path(args.code).resolve()) if args.code else str(ROOT)
    command = [sys.executable, __file__, "--child", "--windows", str(args.windows)]
    command += ["--repeats", str(args.repeats)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--code", help="directory holding the dasknn package to time")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.windows, args.repeats)))
        return
    import dask
    import distributed  # noqa: F401 - its configuration defaults

    nanny = {k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()}
    print(f"{describe()}; one worker's share: {args.windows} windows; median of {args.repeats}")
    print("| environment | dasknn | PyTorch | dasknn / PyTorch |")
    print("| --- | --- | --- | --- |")
    for label, env in (("plain", {}), ("Dask worker's", nanny)):
        got = run_child(args, env)
        ratio = got["dasknn"] / got["torch"]
        print(f"| {label} | {got['dasknn']:.2f} ms | {got['torch']:.2f} ms | {ratio:.2f}x |")
    print(f"(workspace: {got['workspace']}; Dask worker's environment: {nanny})")


if __name__ == "__main__":
    main()
