"""Workers as batch jobs through dask-jobqueue: job scripts of every batch system, bad options,
and, on a real one-node SLURM (``slurm`` fixture), model-parallel training and the challenge on
two workers that are SLURM jobs, and a model-parallel fit that recovers from its checkpoint when
one of the jobs reaches its walltime."""

from __future__ import annotations

import os
import subprocess
from contextlib import ExitStack

import numpy as np
import pytest
from polling import wait_until

import graph
from dasknn.cli import main
from dasknn.datasets import radixnet, read_categories, write_sparse_tsv
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.runtime.cluster import open_client, scheduler_workers
from dasknn.runtime.jobqueue import JobqueueSpec, jobqueue_cluster, start_jobqueue_cluster


def _script(**options) -> str:
    cluster = jobqueue_cluster(JobqueueSpec(dashboard_address="127.0.0.1:0", **options))
    try:
        return cluster.job_script()
    finally:
        cluster.close()


@pytest.mark.minversions
@pytest.mark.parametrize(
    "system, expected",
    [
        (
            "slurm",
            [
                "#SBATCH -p short",
                "#SBATCH -A proj7",
                "#SBATCH -t 01:00:00",
                "#SBATCH --cpus-per-task=16",
                "#SBATCH --mem=60G",
                "#SBATCH --exclusive",
            ],
        ),
        (
            "pbs",
            [
                "#PBS -q short",
                "#PBS -A proj7",
                "#PBS -l walltime=01:00:00",
                "#PBS -l select=1:ncpus=16:mem=60GB",
                "#PBS --exclusive",
            ],
        ),
        ("sge", ["#$ -q short", "#$ -P proj7", "#$ -l h_rt=01:00:00", "#$ --exclusive"]),
        (
            "lsf",
            [
                "#BSUB -q short",
                '#BSUB -P "proj7"',
                "#BSUB -n 16",
                "#BSUB -W 01:00",
                "#BSUB --exclusive",
            ],
        ),
    ],
)
def test_job_scripts_carry_the_requested_directives(system, expected):
    walltime = "01:00" if system == "lsf" else "01:00:00"
    script = _script(
        system=system,
        cores=16,
        memory="64GB",
        processes=4,
        walltime=walltime,
        queue="short",
        account="proj7",
        job_extra_directives=["--exclusive"],
        interface="lo",
    )
    for line in expected:
        assert line in script, (line, script)
    assert "--nthreads 4" in script and "--interface lo" in script
    assert script.count("distributed.cli.dask_worker") == 1 and "--nworkers 4" in script


@pytest.mark.minversions
def test_htcondor_job_takes_disk_and_key_value_directives():
    script = _script(
        system="htcondor",
        cores=2,
        memory="8GB",
        disk="20GB",
        job_extra_directives=["+MaxRuntime=3600"],
    )
    assert (
        "RequestCpus = MY.DaskWorkerCores" in script and "MY.DaskWorkerDisk = 20000000000" in script
    )
    assert "+MaxRuntime = 3600" in script


@pytest.mark.minversions
def test_config_file_fills_options_not_given(tmp_path):
    config = tmp_path / "jobqueue.yaml"
    config.write_text(
        "jobqueue:\n  slurm:\n    queue: gpu\n    cores: 8\n    memory: 16GB\n"
        "    job-extra-directives: ['--gres=gpu:1']\n"
    )
    script = _script(system="slurm", config_file=config, walltime="00:10:00")
    assert "#SBATCH -p gpu" in script and "#SBATCH --cpus-per-task=8" in script
    assert "#SBATCH -t 00:10:00" in script and "#SBATCH --gres=gpu:1" in script


