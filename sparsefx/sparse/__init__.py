"""Sparsity algorithms: Static, GMP, SET, RigL, Group, and the bases for custom ones.

    >>> from sparsefx.config import load_config
    >>> from sparsefx.sparse import build_algorithm
    >>> sparsity = build_algorithm(load_config({"algorithm": "rigl", "sparsity": 0.9}))
    >>> type(sparsity).__name__, sparsity.update_schedule.freq
    ('RigL', 100)

Names load on first use. ``sparsefx.config`` imports ``schedules``, ``registry`` and
``distributions`` from this package, which runs this file first; the algorithms import
``sparsefx.config``, so eager imports here would close a loop. No module of ``sparsefx.config``
imports ``base`` (it reads algorithm rules through ``registry.config_rule``).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "SparsityAlgorithm",
    "DynamicSparsityAlgorithm",
    "SparseParam",
    "Static",
    "GMP",
    "SET",
    "RigL",
    "Group",
    "build_algorithm",
    "tensorboard_hook",
]

_HOME = {
    "SparsityAlgorithm": "base",
    "DynamicSparsityAlgorithm": "base",
    "SparseParam": "base",
    "Static": "static",
    "GMP": "gmp",
    "SET": "set",
    "RigL": "rigl",
    "Group": "group",
    "build_algorithm": "build",
    "tensorboard_hook": "logging",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'sparsefx.sparse' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
