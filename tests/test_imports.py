"""Every module of the two packages imports (run at the minimum versions too, see ``.ci/run``)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import dasknn
import graph

pytestmark = pytest.mark.minversions  # also run at the minimum versions (.ci/run)

MODULES = sorted(
    info.name
    for package in (dasknn, graph)
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + ".")
    if not info.name.endswith(".__main__")  # runs the command line when imported
)


def test_every_package_has_modules():
    assert any(name.startswith("dasknn.kernels.") for name in MODULES)
    assert any(name.startswith("graph.") for name in MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)
