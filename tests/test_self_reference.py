"""The tree speaks of the project as it is, not of how it came to be: no text file under ``docs``,
``dasknn``, ``graph``, ``benchmarks``, ``examples``, ``tests`` nor ``README.md`` (of a notebook:
its cells' sources) names a working period of the project, an issue number, a branch, a run by
its letter and number, or the date of a run. Every file is read, this one too (its patterns and
examples are spelled so that they do not match themselves), but for what Python, numba and the
tools write beside the sources (``__pycache__``, ``*.egg-info``, the tools' caches: they come
and go while the tests run); a file that is not UTF-8 text (a ``.gz``) has no lines to check.
The few legitimate uses of the same words (pytest's fixture scope and hooks, a Bokeh or an
interactive client's state) are the patterns of ``ALLOWED``, blanked out of the text before it
is searched; no other file is left out."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ["docs", "dasknn", "graph", "benchmarks", "examples", "tests"]
FILES = ["README.md"]

#: What refers to the project's history, each with the reason given when it is found.
FORBIDDEN = {
    "a " + "ses" + "sion": re.compile(r"\bses{2}ion", re.IGNORECASE),
    "an issue number": re.compile(
        r"\bissues?\s*#|\bissues?\s+[0-9]+\b(?![.,]?[0-9]|[-x])"
        r"|\b(PR|pull request)\s*#?[0-9]|\(#[0-9]+\)",
        re.IGNORECASE,
    ),
    "a branch": re.compile(r"\bbranch(es)?\s+`|\bon main\b|\b(main|master) branch", re.IGNORECASE),
    "a run letter": re.compile(
        r"\b[Rr]uns?\s+[A-Z]{1,2}[0-9]*\b(?!\s*[=<>])|\bS[0-9]{1,3}\s*[/,]\s*S[0-9]{1,3}\b"
    ),
    "the task's issue": re.compile(r"\bthe\s+iss(?:u)e('s)?\b", re.IGNORECASE),
    "a run or branch name": re.compile(
        r"\b(slide|soak|parallax|samo|bench|run|ses(?:s)ion)[0-9]+\b"
    ),
    "a date": re.compile(r"\b(19|20)[0-9]{2}-[01][0-9]-[0-3][0-9]\b"),
}

#: Legitimate uses of the words above, blanked out before the search.
ALLOWED = [
    re.compile(r"""scope\s*=\s*["']ses{2}ion["']"""),  # pytest's fixture scope
    re.compile(r"\bpytest_ses{2}ion(start|finish)\(ses{2}ion\b"),  # pytest's hooks
    re.compile(r"\bses{2}ion fixture", re.IGNORECASE),  # a fixture of pytest's widest scope
    re.compile(r"\b(Bokeh|interactive|HTTP|TLS)\s+ses{2}ion", re.IGNORECASE),
]


#: Folders of generated files, left out.
GENERATED = {"__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", ".benchmarks"}


