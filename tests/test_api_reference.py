"""The API reference documents exactly the public API: every page of ``docs/api/`` renders whole
packages (``::: package``), each of which declares its public names in ``__all__``, and every
public package of dasknn and ``graph`` is on a page. mkdocs renders a package's ``__all__`` only
(``filters: public`` in ``mkdocs.yml``)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
import yaml

import dasknn

pytestmark = pytest.mark.minversions

ROOT = Path(__file__).resolve().parents[1]
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.M)


def _documented() -> list[str]:
    return [
        name
        for page in sorted((ROOT / "docs" / "api").glob("*.md"))
        for name in DIRECTIVE.findall(page.read_text(encoding="utf-8"))
    ]


def _public_packages() -> set[str]:
    """dasknn's sub-packages and public top-level modules that declare ``__all__`` (not the
    command line), and ``graph``."""
    names = {"graph"}
    for info in pkgutil.iter_modules(dasknn.__path__):
        if info.name.startswith("_") or info.name in ("cli", "kernels"):
            continue
        module = importlib.import_module(f"dasknn.{info.name}")
        if hasattr(module, "__all__"):
            names.add(module.__name__)
    return names


def test_every_page_renders_whole_packages_with_their_all():
    documented = _documented()
    assert len(documented) == len(set(documented)), "a package is on two pages"
    for name in documented:
        module = importlib.import_module(name)
        assert hasattr(module, "__all__"), f"{name} declares no __all__"
        assert hasattr(module, "__path__") or name.count(".") <= 1, f"{name} is not a package"


def test_every_public_package_is_documented():
    assert _public_packages() <= set(_documented())


def test_mkdocs_renders_only_the_public_names():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = re.sub(r"!!python/\S+", "", config)
    options = yaml.safe_load(config)["plugins"][1]["mkdocstrings"]["handlers"]["python"]["options"]
    assert options["filters"] == "public" and options["show_submodules"] is False
