"""The data model of a parsed config: ``SparsityConfig``, a tuple of ``GroupConfig`` in priority order.

Every field is parsed and validated once (``sparsefx.config.parse``); nothing downstream sees a raw dict::

    >>> from sparsefx.config.schedules import Constant
    >>> cfg = SparsityConfig((GroupConfig("sparsity", sparsity=Constant(0.5)),), "float")
    >>> cfg.groups[0].algorithm, cfg.groups[0].param_filter.kind, cfg.groups[0].pool_key
    ('static', 'default', 'sparsity')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .distributions import METHODS
from .filters import DEFAULT_FILTER, ParamFilter
from .plan import SparsityPlan
from .resolve import resolve_config
from .schedules import Constant, Schedule, UpdateSchedule

__all__ = ["DEFAULT_SEED", "INIT_METHODS", "DISTRIBUTIONS", "GRAMMARS", "GroupConfig", "SparsityConfig"]

DEFAULT_SEED = 0
INIT_METHODS = ("random", "topk", "from_zeros", "checkerboard")
DISTRIBUTIONS = (*METHODS, "global")
GRAMMARS = ("float", "modelzoo", "cstorch", "list")


@dataclass(frozen=True)
class GroupConfig:
    """One group of parameters sharing an algorithm and its settings; ``path`` locates it in the config.

    ``distribution`` spreads the group's level over its parameters (``uniform``, ``erk``, ``er`` or
    ``global``). It is solved over a *pool*: the groups whose ``pool`` (or, when None, ``path``) is
    the same. Patterns of one config dict share a pool, except an entry that overrides ``sparsity``,
    which forms its own, so an explicit per-pattern level always wins.

    ``options`` are a user algorithm's hyperparameters (config keys its constructor names), passed to
    its constructor; ``given`` are the keys the config itself gave (the rest are defaults).
    """

    path: str
    algorithm: str = "static"
    sparsity: Schedule = Constant(0.0)
    param_filter: ParamFilter = DEFAULT_FILTER
    init_method: str | Callable[..., Any] = "random"
    seed: int = DEFAULT_SEED
    update: UpdateSchedule | None = None
    drop_fraction: Schedule | None = None
    balance_in_groups: int | None = None
    balance_out_groups: int | None = None
    options: tuple[tuple[str, Any], ...] = ()
    distribution: str = "uniform"
    pool: str | None = None
    given: frozenset[str] = frozenset()

    @property
    def pool_key(self) -> str:
        """The name of the pool this group's distribution is solved over."""
        return self.pool or self.path


@dataclass(frozen=True)
class SparsityConfig:
    """A parsed, validated config: groups in priority order (the first matching filter wins)."""

    groups: tuple[GroupConfig, ...]
    grammar: str = "cstorch"

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError("sparsity: a config needs at least one group")
        if self.grammar not in GRAMMARS:
            raise ConfigError(f"grammar {self.grammar!r} is not one of {', '.join(GRAMMARS)}")

    def resolve(
        self,
        named_params: Iterable[tuple[str, Any]],
        *,
        dense: Mapping[str, str] | None = None,
        default_dense: Mapping[str, str] | None = None,
        aliases: Mapping[str, str] | None = None,
    ) -> SparsityPlan:
        """Decide every parameter.

        ``dense`` maps names the caller forces dense to the reason. ``default_dense`` maps names
        that only the default filter leaves dense (say, weights of ``nn.Embedding`` modules named
        ``wte``): an explicit pattern can still select them. ``aliases`` maps the other names of a
        tied parameter to the one listed (``{"lm_head.weight": "wte.weight"}``), for error hints.
        """
        return resolve_config(self, named_params, dense=dense, default_dense=default_dense, aliases=aliases)
