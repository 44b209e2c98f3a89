"""Resolving a config against a model: for each named parameter, sparse or dense, at what level and why.

The first group whose filter selects a parameter decides it; a pattern that selects no parameter at
all is an error naming the closest names; ``erk``/``er`` pools share out their level per layer; and
each parameter's seed comes from the group's base seed and its name only::

    >>> import torch
    >>> from sparsefx.config import load_config
    >>> cfg = load_config({"sparsity": 0.9, "param_filter": "fc*.weight"})
    >>> plan = resolve_config(cfg, [("fc1.weight", torch.empty(4, 4)), ("fc1.bias", torch.empty(4))])
    >>> plan["fc1.weight"].sparsity, plan["fc1.bias"].reason
    (0.9, 'no pattern matched')
    >>> plan["fc1.weight"].seed == param_seed(0, "fc1.weight")
    True
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .distributions import layer_densities
from .filters import param_shape
from .hints import closest_names
from .plan import ParamDecision, SparsityPlan
from .schedules import short_repr

if TYPE_CHECKING:
    from .schema import GroupConfig, SparsityConfig

__all__ = ["param_seed", "resolve_config"]


def param_seed(base_seed: int, name: str) -> int:
    """The seed of one parameter's pattern, from the base seed and its name only (stable across processes).

    >>> param_seed(0, "fc.weight") == param_seed(0, "fc.weight") != param_seed(1, "fc.weight")
    True
    """
    digest = hashlib.blake2b(f"{base_seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


def resolve_config(
    cfg: SparsityConfig,
    named_params: Iterable[tuple[str, Any]],
    *,
    dense: Mapping[str, str] | None = None,
    default_dense: Mapping[str, str] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> SparsityPlan:
    """Decide every parameter (``SparsityConfig.resolve`` documents the arguments).

    >>> import torch
    >>> from sparsefx.config import load_config
    >>> cfg = load_config({"sparsity": 0.5, "distribution": "erk"})
    >>> plan = resolve_config(cfg, {"a.weight": torch.empty(64, 64), "b.weight": torch.empty(4, 64)})
    >>> round(plan["a.weight"].sparsity, 3), plan["b.weight"].sparsity < plan["a.weight"].sparsity
    (0.531, True)
    """
    params = _collect(named_params)
    _check_patterns(cfg.groups, [name for name, _, _ in params], aliases or {})
    forced = dict(dense or {})
    by_default = dict(default_dense or {})
    decisions = [_decide(cfg.groups, name, param, shape, forced, by_default) for name, param, shape in params]
    return SparsityPlan(tuple(_distribute(decisions)))


def _distribute(decisions: list[ParamDecision]) -> list[ParamDecision]:
    """Replace each ``erk``/``er`` parameter's level by its share of its pool's budget."""
    pools: dict[str, list[int]] = {}
    for i, d in enumerate(decisions):
        if d.sparse and d.distribution in ("erk", "er") and d.pool is not None:
            pools.setdefault(d.pool, []).append(i)
    out = list(decisions)
    for pool, members in pools.items():
        first = decisions[members[0]]
        shapes = {decisions[i].name: decisions[i].shape for i in members}
        try:
            densities = layer_densities(shapes, first.sparsity, first.distribution)
        except ConfigError as exc:
            raise ConfigError(f"{pool}.distribution: {str(exc).removeprefix('distribution: ')}") from None
        for i in members:
            density = densities[decisions[i].name]
            # a layer given exactly the pool's level keeps it bit for bit (say, a pool of one)
            level = first.sparsity if abs(density - (1.0 - first.sparsity)) <= 1e-12 else 1.0 - density
            if not 0.0 <= level < 1.0:
                raise ConfigError(
                    f"{pool}.distribution: {first.distribution} leaves {decisions[i].name!r} no entries"
                )
            out[i] = replace(decisions[i], sparsity=level)
    return out


def _check_patterns(groups: tuple[GroupConfig, ...], names: list[str], aliases: Mapping[str, str]) -> None:
    """Every regex or glob must select at least one parameter: a typo should not silently do nothing."""
    for group in groups:
        pfilter = group.param_filter
        if pfilter.kind not in ("regex", "glob"):
            continue
        for pattern in pfilter.patterns:
            if any(pfilter.pattern_matches(pattern, name) for name in names):
                continue
            where = group.path if pfilter.kind == "regex" else f"{group.path}.param_filter"
            hint = closest_names(pattern, names, aliases)
            raise ConfigError(f"{where}: pattern {pattern!r} matches no parameter; {hint}")


def _decide(
    groups: tuple[GroupConfig, ...],
    name: str,
    param: Any,
    shape: tuple[int, ...],
    forced: dict[str, str],
    by_default: dict[str, str],
) -> ParamDecision:
    if name in forced:
        return ParamDecision(name, shape, False, reason=str(forced[name]))
    if _requires_dense(param):
        return ParamDecision(name, shape, False, reason="requires_dense")
    exclusion = None
    for index, group in enumerate(groups):
        if group.param_filter.kind == "default" and name in by_default:
            selected, why = False, by_default[name]
        else:
            selected, why = _explain(group, name, param)
        if selected:
            return _sparse_decision(index, group, name, shape, why)
        if group.param_filter.kind == "default" and exclusion is None:
            exclusion = why
    return ParamDecision(name, shape, False, reason=exclusion or "no pattern matched")


def _collect(named_params: Any) -> list[tuple[str, Any, tuple[int, ...]]]:
    if isinstance(named_params, Mapping):
        named_params = named_params.items()
    try:
        items = list(named_params)
    except TypeError:
        raise ConfigError(
            f"named_params: expected (name, tensor) pairs, got {short_repr(named_params)}"
        ) from None
    params: list[tuple[str, Any, tuple[int, ...]]] = []
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[0], str):
            raise ConfigError(f"named_params: expected (name, tensor) pairs, got {short_repr(item)}")
        name, param = item
        if name in seen:
            raise ConfigError(f"named_params: parameter {name!r} is listed twice")
        seen.add(name)
        try:
            shape = param_shape(param)
        except Exception:
            raise ConfigError(f"named_params: {name!r} has no usable shape ({short_repr(param)})") from None
        params.append((name, param, shape))
    return params


def _requires_dense(param: Any) -> bool:
    try:
        return bool(getattr(param, "requires_dense", False))
    except Exception:
        return False


def _explain(group: GroupConfig, name: str, param: Any) -> tuple[bool, str]:
    try:
        return group.param_filter.explain(name, param)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{group.path}.param_filter: failed on {name!r}: {exc!r}") from exc


def _sparse_decision(
    index: int, group: GroupConfig, name: str, shape: tuple[int, ...], why: str
) -> ParamDecision:
    level = group.sparsity(0)
    if not 0.0 <= level < 1.0:
        raise ConfigError(f"{group.path}.sparsity: {level!r} at step 0 is not in [0, 1)")
    for key, groups, dim in (
        ("balance_out_groups", group.balance_out_groups, 0),
        ("balance_in_groups", group.balance_in_groups, 1),
    ):
        if groups is None:
            continue
        if len(shape) < 2:
            raise ConfigError(
                f"{group.path}.{key}: {name!r} has shape {shape}; balanced groups need ndim >= 2"
            )
        if shape[dim] % groups:
            raise ConfigError(
                f"{group.path}.{key}: {groups} does not divide dim {dim} of {name!r} "
                f"(size {shape[dim]}, shape {shape})"
            )
    return ParamDecision(
        name=name,
        shape=shape,
        sparse=True,
        sparsity=level,
        group=index,
        algorithm=group.algorithm,
        init_method=group.init_method,
        seed=param_seed(group.seed, name),
        balance_in_groups=group.balance_in_groups,
        balance_out_groups=group.balance_out_groups,
        reason=why,
        distribution=group.distribution,
        pool=None if group.distribution == "uniform" else group.pool_key,
    )
