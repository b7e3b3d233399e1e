"""The machine a benchmark ran on, printed beside its figures."""

from __future__ import annotations

import os
import platform
import subprocess


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
