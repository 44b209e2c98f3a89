"""Group: different algorithms for different parameters; the first matching filter wins.

>>> from sparsefx.sparse import RigL, Static
>>> g = Group({"*.mlp.*": RigL(sparsity=0.9), "*.attn.*": Static(sparsity=0.5)})
>>> [type(a).__name__ for a in g.algorithms]
['RigL', 'Static']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..config import ParamFilter, SparsityConfig, SparsityPlan
from ..errors import ConfigError
from .base import SparsityAlgorithm
from .select import resolve_plan

__all__ = ["Group"]

Filter = str | Sequence[str] | Callable[[str, Any], bool]


class Group(SparsityAlgorithm):
    """A map ``{filter: algorithm}``; a filter is a glob, a list of globs or ``(name, param) -> bool``."""

    name = "group"
    selectable = False

    def __init__(self, algorithms: Mapping[Any, SparsityAlgorithm] | Sequence[SparsityAlgorithm]) -> None:
        if isinstance(algorithms, Mapping):
            pairs = [(_filter(key), alg) for key, alg in algorithms.items()]
        else:
            pairs = [(alg.group.param_filter, alg) for alg in algorithms]
        if not pairs:
            raise ConfigError("Group: needs at least one {filter: algorithm} entry")
        for _, alg in pairs:
            if isinstance(alg, Group):
                raise ConfigError("Group: a Group cannot contain another Group; list its entries instead")
            if not isinstance(alg, SparsityAlgorithm):
                raise ConfigError(f"Group: {alg!r} is not a SparsityAlgorithm")
        self.algorithms = [alg for _, alg in pairs]
        for pfilter, alg in pairs:
            alg.group = replace(alg.group, param_filter=pfilter)
        super().__init__(self.algorithms[0].group)
        self.config = SparsityConfig(tuple(alg.group for alg in self.algorithms))

    def bind(self, model: nn.Module, plan: SparsityPlan | None = None, *, graph_masked: bool = False) -> None:
        plan = plan if plan is not None else resolve_plan(self.config, model)
        for index, alg in enumerate(self.algorithms):
            mine = SparsityPlan(tuple(d for d in plan.sparse.values() if d.group == index))
            alg.bind(model, mine, graph_masked=graph_masked)
            self.params.update(alg.params)

    def initial_plan(self, plan: SparsityPlan) -> SparsityPlan:
        return SparsityPlan(
            tuple(self.algorithms[d.group].initial_decision(d) if d.sparse else d for d in plan.decisions)
        )

    def _track(self, optimizer: torch.optim.Optimizer) -> None:
        for alg in self.algorithms:
            alg._track(optimizer)

    def mask_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        for alg in self.algorithms:
            alg.mask_optimizer_state(optimizer)

    def update(self) -> None:
        self._bind_pending()
        self.step += 1
        for alg in self.algorithms:
            alg.update()

    def register_target_sparsity_hook(self, hook: Any) -> None:
        for alg in self.algorithms:
            alg.register_target_sparsity_hook(hook)

    def state_dict(self) -> dict[str, Any]:
        return {
            "algorithm": "group",
            "step": self.step,
            "groups": [alg.state_dict() for alg in self.algorithms],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        groups = state.get("groups", [])
        if len(groups) != len(self.algorithms):
            raise ConfigError(
                f"sparsity state has {len(groups)} groups; this Group has {len(self.algorithms)}"
            )
        for alg, sub in zip(self.algorithms, groups):
            alg.load_state_dict(sub)


def _filter(key: Filter) -> ParamFilter:
    if callable(key):
        return ParamFilter("callable", (), key)
    if isinstance(key, str):
        return ParamFilter("glob", (key,))
    if isinstance(key, Sequence) and key and all(isinstance(k, str) for k in key):
        return ParamFilter("glob", tuple(key))
    raise ConfigError(
        f"Group: filter {key!r} must be a glob, a list of globs or a callable (name, param) -> bool"
    )
