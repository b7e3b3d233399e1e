"""Run the notebooks of this folder top to bottom and store them with their outputs.

Usage, from the repository root::

    python examples/execute_notebooks.py                  # every notebook
    python examples/execute_notebooks.py partitioning     # some of them, by name

Each notebook runs in a fresh Jupyter kernel (nbclient) with its working directory in a
temporary folder, at the sizes its parameters cell gives, and is written back in place with
every cell's outputs (plots as PNG) so that it reads on a repository page. The execution times
Jupyter records are dropped, so a re-run changes the file only where an output changed. The
tests run the same notebooks again at small sizes (``tests/test_examples_notebooks.py``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import nbclient
import nbformat

EXAMPLES = Path(__file__).resolve().parent
#: Seconds a cell may run.
CELL_TIMEOUT = 1800


def execute(path: Path) -> float:
    """Run the notebook ``path`` and write it back with its outputs; returns the seconds."""
    notebook = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        nbclient.NotebookClient(
            notebook,
            timeout=CELL_TIMEOUT,
            kernel_name="python3",
            resources={"metadata": {"path": work}},
        ).execute()
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, path)
    return time.perf_counter() - started


def main(names: list[str]) -> int:
    paths = [EXAMPLES / f"{name}.ipynb" for name in names] or sorted(EXAMPLES.glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"{path.name}: {execute(path):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
