"""The lower bounds of ``pyproject.toml`` as exact pins, for the minimum-versions CI run.

``python3 .ci/min_requirements.py`` prints one ``name[extras]==floor`` per line for every ``>=``
bound of the project's dependencies and of its ``test`` extra. With ``--check`` it instead checks
that the Python running it has exactly those versions installed (exit status 1 when not).
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
BOUND = re.compile(r"^\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([^,;\s]+)\s*$")


def floors() -> list[tuple[str, str, str]]:
    """``[(name, extras, version)]`` of every ``>=`` bound (dependencies and the test extra)."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    found = []
    for requirement in project["dependencies"] + project["optional-dependencies"]["test"]:
        match = BOUND.match(requirement)
        if match is None:
            raise SystemExit(f"{requirement!r}: expected 'name>=version' (a lower bound)")
        found.append((match[1], match[2] or "", match[3]))
    return found


def _release(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in re.match(r"\d+(\.\d+)*", version)[0].split(".")]
    while parts and parts[-1] == 0:  # 1.5 == 1.5.0
        parts.pop()
    return tuple(parts)


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        wrong = []
        for name, _, floor in floors():
            installed = metadata.version(name)
            print(f"{name:12s} floor {floor:10s} installed {installed}")
            if _release(installed) != _release(floor):
                wrong.append(name)
        if wrong:
            print("not at their lower bound:", ", ".join(wrong), file=sys.stderr)
            return 1
        return 0
    for name, extras, floor in floors():
        print(f"{name}{extras}=={floor}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
