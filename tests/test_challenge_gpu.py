"""The Graph Challenge on GPUs: CUDA kernels, the ``device="cuda"`` engine and its errors.

Where no GPU is present the kernels run on numba's CUDA simulator (``tests/conftest.py`` sets
``NUMBA_ENABLE_CUDASIM=1`` before numba is imported, also for the test clusters' workers), so the
same kernel code is checked on every machine against a float64 numpy reference written here and
against the CPU engine. Tests marked ``gpu`` need a real GPU and skip elsewhere.
"""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest
import scipy.sparse as sp
from challenge_reference import reference_activations, reference_categories
from distributed import Client, LocalCluster
from polling import HANG_GUARD, wait_until
from simulator_threads import workers_switch_interval
from stopped_workers import wait_until_empty

from dasknn.challenge import run_challenge
from dasknn.challenge.engine import prepare_run
from dasknn.challenge.worker_network import _same_network
from dasknn.cli import main
from dasknn.datasets import (
    challenge_bias,
    load_mnist_test,
    mnist_to_challenge_inputs,
    radixnet,
    read_categories,
    read_challenge_network,
    write_sparse_tsv,
)
from dasknn.exceptions import StepTimeoutError
from dasknn.inference._gpu_inference import plan_memory
from dasknn.kernels import cuda_inference
from dasknn.kernels.cuda_inference import (
    LANES,
    MAX_NEURONS,
    BitRows,
    CompactLayers,
    DeviceNetwork,
    activation_bytes,
    compact_layers,
    cuda_runtime,
    infer_rows_cuda,
    pack_bit_rows,
    weight_bytes,
)
from dasknn.kernels.inference import advance, live_rows, pack_layers, start_batch

needs_gpu = pytest.mark.skipif(cuda_runtime() != "gpu", reason="no CUDA GPU on this machine")
pytestmark = pytest.mark.usefixtures("short_switch_interval")


def random_network(neurons: int, depth: int, degree: int, seed: int) -> list[sp.csr_matrix]:
    """Layers with ``degree`` random inputs per output neuron, dyadic weights (exact sums)."""
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(depth):
        rows = np.concatenate([rng.choice(neurons, degree, replace=False) for _ in range(neurons)])
        cols = np.repeat(np.arange(neurons), degree)
        values = rng.integers(1, 8, rows.size) / 16.0
        layers.append(sp.csr_matrix((values, (rows, cols)), shape=(neurons, neurons)))
    return layers


def random_inputs(rows: int, neurons: int, density: float, seed: int) -> sp.csr_matrix:
    x = sp.random(rows, neurons, density=density, random_state=seed, format="csr")
    x.data[:] = 1.0
    return x


def test_sectioned_blocks_take_an_eighth_of_the_layer_within_bounds():
    # The launch geometry measured fastest on an H200 (docs/benchmarks.md, GPU section).
    widths = {1024: 1024, 4096: 1024, 16384: 2048, 65536: 4096, 1 << 20: 4096}
    for neurons, outputs in widths.items():
        assert cuda_inference._section_outputs(neurons) == outputs


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "dtype", "bias", "compact_every"),
    [("fused", "float32", -0.3, 1), ("fused", "float64", 0.05, 100),
     ("sectioned", "float64", -0.15, 3), ("sectioned", "float32", -0.3, 2)],
)
def test_kernel_matches_reference(monkeypatch, mode, dtype, bias, compact_every):
    monkeypatch.setattr(cuda_inference, "SECTION_OUTPUTS", 16)  # 2 sections of 32 neurons
    layers = random_network(32, 4, 6, seed=7)
    x = random_inputs(45, 32, 0.4, seed=3).tolil()  # 2 groups, the second one partly empty
    x[10] = 0  # an empty input row is never a category
    x = x.tocsr()
    expected = reference_categories(x, layers, bias)
    assert 0 < expected.size < 45
    result = infer_rows_cuda(x, DeviceNetwork(pack_layers(layers, dtype)), bias,
                             compact_every=compact_every, mode=mode)
    np.testing.assert_array_equal(result.rows, expected)
    assert result.macs_done > 0


