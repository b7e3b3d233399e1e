"""The import direction of docs/architecture.md: lower layers never import upper ones.

Every ``import`` statement of every module of ``dasknn/`` and ``graph/`` (those inside functions
too) is read with :mod:`ast`, nothing is imported. A module may import its own folder and the
layers below its own; the training modes do not import each other; the layers below
``dasknn/runtime/`` and ``graph/`` import no Dask.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.minversions

ROOT = Path(__file__).resolve().parents[1]

#: The layers from the top down, as docs/architecture.md draws them; a tuple holds layers of one
#: level, which do not import each other. ``dasknn`` is the package root (``__init__``,
#: ``__main__``), which re-exports the public names of every layer.
LEVELS = [
    ("dasknn",),
    ("cli",),
    ("challenge",),
    ("data_parallel", "model_parallel", "pipeline_parallel", "sampled_parallel"),
    ("runtime",),
    ("model",),
    ("compressed",),
    ("pruning",),
    ("sampled",),
    ("lsh",),
    ("optim",),
    ("kernels",),
    ("datasets",),
    ("graph",),
]
LEVEL = {layer: rank for rank, layer_names in enumerate(LEVELS) for layer in layer_names}
#: Layers that run in one process: they import neither ``dask`` nor ``distributed``.
NO_DASK = {layer for layer, rank in LEVEL.items() if rank > LEVEL["runtime"]}


def layer_of(module: str) -> str | None:
    """The layer of a dotted module name (``None`` outside the two packages)."""
    parts = module.split(".")
    if parts[0] == "graph":
        return "graph"
    if parts[0] != "dasknn":
        return None
    if len(parts) == 1 or parts[1] in ("__init__", "__main__"):
        return "dasknn"
    return parts[1]


def imported_modules(module: str, is_package: bool, source: str) -> list[str]:
    """The dotted names imported by the source of ``module`` (relative imports resolved)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            names.append(".".join(base + ([node.module] if node.module else [])))
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module)
    return names


def violations(sources: dict[str, str]) -> list[str]:
    """``"importer -> imported: rule"`` for every import against the rules of this module.

    ``sources`` maps a path relative to the repository root (``dasknn/model/x.py``) to its text.
    """
    found = []
    for path, source in sorted(sources.items()):
        parts = Path(path).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        importer = layer_of(module)
        for name in imported_modules(module, is_package, source):
            top = name.split(".")[0]
            imported = layer_of(name)
            if top in ("dask", "distributed") and importer in NO_DASK:
                found.append(f"{module} -> {name}: {importer} runs in one process, without Dask")
            if imported is None or imported == importer:
                continue
            if importer not in LEVEL or imported not in LEVEL:
                found.append(f"{module} -> {name}: a layer docs/architecture.md does not place")
            elif LEVEL[imported] < LEVEL[importer]:
                found.append(f"{module} -> {name}: {importer} is below {imported}")
            elif LEVEL[imported] == LEVEL[importer]:
                found.append(f"{module} -> {name}: {importer} and {imported} are side by side")
    return found


def test_no_module_imports_an_upper_layer():
    paths = [*ROOT.glob("dasknn/**/*.py"), *ROOT.glob("graph/**/*.py")]
    sources = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}
    assert {layer_of(".".join(Path(p).with_suffix("").parts)) for p in sources} == set(LEVEL)
    assert violations(sources) == []


def test_levels_are_the_order_of_the_architecture_diagram():
    diagram = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split("```")[1]
    drawn = re.findall(r"(?m)^[\s|+-]*(?:dasknn/(\w+)|(graph)/)", diagram)
    assert [a or b for a, b in drawn] == [layer for names in LEVELS[1:] for layer in names]


def test_imports_against_the_rules_are_found():
    sources = {
        "dasknn/model/net.py": "def f():\n    from ..runtime import keys\n",
        "dasknn/model/__init__.py": "from .net import f\nfrom . import losses\n",
        "graph/cut.py": "import dask.array\nfrom distributed import Client\n",
        "dasknn/sampled_parallel/m.py": "from dasknn.data_parallel.plan import x\n",
        "dasknn/kernels/k.py": "from dasknn.kernels import training\nimport numpy\n",
        "dasknn/runtime/r.py": "import distributed\nfrom dasknn.extra import y\n",
    }
    assert violations(sources) == [
        "dasknn.model.net -> dasknn.runtime: model is below runtime",
        "dasknn.runtime.r -> dasknn.extra: a layer docs/architecture.md does not place",
        "dasknn.sampled_parallel.m -> dasknn.data_parallel.plan: sampled_parallel and "
        "data_parallel are side by side",
        "graph.cut -> dask.array: graph runs in one process, without Dask",
        "graph.cut -> distributed: graph runs in one process, without Dask",
    ]
