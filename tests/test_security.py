"""TLS end to end: a LocalCluster on certificates made here, trained on and running the challenge
through the API and the command line; clients without the right certificates are refused with
one line; local clusters (plain and TLS) listen on 127.0.0.1 only.

The certificates are made with ``cryptography``: a CA and a certificate it signed for every role,
and a second, unrelated CA with its own certificate that the cluster must not trust.
"""

from __future__ import annotations

import datetime
from contextlib import ExitStack
from pathlib import Path

import dask
import numpy as np
import psutil
import pytest
import scipy.sparse as sp
from challenge_reference import reference_categories
from distributed import Client

import graph
from dasknn.challenge import run_challenge
from dasknn.cli import build_parser, main
from dasknn.cli.tls import security_from_args
from dasknn.datasets import radixnet, write_sparse_tsv
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.runtime.cluster import LOCAL_HOST, local_cluster, open_client
from dasknn.runtime.security import tls_security

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

NEURONS = 64
BIAS = -0.3


def _name(text: str):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _certificate(subject: str, issuer: str, public_key, signing_key, ca: bool):
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(signing_key, hashes.SHA256())
    )


def make_certificates(directory: Path, prefix: str) -> dict[str, str]:
    """A CA, and a certificate with its key signed by that CA, as PEM files."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate(f"{prefix} CA", f"{prefix} CA", ca_key.public_key(), ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(f"{prefix} dask", f"{prefix} CA", key.public_key(), ca_key, ca=False)
    paths = {name: directory / f"{prefix}-{name}.pem" for name in ("ca", "cert", "key")}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return {name: str(path) for name, path in paths.items()}


def tls_args(files: dict[str, str]) -> list[str]:
    return ["--tls-ca-file", files["ca"], "--tls-cert", files["cert"], "--tls-key", files["key"]]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> dict[str, dict[str, str]]:
    directory = tmp_path_factory.mktemp("tls")
    return {
        "good": make_certificates(directory, "good"),
        "other": make_certificates(directory, "other"),
    }


@pytest.fixture(scope="module")
def tls_cluster(certificates):
    """Two workers and a scheduler that speak TLS only, on the "good" certificates."""
    good = certificates["good"]
    security = tls_security(good["ca"], good["cert"], good["key"])
    with local_cluster(2, security=security) as cluster:
        yield cluster, security


def challenge_files(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    layers = radixnet(NEURONS, 3, seed=1)
    inputs = sp.random(40, NEURONS, density=0.3, random_state=2, format="csr")
    inputs.data[:] = 1.0
    network = tmp_path / "net"
    network.mkdir()
    for k, w in enumerate(layers, start=1):
        write_sparse_tsv(network / f"n{NEURONS}-l{k}.tsv", w)
    write_sparse_tsv(tmp_path / "in.tsv", inputs)
    return network, tmp_path / "in.tsv", reference_categories(inputs, layers, BIAS) + 1


def error_lines(err: str) -> list[str]:
    """stderr without the log lines of the scheduler, which runs in this test's process."""
    return [line for line in err.strip().splitlines() if " - distributed." not in line]


@pytest.mark.slow
def test_tls_cluster_trains_and_runs_the_challenge(tls_cluster, certificates, tmp_path, capsys):
    cluster, security = tls_cluster
    address = cluster.scheduler_address
    assert address.startswith("tls://")
    assert all(w.startswith("tls://") for w in cluster.scheduler_info["workers"])

    network, inputs, expected = challenge_files(tmp_path)
    out = tmp_path / "cats.tsv"
    argv = ["challenge", "--network", str(network), "--inputs", str(inputs), "--bias", str(BIAS),
            "--categories", str(out), "--quiet", "--scheduler", address]  # fmt: skip
    assert main(argv + tls_args(certificates["good"])) == 0
    np.testing.assert_array_equal(np.loadtxt(out, dtype=np.int64, ndmin=1), expected)

    argv = ["train", "radixnet:64:2", "--parts", "2", "--samples", "32", "--batch-size", "16",
            "--scheduler", address]  # fmt: skip
    assert main(argv + tls_args(certificates["good"])) == 0
    assert "trained 2 batches of 16" in capsys.readouterr().out

    model = SparseMLP.radixnet(NEURONS, 2, seed=3)
    reference = model.copy()
    rng = np.random.default_rng(3)
    x, y = rng.uniform(0, 1, (24, NEURONS)), rng.uniform(0, 1, (24, NEURONS))
    categories, _ = run_challenge(str(network), str(inputs), BIAS, client=address,
                                  security=security, progress=False)  # fmt: skip
    np.testing.assert_array_equal(categories, expected)
    with ExitStack() as stack:
        client = open_client(stack, address, security=security)
        partition = graph.partition_network(model.weights, 2, seed=0)
        with DistributedSparseMLP(model, client, partition=partition) as dist:
            dist.fit(x, y, batch_size=8, epochs=1, lr=0.5, seed=1, progress=False)
            trained = dist.gather()
    reference.fit(x, y, batch_size=8, epochs=1, lr=0.5, seed=1, progress=False)
    for got, want in zip(trained.weights, reference.weights, strict=True):
        np.testing.assert_allclose(got.toarray(), want.toarray(), rtol=0, atol=1e-12)