@pytest.mark.slow
def test_columns_longer_than_a_warp():
    # 33 inputs a column: a full 32-entry chunk and a second one with one entry; 34 neurons, the
    # fewest that hold 33 distinct inputs and give the simulator's two warps equal columns
    layers = random_network(34, 2, 33, seed=1)
    x = random_inputs(20, 34, 0.3, seed=5)
    expected = reference_activations(x, layers, -0.125)
    rows = np.flatnonzero(expected.any(axis=1))
    network = DeviceNetwork(pack_layers(layers, np.float64))
    for mode in ("fused", "sectioned"):
        result = infer_rows_cuda(x, network, -0.125, compact_every=2, mode=mode, activations=True)
        np.testing.assert_array_equal(result.rows, rows)
        # dyadic weights, bias and inputs: the float64 sums are exact (with or without fma), and
        # the activations, unlike the categories here, change when the 33rd term is left out
        np.testing.assert_array_equal(result.activations, expected[rows])


def cpu_engine_rows(x, layers, bias: float, dtype) -> np.ndarray:
    """Live rows after the CPU engine's numba kernel, in the same precision."""
    state = start_batch(x, dtype)
    advance(state, pack_layers(layers, dtype), bias)
    return live_rows(state)


@pytest.mark.slow
def test_radixnet_streamed_windows_match_resident():
    layers = radixnet(64, 3, seed=2)
    x = random_inputs(30, 64, 0.25, seed=5)
    for dtype in (np.float64, np.float32):
        # uint16 indices, int32 offsets, one weight a layer
        layer_bytes = 64 * 32 * 2 + 65 * 4 + np.dtype(dtype).itemsize
        assert weight_bytes(pack_layers(layers, dtype)) == (3 * layer_bytes, layer_bytes)
    packed = pack_layers(layers, np.float32)
    resident = DeviceNetwork(packed)
    streamed = DeviceNetwork(packed, budget=weight_bytes(packed)[1])
    assert not resident.streamed and streamed.streamed and streamed.layers_per_window == 1
    bias = challenge_bias(1024)
    # float32 rounding of the bias may decide rows: compare like with like (the float64
    # reference checks streamed windows in test_engine_on_cuda_workers_equals_cpu_engine)
    expected = cpu_engine_rows(x, layers, bias, np.float32)
    # the resident network's rows: test_kernel_matches_reference and the engine tests
    result = infer_rows_cuda(x, streamed, bias, compact_every=2)
    np.testing.assert_array_equal(result.rows, expected)


def test_compact_layers_narrow_indices_and_one_weight_per_layer():
    constant = compact_layers(pack_layers(radixnet(64, 3, seed=2), np.float32))
    assert constant.per_layer and constant.values.shape == (3,)
    assert constant.indices.dtype == np.uint16 and constant.indptr.dtype == np.int32
    mixed = random_network(32, 2, 4, seed=1)  # random weights: kept one per nonzero
    packed = pack_layers(mixed, np.float64)
    compact = compact_layers(packed)
    assert not compact.per_layer
    np.testing.assert_array_equal(compact.values, packed.data)
    np.testing.assert_array_equal(compact.indices, packed.indices)
    assert compact.nbytes < packed.nbytes


