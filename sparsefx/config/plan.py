"""What resolving a config against a model decided: a ``SparsityPlan`` of one ``ParamDecision`` per parameter.

>>> fc = ParamDecision("fc.weight", (4, 4), True, sparsity=0.5, reason="default filter")
>>> plan = SparsityPlan((fc,))
>>> plan["fc.weight"].sparsity, list(plan.sparse), list(plan.dense)
(0.5, ['fc.weight'], [])
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ParamDecision", "SparsityPlan"]


@dataclass(frozen=True)
class ParamDecision:
    """What the config decided for one parameter, and why.

    ``sparsity`` is this parameter's own level: for ``erk``/``er`` it is ``1 - density`` of the
    layer's share of its pool's budget. For ``global`` it stays the pool's level, and the mask builder
    takes one magnitude top-k over every parameter with the same ``pool``. ``pool`` is None for
    ``uniform``.
    """

    name: str
    shape: tuple[int, ...]
    sparse: bool
    sparsity: float = 0.0
    group: int | None = None
    algorithm: str | None = None
    init_method: str | Callable[..., Any] | None = None
    seed: int = 0
    balance_in_groups: int | None = None
    balance_out_groups: int | None = None
    reason: str = ""
    distribution: str = "uniform"
    pool: str | None = None


@dataclass(frozen=True)
class SparsityPlan:
    """Every parameter's decision, in the model's order; indexable by name.

    >>> plan = SparsityPlan((ParamDecision("b", (3,), False, reason="default exclusion: ndim <= 1"),))
    >>> plan["b"].reason, len(plan.sparse)
    ('default exclusion: ndim <= 1', 0)
    """

    decisions: tuple[ParamDecision, ...]

    @property
    def sparse(self) -> dict[str, ParamDecision]:
        return {d.name: d for d in self.decisions if d.sparse}

    @property
    def dense(self) -> dict[str, ParamDecision]:
        return {d.name: d for d in self.decisions if not d.sparse}

    @functools.cached_property
    def _index(self) -> dict[str, ParamDecision]:
        return {d.name: d for d in self.decisions}

    def __getitem__(self, name: str) -> ParamDecision:
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"no parameter named {name!r} in this plan") from None

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self) -> Iterator[ParamDecision]:
        return iter(self.decisions)

    def __len__(self) -> int:
        return len(self.decisions)