@pytest.mark.minversions
@pytest.mark.parametrize(
    "options, message",
    [
        ({"system": "torque"}, "unknown cluster 'torque'"),
        ({"system": "slurm", "cores": 0}, "cores must be an integer >= 1"),
        ({"system": "slurm", "cores": 2, "processes": 3}, "must not exceed cores"),
        ({"system": "slurm", "memory": "lots"}, "memory must be an amount"),
        ({"system": "slurm", "walltime": "1h"}, "walltime must look like"),
        ({"system": "htcondor", "queue": "short"}, "htcondor jobs take no queue"),
        ({"system": "htcondor", "job_extra_directives": ["x"]}, "key=value"),
        ({"system": "pbs", "disk": "1GB"}, "disk is an htcondor option"),
        ({"system": "slurm", "config_file": "/nonexistent.yaml"}, "does not exist"),
    ],
)
def test_bad_specs_are_rejected_before_anything_starts(options, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        start_jobqueue_cluster(JobqueueSpec(**options))


@pytest.mark.minversions
def test_a_config_file_that_is_not_a_mapping_is_rejected(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        JobqueueSpec("slurm", config_file=bad).check()
    bad.write_text("distributed:\n  x: 1\n")
    with pytest.raises(ValueError, match="one key, jobqueue"):
        JobqueueSpec("slurm", config_file=bad).check()


@pytest.mark.minversions
def test_no_submit_command_is_a_clear_runtime_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match="'qsub' is not on PATH"):
        start_jobqueue_cluster(JobqueueSpec("pbs"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cluster", "torque"], "unknown cluster 'torque'"),
        (["--cores", "4"], "--cores is an option of batch jobs: give --cluster"),
        (["--cluster", "slurm", "--walltime", "soon"], "walltime must look like"),
    ],
)
def test_cli_bad_cluster_options_are_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    net = tmp_path / "net"
    net.mkdir()
    write_sparse_tsv(net / "n32-l1.tsv", radixnet(32, 1)[0])
    write_sparse_tsv(tmp_path / "in.tsv", np.eye(4, 32))
    out = tmp_path / "cats.tsv"
    code = main(
        [
            "challenge",
            "--network",
            str(net),
            "--inputs",
            str(tmp_path / "in.tsv"),
            "--bias",
            "-0.3",
            "--categories",
            str(out),
            "--quiet",
            *argv,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    code = main(["train", "radixnet:32:2", "--samples", "8", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------------------- a real SLURM
def _slurm_spec(slurm, **options) -> JobqueueSpec:
    """Two one-core workers, each a SLURM job, on the loopback interface."""
    return JobqueueSpec(
        "slurm",
        workers=2,
        cores=1,
        memory="1GB",
        interface="lo",
        dashboard_address="127.0.0.1:0",
        timeout=60,
        job_extra_directives=[f"--output={slurm.root}/jobs/%j.out"],
        **options,
    )


@pytest.fixture
def slurm_env(slurm, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    return slurm


def _train(client, model, x, y) -> SparseMLP:
    partition = graph.partition_network(model.weights, 2, seed=0)
    with DistributedSparseMLP(model, client, partition=partition) as dist:
        dist.fit(x, y, batch_size=16, epochs=2, lr=0.2, progress=False)
        return dist.gather()


@pytest.mark.slow
def test_model_parallel_training_on_slurm_jobs_equals_a_local_cluster(slurm_env, dask_client):
    model = SparseMLP.radixnet(neurons=32, layers=3, seed=3)
    rng = np.random.default_rng(3)
    x, y = rng.uniform(0, 1, (64, 32)), rng.uniform(0, 1, (64, 32))
    local = _train(dask_client, model, x, y)
    with start_jobqueue_cluster(_slurm_spec(slurm_env)) as cluster:
        jobs = {job.job_id for job in cluster.workers.values()}
        assert len(jobs) == 2 and all(jobs)
        with ExitStack() as stack:  # the API takes the cluster object itself
            client = open_client(stack, cluster)
            hosts = client.run(lambda: os.environ.get("SLURM_JOB_ID"))
            assert sorted(hosts.values()) == sorted(jobs)  # every worker runs in its own job
        on_slurm = _train(cluster, model, x, y)
    for w_slurm, w_local, w_start in zip(
        on_slurm.weights, local.weights, model.weights, strict=True
    ):
        np.testing.assert_allclose(w_slurm.toarray(), w_local.toarray(), rtol=0, atol=1e-12)
        assert np.abs(w_slurm.toarray() - w_start.toarray()).max() > 1e-3  # it trained
    for b_slurm, b_local in zip(on_slurm.biases, local.biases, strict=True):
        np.testing.assert_allclose(b_slurm, b_local, rtol=0, atol=1e-12)


def _job_state(slurm, job_id: str) -> str:
    """SLURM's state of job ``job_id`` (``RUNNING``, ``TIMEOUT``, ...), from ``scontrol``."""
    shown = subprocess.run(
        ["scontrol", "show", "job", job_id], env=slurm.env, capture_output=True, text=True
    )
    fields = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)
    return fields.get("JobState", f"unknown ({shown.stderr.strip()})")


@pytest.mark.slow
def test_a_worker_job_at_its_walltime_mid_fit_is_recovered_from_the_checkpoint(
    slurm_env, tmp_path
):
    model = SparseMLP.radixnet(neurons=32, layers=3, seed=3)
    rng = np.random.default_rng(4)
    x, y = rng.uniform(0, 1, (64, 32)), rng.uniform(0, 1, (64, 32))
    fit = {"batch_size": 16, "epochs": 3, "lr": 0.2, "progress": False}
    reference = model.copy().fit(x, y, **fit)
    # both jobs ask for SLURM's shortest walltime, one minute; the survivor's is lengthened
    with start_jobqueue_cluster(_slurm_spec(slurm_env, walltime="00:01:00")) as cluster:
        with ExitStack() as stack:
            client = open_client(stack, cluster)
            job_of = client.run(lambda: os.environ["SLURM_JOB_ID"])
            victim, survivor = sorted(job_of)
            lengthened = subprocess.run(
                ["scontrol", "update", f"JobId={job_of[survivor]}", "TimeLimit=00:30:00"],
                env=slurm_env.env, capture_output=True, text=True,
            )  # fmt: skip
            assert lengthened.returncode == 0, lengthened.stderr
            partition = graph.partition_network(model.weights, 2, seed=0)
            with DistributedSparseMLP(
                model, client, partition=partition, workers=[victim, survivor], step_timeout=60
            ) as dist:

                def at_walltime(epoch: int, loss: float) -> None:
                    # after the first epoch's checkpoint: the victim's job reaches its walltime
                    if epoch == 1:
                        wait_until(
                            lambda: victim not in scheduler_workers(client), 240,
                            lambda: f"job {job_of[victim]} is "
                            f"{_job_state(slurm_env, job_of[victim])}",
                            interval=1.0,
                        )  # fmt: skip

                dist.fit(x, y, **fit, checkpoint=tmp_path / "checkpoints", on_epoch=at_walltime)
                assert _job_state(slurm_env, job_of[victim]) == "TIMEOUT"
                assert _job_state(slurm_env, job_of[survivor]) == "RUNNING"
                assert set(dist.part_workers) == {survivor}  # both parts on the survivor
                trained = dist.gather()
    for got, want in zip(trained.weights, reference.weights, strict=True):
        np.testing.assert_allclose(got.toarray(), want.toarray(), rtol=0, atol=1e-9)
    for got, want in zip(trained.biases, reference.biases, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    assert np.abs(trained.weights[0].toarray() - model.weights[0].toarray()).max() > 1e-3


@pytest.mark.slow
def test_challenge_cli_on_slurm_jobs(slurm_env, tmp_path, capsys):
    layers, bias = radixnet(64, 6), -0.3
    net = tmp_path / "net"
    net.mkdir()
    for k, w in enumerate(layers, start=1):
        write_sparse_tsv(net / f"n64-l{k}.tsv", w)
    rng = np.random.default_rng(1)
    inputs = (rng.uniform(size=(300, 64)) < 0.3).astype(np.float64)
    write_sparse_tsv(tmp_path / "in.tsv", inputs)
    y = inputs  # float64 reference: Y = min(max(Y W + b on nonzeros, 0), 32)
    for w in layers:
        z = y @ w.toarray()
        z[z != 0] += bias
        y = np.clip(z, 0, 32)
    expected = np.flatnonzero(y.any(axis=1)) + 1
    assert 0 < expected.size < 300
    config = tmp_path / "jobqueue.yaml"
    config.write_text(
        "jobqueue:\n  slurm:\n    scheduler-options:\n      dashboard_address: '127.0.0.1:0'\n"
    )
    out = tmp_path / "cats.tsv"
    argv = [
        "challenge",
        "--network",
        str(net),
        "--inputs",
        str(tmp_path / "in.tsv"),
        "--bias",
        str(bias),
        "--categories",
        str(out),
        "--quiet",
        "--batch-size",
        "100",
        "--cluster",
        "slurm",
        "--workers",
        "2",
        "--cores",
        "1",
        "--memory",
        "1GB",
        "--interface",
        "lo",
        f"--job-extra=--output={slurm_env.root}/jobs/%j.out",
        "--jobqueue-config",
        str(config),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    np.testing.assert_array_equal(read_categories(out), expected)
    # a cluster that cannot start: one line, exit 2, no categories file
    out.unlink()
    assert main([*argv, "--queue", "nosuchpartition"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "invalid partition" in err.lower(), err
    assert not out.exists()
    # jobs that stay queued: after --cluster-timeout, one line, and the jobs are cancelled
    assert main([*argv, "--job-extra=--begin=now+3600", "--cluster-timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "0 of 2 workers after 1 s" in err, err
    assert not out.exists()
    queued = subprocess.run(
        ["squeue", "-h", "-o", "%i"], env=slurm_env.env, capture_output=True, text=True
    )
    assert queued.returncode == 0 and queued.stdout.strip() == ""
