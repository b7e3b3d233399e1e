"""The import direction of docs/architecture.md: lower layers never import upper ones.

Every ``import`` statement of every module of ``dasknn/`` and ``graph/`` (those inside functions
too) is read with :mod:`ast`, nothing is imported. A module may import its own folder and the
layers below its own; the training modes and the inference engine do not import each other;
the layers below ``dasknn/runtime/`` and ``graph/`` import no Dask; numba code is compiled only in
``dasknn/kernels/``.
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
    ("inference", "data_parallel", "model_parallel", "pipeline_parallel", "sampled_parallel"),
    ("runtime",),
    ("sampled",),
    ("model",),
    ("compressed",),
    ("pruning",),
    ("lsh",),
    ("optim",),
    ("datasets",),
    ("kernels",),
    ("exceptions",),
    ("graph",),
]
LEVEL = {layer: rank for rank, layer_names in enumerate(LEVELS) for layer in layer_names}
#: Layers that run in one process: they import neither ``dask`` nor ``distributed``.
NO_DASK = {layer for layer, rank in LEVEL.items() if rank > LEVEL["runtime"]}
#: The modules outside ``dasknn/kernels/`` that import numba, and why: each reads or sets numba's
#: thread count or asks numba's CUDA driver about a device, and compiles nothing.
NUMBA_OUTSIDE_KERNELS = {
    "dasknn.inference._cpu_inference": "sets a worker's numba thread count for its batches",
    "dasknn.inference._gpu_inference": "asks numba's CUDA driver for a GPU's name and memory",
    "dasknn.inference._workers": "reports a worker's numba thread count",
    "dasknn.sampled.layers": "reads numba's thread count to cut a batch into HOGWILD chunks",
}
#: Where numba code is compiled: dasknn's kernels, and graph's (which may not import dasknn).
KERNEL_MODULES = {("dasknn", "kernels"), ("graph", "_kernels")}
#: numba's names that compile code (decorators, ``prange``, ``jitclass``): kernel modules only.
NUMBA_COMPILERS = {
    "cfunc",
    "generated_jit",
    "guvectorize",
    "jit",
    "jitclass",
    "njit",
    "prange",
    "stencil",
    "vectorize",
}


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


def numba_imports(source: str) -> set[str]:
    """The dotted names of numba that ``source`` imports (``numba``, ``numba.njit``, ...)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names if alias.name.split(".")[0] == "numba"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "numba":
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def numba_violations(sources: dict[str, str]) -> list[str]:
    """``"module: rule"`` for every use of numba against the rule of ``dasknn/kernels/``.

    Outside :data:`KERNEL_MODULES` only the modules of :data:`NUMBA_OUTSIDE_KERNELS` import numba,
    and they name none of :data:`NUMBA_COMPILERS` (imported or as an attribute).
    """
    found = []
    for path, source in sorted(sources.items()):
        parts = Path(path).with_suffix("").parts
        imported = numba_imports(source)
        if parts[:2] in KERNEL_MODULES or not imported:
            continue
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module not in NUMBA_OUTSIDE_KERNELS:
            found.append(f"{module}: imports numba outside dasknn/kernels/")
        compilers = {name for name in imported if name.split(".")[-1] in NUMBA_COMPILERS}
        compilers |= {
            node.attr
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr in NUMBA_COMPILERS
        }
        found += [
            f"{module}: compiles with numba's {name} outside dasknn/kernels/"
            for name in sorted(compilers)
        ]
    return found


def test_no_module_imports_an_upper_layer():
    paths = [*ROOT.glob("dasknn/**/*.py"), *ROOT.glob("graph/**/*.py")]
    sources = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}
    assert {layer_of(".".join(Path(p).with_suffix("").parts)) for p in sources} == set(LEVEL)
    assert violations(sources) == []


def test_numba_code_is_compiled_only_in_the_kernels():
    paths = [*ROOT.glob("dasknn/**/*.py"), *ROOT.glob("graph/**/*.py")]
    sources = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}
    assert numba_violations(sources) == []
    # every exception is still needed: its module imports numba
    importers = {p for p, source in sources.items() if numba_imports(source)}
    for module in NUMBA_OUTSIDE_KERNELS:
        assert module.replace(".", "/") + ".py" in importers, module


def test_numba_against_the_rule_is_found():
    sources = {
        "dasknn/kernels/k.py": "from numba import njit, prange\n",
        "dasknn/datasets/parse.py": "import numpy\nfrom numba import njit\n",
        "graph/cut.py": "def f():\n    import numba.cuda\n",
        "dasknn/sampled/layers.py": "import numba\n\n@numba.jit\ndef f(): pass\n",
        "dasknn/inference/_workers.py": "import numba\nn = numba.get_num_threads()\n",
    }
    assert numba_violations(sources) == [
        "dasknn.datasets.parse: imports numba outside dasknn/kernels/",
        "dasknn.datasets.parse: compiles with numba's numba.njit outside dasknn/kernels/",
        "dasknn.sampled.layers: compiles with numba's jit outside dasknn/kernels/",
        "graph.cut: imports numba outside dasknn/kernels/",
    ]


def test_levels_are_the_order_of_the_architecture_diagram():
    diagram = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split("```")[1]
    drawn = re.findall(r"(?m)^[\s|+-]*(?:dasknn/(\w+)|(graph)/)", diagram)
    assert [a or b for a, b in drawn] == [layer for names in LEVELS[1:] for layer in names]


def test_imports_against_the_rules_are_found():
    sources = {
        "dasknn/model/net.py": "def f():\n    from ..runtime import keys\n",
        "dasknn/model/__init__.py": "from .net import f\nfrom . import losses\n",
        "graph/cut.py": "import dask.array\nfrom distributed import Client\n",
        "dasknn/sampled_parallel/m.py": "from dasknn.data_parallel._plan import x\n",
        "dasknn/data_parallel/d.py": "from dasknn.inference import infer_on_cpus\n",
        "dasknn/inference/_i.py": "from dasknn.challenge import x\nfrom dasknn.runtime import w\n",
        "dasknn/challenge/c.py": "from dasknn.inference import InferenceRun\n",
        "dasknn/kernels/k.py": "from dasknn.kernels import training\nimport numpy\n",
        "dasknn/runtime/r.py": "import distributed\nfrom dasknn.extra import y\n",
    }
    assert violations(sources) == [
        "dasknn.data_parallel.d -> dasknn.inference: data_parallel and inference are side by side",
        "dasknn.inference._i -> dasknn.challenge: inference is below challenge",
        "dasknn.model.net -> dasknn.runtime: model is below runtime",
        "dasknn.runtime.r -> dasknn.extra: a layer docs/architecture.md does not place",
        "dasknn.sampled_parallel.m -> dasknn.data_parallel._plan: sampled_parallel and "
        "data_parallel are side by side",
        "graph.cut -> dask.array: graph runs in one process, without Dask",
        "graph.cut -> distributed: graph runs in one process, without Dask",
    ]
