"""The fenced code of the README and the guides, run as a reader runs it: the bash blocks'
commands in a shell, the Python blocks as a script under ``if __name__ == "__main__":`` (Dask
starts worker processes), in a folder that holds the bundled data at its repository path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fenced(text: str) -> list[tuple[str, str]]:
    """The fenced blocks of a Markdown ``text`` in order, as ``(language, body)``."""
    return re.findall(r"(?m)^```(\w*)\n(.*?)^```", text, re.S)


def section(text: str, title: str) -> str:
    """The ``## title`` section of a Markdown ``text``."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def commands(block: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments and blank lines left
    out."""
    joined = re.sub(r"\\\n\s*", "", block)
    lines = (line.split("#", 1)[0].strip() for line in joined.splitlines())
    return [line for line in lines if line]


def run(args: list[str], cwd: Path, timeout: float) -> str:
    """Run ``args`` in ``cwd`` with this interpreter's scripts first on the PATH (where pip put
    the ``dasknn`` command) and return what it printed; fail with its output if it exits
    non-zero."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def run_program(source: str, folder: Path, timeout: float) -> str:
    """Run the Python ``source`` as a script under ``if __name__ == "__main__":`` in
    ``folder``; return what it printed."""
    body = "".join(f"    {line}" if line.strip() else line for line in source.splitlines(True))
    script = folder / "program.py"
    script.write_text(f'if __name__ == "__main__":\n{body}', encoding="utf-8")
    return run([sys.executable, str(script)], folder, timeout)


def with_bundled_data(folder: Path) -> Path:
    """``folder``, holding the package's bundled data at the path it has in the repository
    (``dasknn/datasets/data``, a link), as the documented commands name it."""
    datasets = folder / "dasknn" / "datasets"
    datasets.mkdir(parents=True)
    (datasets / "data").symlink_to(ROOT / "dasknn" / "datasets" / "data", target_is_directory=True)
    return folder
