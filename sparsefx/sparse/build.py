"""Build the algorithm a parsed config describes.

>>> from sparsefx.config import load_config
>>> cfg = load_config([{"sparsity": 0.5, "param_filter": "a*"}, {"algorithm": "set", "sparsity": 0.9}])
>>> type(build_algorithm(cfg)).__name__
'Group'
"""

from __future__ import annotations

from ..config import GroupConfig, SparsityConfig
from ..config.registry import construct, lookup
from ..errors import ConfigError
from . import gmp, rigl, set, static  # noqa: F401  (register the built-in algorithms)
from .base import SparsityAlgorithm
from .group import Group

__all__ = ["build_algorithm"]


def build_algorithm(cfg: SparsityConfig) -> SparsityAlgorithm:
    """One group's algorithm, or a Group of them (first matching filter wins)."""
    algorithms = [_one(group) for group in cfg.groups]
    return algorithms[0] if len(algorithms) == 1 else Group(algorithms)


def _one(group: GroupConfig) -> SparsityAlgorithm:
    """Construct the group's class with its hyperparameters, however its ``__init__`` is written."""
    cls = lookup(group.algorithm)
    if cls is None:
        raise ConfigError(f"{group.path}.algorithm: {group.algorithm!r} has no implementation")
    return construct(cls, group)
