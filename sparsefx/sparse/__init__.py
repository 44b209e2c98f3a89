"""Sparsity algorithms: Static, GMP, SET, RigL, Group, and the bases for custom ones.

    >>> from sparsefx.config import load_config
    >>> from sparsefx.sparse import build_algorithm
    >>> sparsity = build_algorithm(load_config({"algorithm": "rigl", "sparsity": 0.9}))
    >>> type(sparsity).__name__, sparsity.update_schedule.freq
    ('RigL', 100)

The algorithms import ``sparsefx.config``; the config layer imports nothing from this package
(schedules, the algorithm registry, layer distributions and the counting rule live in
``sparsefx.config``, and algorithm rules are read through ``config.registry.config_rule``).
"""

from __future__ import annotations

from .base import DynamicSparsityAlgorithm, SparseParam, SparsityAlgorithm
from .build import build_algorithm
from .gmp import GMP
from .group import Group
from .logging import tensorboard_hook
from .rigl import RigL
from .set import SET
from .static import Static

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
