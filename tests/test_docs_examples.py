"""The guides stay true. Every Python block of a page under ``docs/`` runs: a page's blocks in
order, as one program, as a reader follows the page, except those in :data:`SKETCHES`, which
say why they cannot run here. The transcripts in ``docs/getting-started.md`` are what their
commands print, but for the lines of timings and memory. Slow: about two minutes on two cores."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_blocks import ROOT, commands, fenced, run, run_program, with_bundled_data

DOCS = ROOT / "docs"

#: Python blocks that do not run here, by page and first line: why.
SKETCHES = {
    ("challenge.md", 'categories, stats = dasknn.run_challenge("radixnet:16384:120", images, '
     'device="cuda")'): "it runs on GPU workers",
    ("dashboard.md", "from dasknn.runtime.dashboard_feed import DashboardFeed"):
        "a piece of a training program",
    ("deploying.md", "from dasknn import DistributedSparseMLP, SparseMLP"):
        "it submits SLURM batch jobs",
    ("partitioning.md", "import graph"): "a list of calls on the official network",
    ("partitioning.md", "from dasknn.datasets import iter_radixnet          # or "
     "iter_challenge_network(directory)"): "it partitions the largest network (minutes)",
    ("training.md", "import numpy as np"): "a list of calls",
}  # fmt: skip

#: A measured quantity on a transcript's line: a time, a rate or an amount of memory.
MEASURED = re.compile(r"\d ?(?:s|ms|MiB|GiB|[a-z]+/s)\b")


def _python_blocks(page: Path) -> list[str]:
    blocks = fenced(page.read_text(encoding="utf-8"))
    return [body for language, body in blocks if language == "python"]


def _programs() -> Iterator[tuple[str, str]]:
    """``(page, program)``: the runnable Python blocks of each page, joined in order."""
    for page in sorted(DOCS.glob("*.md")):
        runnable = [
            block for block in _python_blocks(page)
            if (page.name, block.splitlines()[0]) not in SKETCHES
        ]  # fmt: skip
        if runnable:
            yield page.name, "\n".join(runnable)


def test_every_sketch_is_a_block_of_its_page():
    for (page, first), why in SKETCHES.items():
        firsts = [block.splitlines()[0] for block in _python_blocks(DOCS / page)]
        assert first in firsts, f"{page} has no Python block starting {first!r} ({why})"


PROGRAMS = list(_programs())


@pytest.mark.slow
@pytest.mark.parametrize("page,program", PROGRAMS, ids=[page for page, _ in PROGRAMS])
def test_the_examples_of_a_page_run(page: str, program: str, tmp_path: Path):
    run_program(program, tmp_path, 600)


def _transcripts(page: Path) -> Iterator[tuple[str, list[str]]]:
    """``(command, lines shown)`` for every text block and the one-command bash block before
    it."""
    command = None
    for language, body in fenced(page.read_text(encoding="utf-8")):
        if language == "bash":
            given = commands(body)
            command = given[0] if len(given) == 1 else None
        elif language == "text" and command is not None:
            yield command, body.splitlines()


@pytest.mark.slow
def test_the_transcripts_of_getting_started_are_what_the_commands_print(tmp_path: Path):
    folder = with_bundled_data(tmp_path)
    shown = list(_transcripts(DOCS / "getting-started.md"))
    assert [command.split()[1] for command, _ in shown] == ["partition", "train", "challenge"]
    for command, lines in shown:
        printed = [" ".join(line.split()) for line in run(["bash", "-c", command], folder, 300)
                   .splitlines()]  # fmt: skip
        for line in lines:
            expected = " ".join(line.split()).removesuffix("...").strip()
            if expected and not MEASURED.search(expected):
                assert any(p.startswith(expected) for p in printed), (
                    f"{command}: the page shows {line!r}; it printed:\n" + "\n".join(printed)
                )
