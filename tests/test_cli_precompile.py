"""``dasknn precompile``: a later process loads the kernels it compiled from numba's cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dasknn.cli import main

# Runs the workloads of the modes given in argv[1:] and prints, per kernel of dasknn.kernels and
# graph that they called, the signatures loaded from numba's cache and those compiled.
_STATS = """
import json, sys
import numba
from dasknn.cli.precompile import DTYPES, WORKLOADS
for name in sys.argv[1:]:
    for dtype in DTYPES:
        WORKLOADS[name](dtype)
stats = {}
for module in list(sys.modules.values()):
    if getattr(module, "__name__", "").startswith(("dasknn.kernels.", "graph.")):
        for attr, value in vars(module).items():
            if isinstance(value, numba.core.registry.CPUDispatcher) and value.signatures:
                hits, misses = value.stats.cache_hits, value.stats.cache_misses
                stats[f"{module.__name__}.{attr}"] = [sum(hits.values()), sum(misses.values())]
print(json.dumps(stats))
"""


def _kernel_stats(cache, *modes) -> dict[str, list[int]]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    result = subprocess.run([sys.executable, "-c", _STATS, *modes], capture_output=True,
                            text=True, env=env, check=True, timeout=600)  # fmt: skip
    return json.loads(result.stdout.splitlines()[-1])


def _precompile(cache, *modes) -> None:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    result = subprocess.run([sys.executable, "-m", "dasknn", "precompile", "--modes", *modes],
                            capture_output=True, text=True, env=env, check=False,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == list(modes)


def _assert_all_loaded(stats: dict[str, list[int]]) -> None:
    assert stats, "no kernel ran"
    compiled = {name: misses for name, (_, misses) in stats.items() if misses}
    assert not compiled, f"compiled again: {compiled}"
    assert all(hits > 0 for hits, _ in stats.values())


def test_a_later_process_loads_the_pipeline_kernels_from_the_cache(tmp_path):
    _precompile(tmp_path, "pipeline")
    _assert_all_loaded(_kernel_stats(tmp_path, "pipeline"))


@pytest.mark.slow
def test_a_later_process_loads_every_modes_kernels_from_the_cache(tmp_path):
    modes = ("challenge", "model-parallel", "sampled", "data-parallel", "pipeline", "partition")
    _precompile(tmp_path, *modes)
    _assert_all_loaded(_kernel_stats(tmp_path, *modes))


def test_an_unknown_mode_is_an_error_before_anything_is_compiled(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["precompile", "--modes", "graph"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'graph'" in capsys.readouterr().err
