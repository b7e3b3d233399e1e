"""Every public class and function of the package roots (``dasknn``, ``graph``) has a numpy-style
docstring: a summary, and a ``Parameters`` (or, for a record, ``Attributes``) section when it
takes arguments (an exception class takes its message as every exception does, and needs only the
summary)."""

from __future__ import annotations

import inspect
import re

import pytest

import dasknn
import graph

PUBLIC = [
    (package, name)
    for package in (dasknn, graph)
    for name in package.__all__
    if inspect.isclass(getattr(package, name)) or inspect.isfunction(getattr(package, name))
]


def numpy_style_problem(obj) -> str | None:
    """What the docstring of ``obj`` lacks to be numpy-style, or ``None``."""
    doc = inspect.getdoc(obj)
    if not doc or not doc.strip():
        return "no docstring"
    if not doc.splitlines()[0].strip():
        return "no summary line"
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return None
    arguments = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
    sections = set(re.findall(r"(?m)^(\w[\w ]*)\n-{3,}$", doc))
    if arguments and not sections & {"Parameters", "Attributes"}:
        return f"takes {', '.join(arguments)} but has no Parameters section"
    return None


@pytest.mark.parametrize(("package", "name"), PUBLIC, ids=[f"{p.__name__}.{n}" for p, n in PUBLIC])
def test_public_name_has_a_numpy_docstring(package, name):
    assert numpy_style_problem(getattr(package, name)) is None


def test_a_docstring_without_sections_is_found():
    def documented(x):
        """Summary.

        Parameters
        ----------
        x : int
        """

    def bare(x):
        """Only a summary."""

    assert numpy_style_problem(documented) is None
    assert numpy_style_problem(bare) == "takes x but has no Parameters section"
    assert numpy_style_problem(lambda: None) == "no docstring"
    undocumented_error = type("UndocumentedError", (RuntimeError,), {"__doc__": ""})
    assert numpy_style_problem(undocumented_error) == "no docstring"
