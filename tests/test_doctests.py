"""Every docstring example in the package runs and prints what it says."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
import torch

import sparsefx

# sparsefx.passes and sparsefx.runtime live in their own folders (package-dir), so walk them too.
PACKAGES = (sparsefx, importlib.import_module("sparsefx.passes"), importlib.import_module("sparsefx.runtime"))
MODULES = sorted(
    {
        name
        for package in PACKAGES
        for _, name, _ in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
        if not name.endswith("__main__")
    }
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    globs = {"torch": torch, "sparsefx": sparsefx, **vars(module)}
    result = doctest.testmod(module, extraglobs=globs, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
