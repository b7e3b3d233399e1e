"""Debian packages and daemons the deployment tests need: installed with apt-get where missing
(as root), a one-node SLURM (munged, slurmctld, slurmd) started in a private directory.

The fixtures that use these skip with the reason when the machine cannot provide them (not root,
no apt-get, a package that does not install, a daemon that does not start).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from polling import poll

# Seconds each apt-get call took in this test run, for the report printed at the end of the run.
INSTALL_SECONDS: dict[str, float] = {}
_UPDATED = False


def require_packages(commands: dict[str, str]) -> None:
    """Make every command of ``{command: debian package}`` available, installing the missing
    packages with ``apt-get install --no-install-recommends`` (after one ``apt-get update``);
    skip the calling test with the reason when that is impossible."""
    missing = sorted({pkg for command, pkg in commands.items() if shutil.which(command) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        pytest.skip(f"needs the Debian packages {missing}: not installed, and not root to install")
    if shutil.which("apt-get") is None:
        pytest.skip(f"needs the Debian packages {missing}: not installed, and no apt-get here")
    global _UPDATED
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    steps = [] if _UPDATED else [("apt-get update", ["apt-get", "update", "-q"])]
    steps.append(
        (
            f"apt-get install {' '.join(missing)}",
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        )
    )
    for name, command in steps:
        start = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        INSTALL_SECONDS[name] = time.perf_counter() - start
        if done.returncode != 0:
            pytest.skip(f"{name} failed: {done.stderr.strip().splitlines()[-1:]}")
        _UPDATED = _UPDATED or name == "apt-get update"
    still = [command for command in commands if shutil.which(command) is None]
    if still:
        pytest.skip(f"{still} still missing after installing {missing}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SLURM_CONF = """\
ClusterName=dasknn-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class OneNodeSlurm:
    """munged, slurmctld and slurmd of a one-node SLURM under ``root``; :attr:`env` points the
    SLURM commands (``sbatch``, ``squeue``, ``scancel``) at it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = dict(os.environ, SLURM_CONF=str(root / "slurm.conf"))
        self._daemons: list[subprocess.Popen] = []

    def start(self) -> None:
        root = self.root
        for sub in ("state", "spool", "jobs"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        host = socket.gethostname().split(".")[0]
        (root / "slurm.conf").write_text(
            SLURM_CONF.format(
                host=host,
                root=root,
                ctld_port=_free_port(),
                slurmd_port=_free_port(),
                cpus=os.cpu_count() or 1,
                memory_mb=4096,
            )
        )
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={root}/munge.socket",
                f"--key-file={key}",
                f"--pid-file={root}/munged.pid",
                f"--log-file={root}/munged.log",
                f"--seed-file={root}/munged.seed",
            ],
        )
        self._wait(lambda: (root / "munge.socket").exists(), "munged", root / "munged.log")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self._spawn("slurmd", ["slurmd", "-D"])
        self._wait(self._node_ready, "slurmctld/slurmd", root / "slurmctld.log")

    def _spawn(self, name: str, command: list[str]) -> None:
        log = open(self.root / f"{name}.stdout", "w")  # noqa: SIM115 - closed with the process
        self._daemons.append(
            subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        )
        log.close()

    def _node_ready(self) -> bool:
        done = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True
        )
        return done.returncode == 0 and done.stdout.strip() in ("idle", "mix", "alloc")

    def _wait(self, ready, name: str, log: Path, seconds: float = 30.0) -> None:

        def dead() -> list:
            return [p.args[0] for p in self._daemons if p.poll() is not None]

        outcome = poll(lambda: ready() or dead(), seconds, interval=0.1)  # True, the dead, []
        if outcome is not True:
            tail = log.read_text()[-400:] if log.exists() else ""
            raise RuntimeError(f"{name} did not start ({outcome or 'timeout'}): {tail}")

    def stop(self) -> None:
        subprocess.run(["scancel", "--user=root"], env=self.env, capture_output=True)
        for process in reversed(self._daemons):
            process.terminate()
        for process in reversed(self._daemons):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._daemons.clear()
