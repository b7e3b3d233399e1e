"""``README.md`` stays true: CI runs its set-up commands as written, and every command and the
Python program of its quick start run as written on a fresh install (slow: about a minute and a
half on two cores), each writing what it says it writes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dasknn.model import CompressedMLP

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    """The text of the README's ``## title`` section."""
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def _blocks(text: str, language: str) -> list[str]:
    """The fenced ``language`` blocks of ``text``, in order."""
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def _commands(block: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments and blank lines left
    out."""
    joined = re.sub(r"\\\n\s*", "", block)
    commands = (line.split("#", 1)[0].strip() for line in joined.splitlines())
    return [c for c in commands if c]


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``args`` in ``cwd`` with this interpreter's scripts first on the PATH (where pip put
    the ``dasknn`` command); fail with its output if it exits non-zero."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def test_ci_runs_the_set_up_commands_as_written():
    setup = _commands(_blocks(_section("Set-up and tests"), "bash")[0])
    assert len(setup) == 3 and setup[0].startswith("python3 -m pip install")
    ci = _commands((ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    ci = [c for c in ci if not c.startswith(("set ", "cd "))]
    assert ci[:3] == setup


@pytest.fixture
def repository_like(tmp_path: Path) -> Path:
    """A folder to run the quick start in: its file arguments name the bundled data by the
    path it has in the repository, so the folder holds that path (a link to the data)."""
    data = tmp_path / "dasknn" / "datasets"
    data.mkdir(parents=True)
    (data / "data").symlink_to(ROOT / "dasknn" / "datasets" / "data", target_is_directory=True)
    return tmp_path


@pytest.mark.slow
def test_every_quick_start_command_runs_as_written(repository_like: Path):
    commands = [c for block in _blocks(_section("Quick start"), "bash") for c in _commands(block)]
    names = [c.split()[1] for c in commands]
    assert names == ["partition", "challenge", "train", "parallax", "samo", "slide"]
    printed = {}
    for name, command in zip(names, commands, strict=True):
        printed[name] = _run(["bash", "-c", command], repository_like, timeout=300).stdout
    report = (repository_like / "partition.md").read_text(encoding="utf-8")
    for parts in (32, 64, 128, 256, 512):
        assert re.search(rf"(?m)^\| {parts} \|", report), f"no row for P = {parts}:\n{report}"
    with np.load(repository_like / "parts.npz") as saved:
        assert saved.files
    rows = (repository_like / "categories.tsv").read_text(encoding="utf-8").split()
    counted = re.search(r"(\d+) categories", printed["challenge"])
    assert counted is not None and len(rows) == int(counted.group(1)) > 0
    model = CompressedMLP.load(repository_like / "pruned.npz")
    assert model.layer_shapes == [(784, 300), (300, 100), (100, 10)]
    weights = sum(n_in * n_out for n_in, n_out in model.layer_shapes)
    assert abs(model.nnz - 0.1 * weights) <= model.n_layers, "not pruned to 90%"
    for name in ("train", "parallax", "slide"):
        assert "(equal)" in printed[name], f"dasknn {name}: measured bytes not equal:\n" + (
            printed[name]
        )


@pytest.mark.slow
def test_the_quick_start_program_runs_as_written(tmp_path: Path):
    """The Python program, in a script under ``if __name__ == "__main__":`` as the README says
    (Dask starts worker processes): every mode trains, and every exact volume check holds."""
    (program,) = _blocks(_section("Quick start"), "python")
    body = "".join(f"    {line}" if line.strip() else line for line in program.splitlines(True))
    script = tmp_path / "quick_start.py"
    script.write_text(f'if __name__ == "__main__":\n{body}', encoding="utf-8")
    printed = _run([sys.executable, str(script)], tmp_path, timeout=300).stdout
    lines = printed.strip().splitlines()
    assert len(lines) >= 4 and all(line.endswith(" True") for line in lines[-3:]), printed