def _generated(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts[:-1]
    return any(part in GENERATED or part.endswith(".egg-info") for part in parts)


def text_files() -> list[Path]:
    """Every file of the trees and of ``FILES`` but the generated ones, sorted."""
    found = [ROOT / name for name in FILES]
    for tree in TREES:
        found += [p for p in (ROOT / tree).rglob("*") if p.is_file() and not _generated(p)]
    return sorted(found)


def sources(path: Path) -> list[tuple[str, str]]:
    """``(where, text)`` of ``path``: the whole text, or of a notebook each cell's source; empty
    when the file is not UTF-8 text."""
    data = path.read_bytes()
    if b"\0" in data:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    if path.suffix != ".ipynb":
        return [("", text)]
    cells = json.loads(text)["cells"]
    return [
        (f"cell {i} ", "".join(c["source"]) if isinstance(c["source"], list) else c["source"])
        for i, c in enumerate(cells)
    ]


def blank(text: str) -> str:
    """``text`` with each match of ``ALLOWED`` replaced by spaces (its lines kept)."""
    for pattern in ALLOWED:
        text = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    return text


def findings(text: str) -> list[tuple[int, str]]:
    """``(line, reason)`` of each reference to the project's history in ``text``, lines counted
    from 1."""
    searched = blank(text)
    return [
        (searched.count("\n", 0, match.start()) + 1, reason)
        for reason, pattern in FORBIDDEN.items()
        for match in pattern.finditer(searched)
    ]


def references(path: Path) -> list[str]:
    """``"FILE:[cell N ]line LINE: REASON: TEXT"`` for each reference to the project's history in
    ``path``."""
    found = []
    for where, text in sources(path):
        lines = text.splitlines()
        for line, reason in findings(text):
            found.append(
                f"{path.relative_to(ROOT)}:{where}line {line}: {reason}: "
                f"{lines[line - 1].strip()[:120]}"
            )
    return found


def test_the_tree_has_files_to_check():
    paths = {p.relative_to(ROOT).parts[0] for p in text_files()}
    assert set(TREES) | set(FILES) <= paths


def spelled(text: str) -> str:
    """``text`` with placeholders spelled out: ``SES`` for the word this module looks for,
    ``ISS``, ``PRQ``, ``BR`` for an issue, a pull request and a branch, ``Sn`` for a run's letter
    ``S``, ``Rns`` and ``ONMAIN`` for a run and a branch, ``DATE`` for a day, ``DG`` for
    nothing (so that the examples do not match themselves)."""
    for short, word in {
        "SES": "ses" + "sion",
        "ISS": "iss" + "ue",
        "PRQ": "P" + "R",
        "BR": "bran" + "ch",
        "Sn": "S",
        "DG": "",
        "Rns": "Ru" + "ns",
        "ONMAIN": "on " + "main",
        "DATE": "2026-" + "11-26",
    }.items():
        text = text.replace(short, word)
    return text


@pytest.mark.parametrize(
    "text",
    [
        "measured in SES 12",
        "see ISS 42",
        "fixed by ISS #7",
        "fixed in PRQ #7",
        "from BR `slideDG3`",
        "(BR ``slideDG3``)",
        "in run Sn25",
        "Rns K, L and M",
        "measured ONMAIN",
        "runs\nSn9, Sn10",
        "Sn25/Sn26",
        "until DATE",
        "the SES12 numbers",
        "as the ISS's target says",
        "the `parallaxDG10` profile",
        "(soakDG7)",
    ],
)
def test_a_reference_to_history_is_found(text):
    lines = {line for line, _ in findings(spelled(f"A line.\n{text} here.\n"))}
    assert lines == {2}, text


@pytest.mark.parametrize(
    "text",
    [
        '@pytest.fixture(scope="SES")',
        "def pytest_SESfinish(SES):",
        "a SES fixture installs it",
        "a Bokeh SES of the dashboard",
        "as an interactive SES keeps the last error",
        "the L1/L2 caches",
        "issue a request",
        "tiles issue 8.7-18x fewer loads",
        "the BR of a tree",
        "runs P = 2 on two workers",
        "the main job",
    ],
)
def test_a_legitimate_use_is_allowed(text):
    assert findings(spelled(f"A line.\n{text} here.\n")) == [], text


def test_a_notebook_is_checked_cell_by_cell(tmp_path):
    notebook = {
        "cells": [{"source": ["# Title\n", "text"]}, {"source": spelled("x = 1\n# run Sn3\n")}]
    }
    path = tmp_path / "book.ipynb"
    path.write_text(json.dumps(notebook))
    assert [(where, findings(text)) for where, text in sources(path)] == [
        ("cell 0 ", []),
        ("cell 1 ", [(2, "a run letter")]),
    ]


@pytest.mark.parametrize("path", text_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_refers_to_the_projects_history(path):
    found = references(path)
    assert not found, "\n".join(found)
