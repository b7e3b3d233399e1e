"""``README.md`` stays true: CI runs its set-up commands as written, and every command and the
Python program of its quick start run as written on a fresh install (slow: about a minute and a
half on two cores), each writing what it says it writes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from doc_blocks import ROOT, commands, fenced, run, run_program, section, with_bundled_data

from dasknn.model import CompressedMLP

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(title: str, language: str) -> list[str]:
    return [body for lang, body in fenced(section(README, title)) if lang == language]


def test_ci_runs_the_set_up_commands_as_written():
    setup = commands(_blocks("Set-up and tests", "bash")[0])
    assert len(setup) == 3 and setup[0].startswith("python3 -m pip install")
    ci = commands((ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    ci = [c for c in ci if not c.startswith(("set ", "cd "))]
    assert ci[:3] == setup


@pytest.mark.slow
def test_every_quick_start_command_runs_as_written(tmp_path: Path):
    folder = with_bundled_data(tmp_path)
    quick = [c for block in _blocks("Quick start", "bash") for c in commands(block)]
    names = [c.split()[1] for c in quick]
    assert names == ["partition", "challenge", "train", "parallax", "samo", "slide"]
    printed = {
        name: run(["bash", "-c", command], folder, 300)
        for name, command in zip(names, quick, strict=True)
    }
    report = (folder / "partition.md").read_text(encoding="utf-8")
    for parts in (32, 64, 128, 256, 512):
        assert re.search(rf"(?m)^\| {parts} \|", report), f"no row for P = {parts}:\n{report}"
    with np.load(folder / "parts.npz") as saved:
        assert saved.files
    rows = (folder / "categories.tsv").read_text(encoding="utf-8").split()
    counted = re.search(r"(\d+) categories", printed["challenge"])
    assert counted is not None and len(rows) == int(counted.group(1)) > 0
    model = CompressedMLP.load(folder / "pruned.npz")
    assert model.layer_shapes == [(784, 300), (300, 100), (100, 10)]
    weights = sum(n_in * n_out for n_in, n_out in model.layer_shapes)
    assert abs(model.nnz - 0.1 * weights) <= model.n_layers, "not pruned to 90%"
    for name in ("train", "parallax", "slide"):
        assert "(equal)" in printed[name], f"dasknn {name}: measured bytes not equal:\n" + (
            printed[name]
        )


@pytest.mark.slow
def test_the_quick_start_program_runs_as_written(tmp_path: Path):
    """The Python program, in a script as the README says: every mode trains, and every exact
    volume check holds."""
    (program,) = _blocks("Quick start", "python")
    lines = run_program(program, tmp_path, 300).strip().splitlines()
    assert len(lines) >= 4 and all(line.endswith(" True") for line in lines[-3:]), lines
