"""The benchmarks' shared harness: command-line options, the machine, JSON output, clusters.

Every script of ``benchmarks/`` imports it (they run as ``python benchmarks/NAME.py`` from the
repository root, so this folder is on ``sys.path``):

- :func:`describe`: the machine a figure came from (CPU model, usable cores, load average),
  printed at the top of every run;
- :func:`add_json_option` and :func:`write_json`: ``--json FILE`` appends one JSON object per
  result (the script's name, the machine and the figures) to ``FILE``;
- :func:`case_bias`: the Graph Challenge bias of a network width, with a bias for the small
  widths the GPU scripts run under the CUDA simulator;
- :class:`NetCluster`: a Dask cluster whose scheduler and workers each run in their own network
  namespace, every link shaped with ``tc`` to a rate (root only; :func:`unavailable_reason` says
  why a machine cannot run it, so callers can skip with that message).

``NetCluster``: every node (the scheduler, each worker) gets a namespace with one ``eth0``, a veth
link to a bridge in a "switch" namespace; the benchmark process (the client) reaches the bridge
through one more veth link from the root namespace. The links of the nodes are shaped with a
token bucket (``tbf``) at ``rate`` on both ends of each link, so every byte between two workers
crosses two shaped links the way it would cross two network interfaces, and, when ``delay_us`` is
given, a ``netem`` delay on each end. Addresses are taken from ``10.213.X.0/24`` inside namespaces
this harness creates and deletes; nothing outside the machine is reached::

    with NetCluster(workers=2, rate="1gbit") as cluster, Client(cluster.address) as client:
        ...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dasknn.datasets import challenge_bias

__all__ = [
    "NetCluster",
    "add_json_option",
    "case_bias",
    "cpu_model",
    "describe",
    "unavailable_reason",
    "write_json",
]


def cpu_model() -> str:
    """The CPU's model name from ``lscpu``, else what :mod:`platform` knows."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def describe() -> str:
    """``MODEL, N cores, load L1 L5 L15``: the CPU, the cores this process may use, the load."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores, load {load}"


def add_json_option(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--json FILE`` (append the results as JSON lines) to ``parser``; returns it."""
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also append the results to FILE, one JSON object a line")
    return parser


def write_json(path: Path | None, script: str, results: dict | list) -> None:
    """Append ``{"script", "machine", "results"}`` to ``path`` as one JSON line; nothing when
    ``path`` is ``None``. Values JSON cannot hold (numpy scalars, paths) are written as text."""
    if path is None:
        return
    record = {"script": script, "machine": describe(), "results": results}
    with Path(path).open("a") as out:
        out.write(json.dumps(record, default=str) + "\n")


#: The widths the challenge gives a bias for.
CHALLENGE_WIDTHS = (1024, 4096, 16384, 65536)
#: The bias of the other (smaller, test-sized) widths the GPU scripts run.
OTHER_WIDTH_BIAS = -0.3


def case_bias(neurons: int) -> float:
    """The challenge's bias for ``neurons``, or :data:`OTHER_WIDTH_BIAS` for a width it has none
    for."""
    return challenge_bias(neurons) if neurons in CHALLENGE_WIDTHS else OTHER_WIDTH_BIAS


_SUBNET = "10.213"


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "network namespaces and tc need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the {tool!r} command (iproute2) is not installed"
    return None


def _run(*args: str) -> None:
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip()}")