def test_clients_without_the_certificates_are_refused(
    tls_cluster, certificates, tmp_path, capsys, monkeypatch
):
    cluster, _ = tls_cluster
    address = cluster.scheduler_address
    with ExitStack() as stack, pytest.raises(ValueError, match="uses TLS: give a CA file"):
        open_client(stack, address)

    monkeypatch.setenv("DASKNN_CONNECT_TIMEOUT", "2")
    network, inputs, _ = challenge_files(tmp_path)
    argv = ["challenge", "--network", str(network), "--inputs", str(inputs), "--bias", str(BIAS),
            "--quiet", "--scheduler", address]  # fmt: skip
    capsys.readouterr()
    for extra, message in (
        ([], "uses TLS: give a CA file, a certificate and its key"),
        (tls_args(certificates["other"]), "refused the connection"),
        (["--tls-ca-file", certificates["good"]["ca"], "--tls-cert",
          certificates["other"]["cert"], "--tls-key", certificates["other"]["key"]],
         "refused the connection"),
    ):  # fmt: skip
        assert main(argv + extra) == 2
        lines = error_lines(capsys.readouterr().err)
        assert len(lines) == 1 and lines[0].startswith("dasknn challenge: error: "), lines
        assert message in lines[0]
    with ExitStack() as stack, pytest.raises(RuntimeError, match="refused the connection"):
        other = certificates["other"]
        open_client(stack, address, security=tls_security(other["ca"], other["cert"], other["key"]))


def test_tls_options_are_checked_before_any_work(certificates, tmp_path, capsys):
    good = certificates["good"]
    parse = build_parser().parse_args
    base = ["train", "radixnet:32:2"]
    assert security_from_args(parse(base)) is None
    assert security_from_args(parse([*base, "--tls"])) is True
    cases = [
        (["--tls-cert", good["cert"]], "needs both a CA file and a certificate"),
        (["--tls-ca-file", good["ca"], "--tls-cert", str(tmp_path / "none.pem")],
         "does not exist"),
        (["--tls-ca-file", good["key"], "--tls-cert", good["cert"], "--tls-key", good["key"]],
         "cannot use the TLS files"),
        (["--tls", "--scheduler", "tls://127.0.0.1:9"], "--tls starts a local cluster"),
        (["--tls", *tls_args(good)], "--tls takes no certificate files"),
    ]  # fmt: skip
    for extra, message in cases:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err, err
    with ExitStack() as stack, pytest.raises(ValueError, match="local cluster only"):
        open_client(stack, "tls://127.0.0.1:9", security=True)


def _listening(pid: int) -> set[tuple[str, int]]:
    connections = psutil.Process(pid).net_connections("tcp")
    return {(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}


@pytest.mark.parametrize("security", [None, True], ids=["plain", "tls-temporary"])
def test_local_clusters_and_dashboards_listen_on_localhost(security):
    with local_cluster(1, security=security) as cluster, Client(cluster) as client:
        protocol = "tls" if security else "tcp"
        assert cluster.scheduler_address.startswith(f"{protocol}://{LOCAL_HOST}:")
        assert cluster.dashboard_link.startswith(f"http://{LOCAL_HOST}:")
        # the scheduler runs in this process (beside other tests' clusters): its own ports
        ours = {int(cluster.scheduler_address.rsplit(":", 1)[1]),
                int(cluster.dashboard_link.split(":")[2].split("/")[0])}  # fmt: skip
        found = {port: ip for ip, port in _listening(psutil.Process().pid) if port in ours}
        assert set(found) == ours and set(found.values()) == {LOCAL_HOST}
        # every socket of the worker processes: the worker's server and its dashboard
        pids = client.run(lambda: __import__("os").getpid())
        for pid in pids.values():
            sockets = _listening(pid)
            assert len(sockets) >= 2 and {ip for ip, _ in sockets} == {LOCAL_HOST}, sockets
        assert client.submit(sum, [1, 2]).result() == 3


def test_dask_configuration_gives_the_certificates(tls_cluster, certificates, tmp_path, capsys):
    cluster, _ = tls_cluster
    good = certificates["good"]
    config = {
        "distributed.comm.tls.ca-file": good["ca"],
        "distributed.comm.tls.client.cert": good["cert"],
        "distributed.comm.tls.client.key": good["key"],
    }
    network, inputs, expected = challenge_files(tmp_path)
    out = tmp_path / "cats.tsv"
    address = cluster.scheduler_address
    argv = ["challenge", "--network", str(network), "--inputs", str(inputs), "--bias", str(BIAS),
            "--categories", str(out), "--quiet", "--scheduler", address]  # fmt: skip
    with dask.config.set(config):
        assert main(argv) == 0, capsys.readouterr().err
    np.testing.assert_array_equal(np.loadtxt(out, dtype=np.int64, ndmin=1), expected)