@pytest.mark.parametrize(
    ("neurons", "mode"), [pytest.param(64, "fused", marks=pytest.mark.slow), (44, "sectioned")]
)
def test_bit_rows_give_the_csr_results(neurons, mode):  # 44: the last byte is partly used
    layers = random_network(neurons, 2, 4, seed=3)
    x = random_inputs(40, neurons, 0.3, seed=4).tolil()
    x[5] = 0
    x = x.tocsr()
    bits = pack_bit_rows(x)
    assert bits.bits.shape == (40, -(-neurons // 8)) and bits.value == 1.0
    np.testing.assert_array_equal(np.unpackbits(bits.bits, axis=1, bitorder="little")[:, :neurons],
                                  x.toarray() != 0)
    network = DeviceNetwork(pack_layers(layers, np.float64))
    expected = reference_categories(x, layers, -0.2)
    assert 0 < expected.size < 40
    result = infer_rows_cuda(bits, network, -0.2, compact_every=1, mode=mode)
    np.testing.assert_array_equal(result.rows, expected)
    part = infer_rows_cuda(bits[33:40], network, -0.2, mode=mode)
    np.testing.assert_array_equal(part.rows, expected[expected >= 33] - 33)


def test_bit_rows_reject_values_and_malformed_bits():
    x = random_inputs(6, 44, 0.5, seed=1)
    x.data[0] = 2.0
    assert pack_bit_rows(x) is None  # not one value: the CSR path is taken
    network = DeviceNetwork(pack_layers(random_network(44, 1, 4, seed=1), np.float32))
    good = np.zeros((3, 6), dtype=np.uint8)
    with pytest.raises(ValueError, match="past feature 43"):
        infer_rows_cuda(BitRows(good + 0x10, 1.0, 44), network, -0.1)
    with pytest.raises(ValueError, match="shape"):
        infer_rows_cuda(BitRows(np.zeros((3, 5), dtype=np.uint8), 1.0, 44), network, -0.1)
    with pytest.raises(ValueError, match="finite and nonzero"):
        infer_rows_cuda(BitRows(good, float("nan"), 44), network, -0.1)
    with pytest.raises(ValueError, match="features"):
        infer_rows_cuda(BitRows(np.zeros((3, 8), dtype=np.uint8), 1.0, 64), network, -0.1)


def test_all_rows_die_and_empty_batch():
    layers = random_network(32, 3, 4, seed=1)
    x = random_inputs(33, 32, 0.2, seed=2)
    network = DeviceNetwork(pack_layers(layers, np.float32))
    assert infer_rows_cuda(x, network, -100.0).rows.size == 0
    assert infer_rows_cuda(sp.csr_matrix((5, 32)), network, -0.3).rows.size == 0
    with pytest.raises(ValueError, match="features"):
        infer_rows_cuda(sp.csr_matrix((5, 16)), network, -0.3)
    with pytest.raises(ValueError, match="compact_every"):
        infer_rows_cuda(x, network, -0.3, compact_every=0)
    with pytest.raises(ValueError, match="mode"):
        infer_rows_cuda(x, network, -0.3, mode="graph")
    bad = sp.csr_matrix((np.ones(1), np.array([40]), np.array([0, 1])), shape=(1, 32))
    with pytest.raises(ValueError, match="out of range"):
        infer_rows_cuda(bad, network, -0.3)


def test_device_network_too_small_budget():
    packed = pack_layers(radixnet(64, 2), np.float32)
    with pytest.raises(MemoryError, match="bytes"):
        DeviceNetwork(packed, budget=1000)


def test_device_network_wider_than_32_bit_offsets_is_named():
    """A layer of 2**27 + 1 neurons (zero-stride arrays: no memory) is refused before anything is
    read: its activation offsets j * 32 would not fit the kernels' 32-bit slots."""
    neurons = MAX_NEURONS + 1
    wide = CompactLayers(np.broadcast_to(np.zeros(1, np.int64), (1, neurons + 1)),
                         np.zeros(0, np.int32), np.zeros(1, np.float32), per_layer=True)
    with pytest.raises(ValueError, match=f"at most {MAX_NEURONS:,} neurons .* got {neurons:,}"):
        DeviceNetwork(wide)


def test_plan_memory_resident_streamed_and_too_large():
    budget, rows = plan_memory(10_000, 1_000, 64, 4, free=10**7, weight_budget=None)
    assert budget is None and rows >= LANES
    budget, _ = plan_memory(10_000, 1_000, 64, 4, free=10**7, weight_budget=3_000)
    assert budget == 3_000
    with pytest.raises(MemoryError, match=r"need \d+ bytes, \d+ bytes are available"):
        plan_memory(10**9, 10**8, 65536, 4, free=10**7, weight_budget=None)
    assert activation_bytes(33, 64) == 2 * 2 * 64 * (LANES * 4 + 1)


@pytest.fixture(scope="module")
def client():
    """The module's cluster, its workers switching threads more often under the simulator."""
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=":0")
    with cluster, Client(cluster) as c, workers_switch_interval(c):
        yield c


@pytest.mark.slow
@pytest.mark.skipif(cuda_runtime() == "none", reason="numba's CUDA simulator is off")
def test_engine_on_cuda_workers_equals_cpu_engine(client):
    """The weights streamed in windows of two layers, with compact_every=2: a compaction, then a
    window of one layer (the resident weights: the CLI and worker-load tests)."""
    layers = radixnet(64, 3, seed=3)
    x = mnist_to_challenge_inputs(load_mnist_test()[0][:60], 8)
    bias = -0.3
    cpu, _ = run_challenge(layers, x, bias, client=client, progress=False)
    gpu, stats = run_challenge(layers, x, bias, client=client, device="cuda", batch_size=30,
                               compact_every=2, cuda_mode="sectioned",
                               weight_budget=2 * (64 * 32 * 2 + 65 * 4 + 4), progress=False)
    np.testing.assert_array_equal(gpu, cpu)
    np.testing.assert_array_equal(gpu, reference_categories(x, layers, bias) + 1)
    assert stats.mode == "streamed" and stats.resident_layers == 2
    assert stats.device == "cuda" and stats.batches == 2 and stats.workers == 2
    assert len(stats.peak_memory) == 2  # each worker ran one of the two batches
    assert stats.categories == gpu.size and stats.macs_done > 0
    assert "GPU workers" in stats.summary()


def test_bad_device_arguments_fail_before_any_cluster():
    layers = radixnet(64, 2)
    x = random_inputs(4, 64, 0.5, seed=0)
    with pytest.raises(ValueError, match="device must be"):
        run_challenge(layers, x, device="gpu", client="tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="compact_every"):
        run_challenge(layers, x, device="cuda", compact_every=0, client="tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="cuda_mode"):
        run_challenge(layers, x, device="cuda", cuda_mode="graph", client="tcp://127.0.0.1:1")


@pytest.mark.skipif(cuda_runtime() == "gpu", reason="this machine has a GPU")
def test_workers_without_gpu_are_named():
    env = {"NUMBA_ENABLE_CUDASIM": "0"}
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      env=env) as cluster, Client(cluster) as c:
        with pytest.raises(RuntimeError, match=r"needs a CUDA GPU on every worker.*dasknn\[cuda\]"):
            run_challenge(radixnet(64, 2), random_inputs(4, 64, 0.5, 0), -0.3, client=c,
                          device="cuda", progress=False)
        assert not c.has_what()[cluster.workers[0].worker_address]


def test_cli_device_cuda_without_local_gpu_support(tmp_path, capsys):
    try:
        import dask_cuda  # noqa: F401
    except ImportError:
        pass
    else:
        if cuda_runtime() == "gpu":
            pytest.skip("dask-cuda and a GPU are present: the local CUDA cluster would start")
    layers = tmp_path / "net"
    layers.mkdir()
    for k, w in enumerate(radixnet(64, 2), start=1):
        write_sparse_tsv(layers / f"n64-l{k}.tsv", w)
    write_sparse_tsv(tmp_path / "x.tsv", random_inputs(4, 64, 0.5, 0))
    out = tmp_path / "cats.tsv"
    code = main(["challenge", "--network", str(layers), "--inputs", str(tmp_path / "x.tsv"),
                 "--bias", "-0.3", "--device", "cuda", "--categories", str(out), "--quiet"])
    assert code == 2
    assert "dasknn[cuda]" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow  # the default run keeps test_cli_load_on_workers, the CLI on the simulator
@pytest.mark.skipif(cuda_runtime() == "none", reason="numba's CUDA simulator is off")
def test_cli_device_cuda_on_scheduler(client, tmp_path, capsys):
    layers = radixnet(64, 2, seed=1)
    net = tmp_path / "net"
    net.mkdir()
    for k, w in enumerate(layers, start=1):
        write_sparse_tsv(net / f"n64-l{k}.tsv", w)
    x = mnist_to_challenge_inputs(load_mnist_test()[0][:30], 8)
    write_sparse_tsv(tmp_path / "x.tsv", x)
    out = tmp_path / "cats.tsv"
    code = main(["challenge", "--network", str(net), "--inputs", str(tmp_path / "x.tsv"),
                 "--bias", "-0.3", "--device", "cuda", "--categories", str(out), "--quiet",
                 "--scheduler", client.scheduler.address])
    assert code == 0
    np.testing.assert_array_equal(read_categories(out), reference_categories(x, layers, -0.3) + 1)


def write_network(directory, layers) -> str:
    """Write ``layers`` as the challenge's layer files ``n{N}-l{k}.tsv`` into ``directory``."""
    directory.mkdir()
    for k, w in enumerate(layers, start=1):
        write_sparse_tsv(directory / f"n{w.shape[0]}-l{k}.tsv", w)
    return str(directory)


def _scheduler_tasks(dask_scheduler=None) -> list[str]:
    return list(dask_scheduler.tasks)


def nothing_left(client) -> None:
    """Every key of the run (the workers' copies included) leaves the scheduler."""
    wait_until_empty(lambda: client.run_on_scheduler(_scheduler_tasks), 5,
                     "a key of the run stayed on the scheduler")


needs_cuda_runtime = pytest.mark.skipif(cuda_runtime() == "none",
                                        reason="numba's CUDA simulator is off")


@pytest.mark.slow
@needs_cuda_runtime
def test_workers_load_the_network_as_the_client_does(client, tmp_path):
    """A generator spec and a challenge directory loaded by the workers: the categories of the
    float64 reference, and the statistics the client-loaded path reports for the same layers
    (the layers ``prepare_run`` gives the client for the directory)."""
    x = mnist_to_challenge_inputs(load_mnist_test()[0][:40], 8)
    layers = radixnet(64, 2, seed=3)
    expected = reference_categories(x, layers, -0.3) + 1
    assert 0 < expected.size < 40
    by_workers, stats = run_challenge("radixnet:64:2:3", x, -0.3, client=client, device="cuda",
                                      progress=False, load_on_workers=True)
    np.testing.assert_array_equal(by_workers, expected)
    # the statistics the client-loaded path reports for these layers
    device_bytes, _ = weight_bytes(compact_layers(pack_layers(layers, np.float32)))
    shape = ("neurons", "layers", "edges", "weight_bytes", "mode", "batches", "workers", "device")
    assert [getattr(stats, key) for key in shape] == [
        64, 2, sum(w.nnz for w in layers), device_bytes, "broadcast", 2, 2, "cuda"
    ]
    nothing_left(client)

    directory = write_network(tmp_path / "net", random_network(64, 2, 6, seed=2))
    layers, _, _ = prepare_run(directory, x, -0.2, device="cuda")  # what the client would run
    expected = reference_categories(x, layers, -0.2) + 1
    assert 0 < expected.size < 40
    by_workers, stats = run_challenge(directory, x, -0.2, client=client, device="cuda",
                                      progress=False, load_on_workers=True)
    np.testing.assert_array_equal(by_workers, expected)
    assert (stats.neurons, stats.layers, stats.edges) == (64, 2, sum(w.nnz for w in layers))
    assert stats.edges == 2 * 64 * 6 and stats.batches == 2
    nothing_left(client)


@needs_cuda_runtime
def test_worker_load_errors_name_the_worker_and_leave_nothing(client, tmp_path):
    x = random_inputs(6, 64, 0.5, seed=0)
    worker = r"worker tcp://[0-9.:]+ could not load the network"
    missing = str(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match=rf"{worker} '{re.escape(missing)}'"):
        run_challenge(missing, x, -0.3, client=client, device="cuda", progress=False,
                      load_on_workers=True)
    nothing_left(client)
    malformed = tmp_path / "malformed"
    malformed.mkdir()
    (malformed / "n64-l1.tsv").write_text("1 2 0.5\n3 x 0.5\n")
    with pytest.raises(ValueError, match=rf"{worker} .*n64-l1.tsv, line 2"):
        run_challenge(str(malformed), x, -0.3, client=client, device="cuda", progress=False,
                      load_on_workers=True)
    nothing_left(client)
    with pytest.raises(ValueError, match=rf"{worker} 'radixnet:64:2': --layers 5 exceeds the 2"):
        run_challenge("radixnet:64:2", x, -0.3, client=client, device="cuda", layers=5,
                      progress=False, load_on_workers=True)
    nothing_left(client)
    narrow = random_inputs(6, 32, 0.5, seed=0)
    with pytest.raises(ValueError, match=r"32 features but the network has 64 neurons \(width "
                       r"mismatch\) \(the network 'radixnet:64:2' as loaded by worker tcp://"):
        run_challenge("radixnet:64:2", narrow, -0.3, client=client, device="cuda",
                      progress=False, load_on_workers=True)
    nothing_left(client)


@needs_cuda_runtime
def test_worker_load_past_the_step_timeout_names_the_workers(client, tmp_path):
    """A layer file that never delivers its bytes (a FIFO without a writer, as a stuck network
    file system): the load is bounded by ``step_timeout``; the file is then closed so the workers'
    reads end."""
    directory = tmp_path / "stuck"
    directory.mkdir()
    fifo = directory / "n64-l1.tsv"
    os.mkfifo(fifo)
    named = (r"^the workers did not finish loading the network '.*stuck' within 3 s "
             r"\(step_timeout\): worker tcp://[0-9.:]+ \(loading the network\) is running")
    try:
        start = time.monotonic()
        with pytest.raises(StepTimeoutError, match=named):
            run_challenge(str(directory), random_inputs(6, 64, 0.5, seed=0), -0.3,
                          client=client, device="cuda", progress=False, load_on_workers=True,
                          step_timeout=3)
        assert time.monotonic() - start < HANG_GUARD  # a hang guard, not a timing
    finally:
        _end_reads(fifo)
    nothing_left(client)


def _no_reader(fifo) -> bool:
    """Open ``fifo`` for writing and close it (a read under way then ends, the file empty);
    whether no worker had it open for reading."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # ENXIO: no reader left
        return True
    return False


def _end_reads(fifo) -> None:
    """End the workers' reads of ``fifo`` until none has it open for reading."""
    wait_until(lambda: _no_reader(fifo), 10, "the workers' reads of the FIFO did not end")


def test_workers_that_loaded_different_networks_are_named():
    report = {"neurons": 64, "layers": 2, "edges": 4096, "device_bytes": 1, "largest_layer": 1,
              "digest": "aa"}
    assert _same_network({"tcp://b": report, "tcp://a": dict(report)}, "net") == {
        key: value for key, value in report.items() if key != "digest"}
    with pytest.raises(ValueError, match=r"different networks from 'net': worker tcp://a has 64 "
                       r"neurons, 2 layers, 4096 edges \(digest aa\), worker tcp://b has 64 "
                       r"neurons, 2 layers, 4096 edges \(digest bb\)"):
        _same_network({"tcp://b": {**report, "digest": "bb"}, "tcp://a": report}, "net")


def test_worker_load_options_fail_before_any_cluster():
    x = random_inputs(4, 64, 0.5, seed=0)
    unreachable = "tcp://127.0.0.1:1"
    with pytest.raises(ValueError, match="load_on_workers=True needs the network as a directory"):
        run_challenge(radixnet(64, 2), x, client=unreachable, device="cuda",
                      load_on_workers=True)
    with pytest.raises(ValueError, match="must be radixnet:N:L or radixnet:N:L:SEED"):
        run_challenge("radixnet:64", x, client=unreachable, device="cuda", load_on_workers=True)
    with pytest.raises(ValueError, match="needs device='cuda'"):
        run_challenge("radixnet:64:2", x, client=unreachable, load_on_workers=True)
    with pytest.raises(FileNotFoundError, match="input file"):
        run_challenge("radixnet:64:2", "/nonexistent/x.tsv", client=unreachable, device="cuda",
                      load_on_workers=True)


@pytest.mark.slow
@needs_cuda_runtime
def test_cli_load_on_workers(client, tmp_path, capsys):
    x = mnist_to_challenge_inputs(load_mnist_test()[0][:30], 8)
    write_sparse_tsv(tmp_path / "x.tsv", x)
    out = tmp_path / "cats.tsv"
    report = tmp_path / "stats.json"
    code = main(["challenge", "--network", "radixnet:64:3:1", "--layers", "2", "--inputs",
                 str(tmp_path / "x.tsv"), "--bias", "-0.3", "--device", "cuda",
                 "--load-on-workers", "--categories", str(out), "--json", str(report),
                 "--quiet", "--scheduler", client.scheduler.address])
    assert code == 0, capsys.readouterr().err
    expected = reference_categories(x, radixnet(64, 2, seed=1), -0.3) + 1
    np.testing.assert_array_equal(read_categories(out), expected)
    assert '"layers": 2' in report.read_text()
    for extra, message in ((["--model-parallel"], "drop --model-parallel"),
                           (["--network", "radixnet:64"], "must be radixnet:N:L")):
        code = main(["challenge", "--network", "radixnet:64:2", "--inputs",
                     str(tmp_path / "x.tsv"), "--device", "cuda", "--load-on-workers",
                     "--scheduler", "tcp://127.0.0.1:1", *extra])
        assert code == 2 and message in capsys.readouterr().err
    code = main(["challenge", "--network", "radixnet:64:2", "--inputs", str(tmp_path / "x.tsv"),
                 "--load-on-workers", "--scheduler", "tcp://127.0.0.1:1"])
    assert code == 2 and "needs device='cuda'" in capsys.readouterr().err


@pytest.mark.gpu
@needs_gpu
def test_official_network_on_gpu_equals_cpu_engine(official_1024_dir, client):
    layers = read_challenge_network(official_1024_dir, neurons=1024)
    x = mnist_to_challenge_inputs(load_mnist_test()[0][:3000], 32)
    cpu, _ = run_challenge(layers, x, client=client, progress=False)
    network = DeviceNetwork(pack_layers(layers, np.float32))
    for compact_every, mode in ((1, "fused"), (8, "fused"), (120, "fused"), (8, "sectioned")):
        gpu = infer_rows_cuda(x, network, challenge_bias(1024), compact_every=compact_every,
                              mode=mode)
        np.testing.assert_array_equal(gpu.rows + 1, cpu)
    bits = infer_rows_cuda(pack_bit_rows(x), network, challenge_bias(1024))
    np.testing.assert_array_equal(bits.rows + 1, cpu)


@pytest.mark.gpu
@needs_gpu
def test_local_cuda_cluster_engine():
    pytest.importorskip("dask_cuda")
    layers = radixnet(4096, 12, seed=0)
    x = mnist_to_challenge_inputs(load_mnist_test()[0][:2000], 64)
    gpu, stats = run_challenge(layers, x, device="cuda", progress=False)
    np.testing.assert_array_equal(
        gpu, cpu_engine_rows(x, layers, challenge_bias(4096), np.float32) + 1
    )
    assert stats.device == "cuda" and stats.gpus
    assert os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1"