def _rate_bits(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for suffix, scale in units.items():
        if rate.endswith(suffix):
            return float(rate[: -len(suffix)]) * scale
    raise ValueError(f"rate must look like '1gbit', '10gbit' or '500mbit', got {rate!r}")


@dataclass
class NetCluster:
    """Scheduler and ``workers`` single-process workers in their own namespaces, shaped links.

    Parameters
    ----------
    workers : int
        Worker nodes (one ``dask worker`` process with ``nthreads`` threads each).
    rate : str
        Rate of every node link, in tc's notation (``"1gbit"``, ``"10gbit"``).
    delay_us : float, optional
        One-way delay added on each end of every node link (needs the kernel's ``netem``).
    nthreads : int
        Threads per worker.
    env : dict, optional
        Extra environment variables of the scheduler and worker processes.

    Attributes
    ----------
    address : str
        The scheduler's address.
    namespaces : list of str
        The nodes' namespaces: the scheduler's, then one per worker.
    """

    workers: int = 2
    rate: str = "1gbit"
    delay_us: float | None = None
    nthreads: int = 1
    env: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.workers > 200:
            raise ValueError(f"at most 200 workers, got {self.workers}")
        self._bits = _rate_bits(self.rate)
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"NetCluster cannot start: {reason}")
        tag = f"{os.getpid() % 100000}"
        self._prefix = f"dnn{tag}"
        self._octet = 20 + os.getpid() % 200
        self._switch = f"{self._prefix}-sw"
        self.namespaces = [f"{self._prefix}-n{k}" for k in range(self.workers + 1)]
        self._processes: list[subprocess.Popen] = []
        self._host_link = f"{self._prefix}h"
        self.address = f"tcp://{self._ip(0)}:8786"

    def _ip(self, node: int) -> str:
        return f"{_SUBNET}.{self._octet}.{node + 1}"

    def _shape(self, namespace: str, device: str) -> None:
        burst = max(64 * 1024, int(self._bits / 8 / 100))  # 10 ms at the rate
        base = ["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", device]
        if self.delay_us:
            try:
                _run(*base, "root", "handle", "1:", "netem", "delay", f"{self.delay_us}us")
            except RuntimeError as error:
                raise RuntimeError(
                    f"delay needs tc's netem, which this kernel refuses ({error})"
                ) from None
            _run(*base, "parent", "1:", "handle", "2:", "tbf", "rate", self.rate, "burst",
                 str(burst), "latency", "50ms")
        else:
            _run(*base, "root", "tbf", "rate", self.rate, "burst", str(burst), "latency", "50ms")

    def _network(self) -> None:
        _run("ip", "netns", "add", self._switch)
        _run("ip", "netns", "exec", self._switch, "ip", "link", "add", "br0", "type", "bridge")
        _run("ip", "netns", "exec", self._switch, "ip", "link", "set", "br0", "up")
        for k, namespace in enumerate(self.namespaces):
            port = f"p{k}"
            _run("ip", "netns", "add", namespace)
            _run("ip", "link", "add", f"{self._prefix}x{k}", "type", "veth", "peer", "name",
                 f"{self._prefix}y{k}")
            _run("ip", "link", "set", f"{self._prefix}x{k}", "netns", namespace, "name", "eth0")
            _run("ip", "link", "set", f"{self._prefix}y{k}", "netns", self._switch, "name", port)
            in_ns = ["ip", "netns", "exec", namespace, "ip"]
            _run(*in_ns, "addr", "add", f"{self._ip(k)}/24", "dev", "eth0")
            _run(*in_ns, "link", "set", "eth0", "up")
            _run(*in_ns, "link", "set", "lo", "up")
            in_sw = ["ip", "netns", "exec", self._switch, "ip"]
            _run(*in_sw, "link", "set", port, "master", "br0")
            _run(*in_sw, "link", "set", port, "up")
            self._shape(namespace, "eth0")
            self._shape(self._switch, port)
        _run("ip", "link", "add", self._host_link, "type", "veth", "peer", "name",
             f"{self._prefix}z")
        _run("ip", "link", "set", f"{self._prefix}z", "netns", self._switch, "name", "host")
        _run("ip", "addr", "add", f"{_SUBNET}.{self._octet}.254/24", "dev", self._host_link)
        _run("ip", "link", "set", self._host_link, "up")
        in_sw = ["ip", "netns", "exec", self._switch, "ip"]
        _run(*in_sw, "link", "set", "host", "master", "br0")
        _run(*in_sw, "link", "set", "host", "up")

    def _spawn(self, node: int, *command: str) -> None:
        env = {**os.environ, **{k: str(v) for k, v in self.env.items()}}
        self._processes.append(subprocess.Popen(
            ["ip", "netns", "exec", self.namespaces[node], sys.executable, *command],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))

    def start(self, timeout: float = 60.0) -> NetCluster:
        """Create the namespaces and links, start the scheduler and the workers, wait for them."""
        from distributed import Client

        try:
            self._network()
            self._spawn(0, "-m", "distributed.cli.dask_scheduler", "--host", self._ip(0),
                        "--port", "8786", "--no-dashboard")
            for k in range(1, self.workers + 1):
                self._spawn(k, "-m", "distributed.cli.dask_worker", self.address, "--host",
                            self._ip(k), "--nthreads", str(self.nthreads), "--no-dashboard",
                            "--name", f"worker-{k}")
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with Client(self.address, timeout=5) as client:
                        client.wait_for_workers(self.workers, timeout=timeout)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every process and delete every namespace and link this cluster made."""
        for process in self._processes:
            process.terminate()
        for process in self._processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        self._processes.clear()
        for namespace in [*self.namespaces, self._switch]:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", self._host_link], capture_output=True)

    def run_ranks(self, *command: str, env: dict | None = None, timeout: float = 1800) -> list:
        """Run ``python command... --rank R --world N --master IP`` in the namespace of every
        worker ``R + 1`` at once (one process a node, as ``torch.distributed`` launches its
        ranks; the master is worker 1's address) and return each rank's stdout, or ``None``
        for a rank that failed (its stderr's tail is printed)."""
        n, master = self.workers, self._ip(1)
        env = {**os.environ, **(env or {})}
        procs = [
            subprocess.Popen(
                ["ip", "netns", "exec", self.namespaces[rank + 1], sys.executable, *command,
                 "--rank", str(rank), "--world", str(n), "--master", master],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            for rank in range(n)
        ]
        outputs = []
        for rank, proc in enumerate(procs):
            stdout, stderr = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                print(f"rank {rank} failed: {stderr.strip()[-500:]}", flush=True)
                stdout = None
            outputs.append(stdout)
        return outputs

    def __enter__(self) -> NetCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
