"""Sparsity configs: a float, a dict (either Cerebras grammar), a list of groups, or YAML, parsed once.

``load_config`` validates everything it can without a model; ``SparsityConfig.resolve`` then decides,
for each named parameter, whether it is sparse, at what level and why::

    >>> import torch
    >>> cfg = load_config({"sparsity": 0.9, "param_filter": "fc*.weight"})
    >>> plan = cfg.resolve([("fc1.weight", torch.empty(4, 4)), ("fc1.bias", torch.empty(4))])
    >>> plan["fc1.weight"].sparsity, plan["fc1.bias"].reason
    (0.9, 'no pattern matched')

One idea per module: ``schema`` (the parsed config), ``filters`` (which parameters a group selects),
``plan`` (what resolving decided), ``read`` (YAML text and files), ``parse`` (both grammars, with key
paths in every error), ``resolve`` (against a model's named parameters) and ``hints`` (the closest
names for a pattern that matches nothing).
"""

from __future__ import annotations

from .filters import DEFAULT_EXCLUDED_WORDS, ParamFilter
from .filters import DEFAULT_FILTER as DEFAULT_FILTER
from .filters import FILTER_KINDS as FILTER_KINDS
from .hints import closest_names
from .parse import load_config, with_defaults
from .plan import ParamDecision, SparsityPlan

# also importable from here, as before the split (explicit re-exports, not in __all__)
from .registry import GROUP_KEYS as GROUP_KEYS
from .resolve import param_seed
from .schema import DEFAULT_SEED, DISTRIBUTIONS, INIT_METHODS, GroupConfig, SparsityConfig
from .schema import GRAMMARS as GRAMMARS

__all__ = [
    "DEFAULT_SEED",
    "INIT_METHODS",
    "DEFAULT_EXCLUDED_WORDS",
    "DISTRIBUTIONS",
    "param_seed",
    "load_config",
    "ParamFilter",
    "GroupConfig",
    "SparsityConfig",
    "ParamDecision",
    "SparsityPlan",
    "with_defaults",
    "closest_names",
]
