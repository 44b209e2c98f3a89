"""Parsing: any accepted config form (float, dict of either Cerebras grammar, list of groups, YAML) into a
validated ``SparsityConfig``, with every error naming its key path.

``load_config`` validates everything it can without a model; ``SparsityConfig.resolve`` then decides,
for each named parameter, whether it is sparse, at what level and why::

    >>> load_config({"algorithm": "set", "sparsity": 0.9}).groups[0].drop_fraction
    Constant(value=0.3)
    >>> load_config({"sparsity": 0.9, "sparsity_x": 1})
    Traceback (most recent call last):
    ...
    sparsefx.errors.ConfigError: sparsity.sparsity_x: unknown key (did you mean 'sparsity'?); valid keys: ...
"""

from __future__ import annotations

import difflib
import numbers
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..errors import ConfigError
from .filters import DEFAULT_FILTER, ParamFilter, check_glob, check_regex
from .read import read_file, read_text
from .registry import (
    BUILTIN_ALGORITHMS,
    DYNAMIC_ALGORITHMS,
    GROUP_KEYS,
    algorithm_names,
    config_rule,
    hyperparameters,
    lookup,
)
from .schedules import (
    Constant,
    Cycling,
    Polynomial,
    Schedule,
    UpdateSchedule,
    key_path,
    parse_schedule,
    parse_update,
    short_repr,
)
from .schema import DEFAULT_SEED, DISTRIBUTIONS, INIT_METHODS, GroupConfig, SparsityConfig

__all__ = ["load_config", "with_defaults"]

# the drop fraction of an algorithm whose class declares no ``default_drop_fraction`` (user
# algorithms may call drop_and_grow too); the built-ins declare their own config rules
DEFAULT_DROP_FRACTION = 0.3
OVERRIDE_KEYS = ("sparsity", "init_method", "seed")
PARAMS_FILE_SECTIONS = ("model", "optimizer", "train_input", "eval_input", "runconfig")


def load_config(source: Any) -> SparsityConfig:
    """Parse any accepted config form into a validated SparsityConfig.

    >>> load_config(0.5).groups[0].sparsity
    Constant(value=0.5)
    >>> load_config("sparsity: 0.5\\nalgorithm: static").grammar
    'cstorch'
    """
    if isinstance(source, SparsityConfig):
        return source
    if isinstance(source, os.PathLike):
        return _parse_top(read_file(source))
    if isinstance(source, str):
        return _parse_top(read_text(source))
    return _parse_top(source)


def _parse_top(data: Any) -> SparsityConfig:
    path = "sparsity"
    if data is None:
        raise ConfigError(f"{path}: the config is empty")
    if isinstance(data, Mapping):
        return _parse_mapping(data, path)
    if isinstance(data, (list, tuple)):
        return SparsityConfig(tuple(_parse_list(data, path)), "list")
    if isinstance(data, numbers.Real):
        return SparsityConfig((_float_group(data, path),), "float")
    raise ConfigError(
        f"{path}: expected a number, a dict, a list of groups, YAML text or a YAML file, "
        f"got {short_repr(data)}"
    )


def _is_section(value: Any) -> bool:
    """Does ``value`` look like the content of a params file's ``sparsity:`` section (not a schedule dict)?"""
    if not isinstance(value, Mapping):
        return False
    if any(key in GROUP_KEYS and key != "type" for key in value):
        return True
    kind = value.get("type")
    return isinstance(kind, str) and kind.lower() in algorithm_names()


def _parse_mapping(data: Mapping[Any, Any], path: str) -> SparsityConfig:
    _check_string_keys(data, path)
    others = [key for key in data if key != "sparsity"]
    has_group_keys = any(key in GROUP_KEYS for key in others)
    in_params_file = any(key in PARAMS_FILE_SECTIONS for key in others)
    if "sparsity" in data and not has_group_keys and (in_params_file or _is_section(data["sparsity"])):
        return _parse_section(data["sparsity"], path)
    if "sparsity" not in data and not has_group_keys and in_params_file:
        raise ConfigError(
            f"{path}: no sparsity settings found (a params file needs a 'sparsity' section); "
            f"valid keys: {', '.join(GROUP_KEYS)}"
        )
    grammar = "modelzoo" if "param_name_patterns" in data else "cstorch"
    return SparsityConfig(tuple(_parse_group(data, path)), grammar)


def _parse_section(section: Any, path: str) -> SparsityConfig:
    """The ``sparsity:`` section of a Model Zoo params file (every other section is ignored)."""
    if section is None:
        raise ConfigError(f"{path}: the params file's sparsity section is empty")
    if isinstance(section, Mapping):
        _check_string_keys(section, path)
        return SparsityConfig(tuple(_parse_group(section, path)), "modelzoo")
    return _parse_top(section)


def _parse_list(items: list[Any] | tuple[Any, ...], path: str) -> list[GroupConfig]:
    if len(items) == 0:
        raise ConfigError(f"{path}: an empty list has no groups; give at least one dict or number")
    groups: list[GroupConfig] = []
    for index, item in enumerate(items):
        item_path = f"{path}[{index}]"
        if isinstance(item, Mapping):
            _check_string_keys(item, item_path)
            groups.extend(_parse_group(item, item_path))
        elif isinstance(item, numbers.Real):
            groups.append(_float_group(item, item_path))
        elif isinstance(item, (list, tuple)):
            raise ConfigError(f"{item_path}: a group cannot contain a list of groups (nested groups)")
        else:
            raise ConfigError(f"{item_path}: expected a dict or a number, got {short_repr(item)}")
    return groups


def _float_group(value: Any, path: str) -> GroupConfig:
    schedule = parse_schedule(value, path)
    _check_levels(schedule, path, upper=1.0, closed=False)
    return GroupConfig(path=path, sparsity=schedule)


def _parse_group(data: Mapping[str, Any], path: str) -> list[GroupConfig]:
    algorithm = _parse_algorithm(data, path)
    options = _parse_options(data, algorithm, path)
    _check_keys({key: value for key, value in data.items() if key not in options}, GROUP_KEYS, path)
    if "param_filter" in data and "param_name_patterns" in data:
        raise ConfigError(f"{path}: give param_filter (globs) or param_name_patterns (regexes), not both")
    sparsity_key = _alias(data, "sparsity", "schedule", path, deprecated=False)
    base_sparsity = None
    if sparsity_key is not None:
        base_sparsity = (
            parse_schedule(data[sparsity_key], f"{path}.{sparsity_key}"),
            f"{path}.{sparsity_key}",
        )
    distribution = _parse_distribution(data, path)
    default_init = "topk" if distribution == "global" else "random"
    init_method = (
        _parse_init(data["init_method"], f"{path}.init_method") if "init_method" in data else default_init
    )
    seed = _parse_seed(data["seed"], f"{path}.seed") if "seed" in data else DEFAULT_SEED
    update = _parse_group_update(data, algorithm, path)
    drop_fraction = _parse_drop_fraction(data, algorithm, path)
    balance_in, balance_out = _parse_balance(data, path)

    groups = []
    for group_path, pfilter, overrides in _parse_filters(data, path):
        sparsity = overrides.get("sparsity", base_sparsity)
        if sparsity is None:
            raise ConfigError(f"{path}.sparsity: missing required key (a float in [0, 1) or a schedule)")
        _check_global(
            distribution, overrides.get("init_method", init_method), balance_in, balance_out, group_path
        )
        own_pool = "sparsity" in overrides or group_path == path
        groups.append(
            GroupConfig(
                path=group_path,
                algorithm=algorithm,
                sparsity=_check_sparsity(sparsity[0], algorithm, sparsity[1]),
                param_filter=pfilter,
                init_method=overrides.get("init_method", init_method),
                seed=overrides.get("seed", seed),
                update=update,
                drop_fraction=drop_fraction,
                balance_in_groups=balance_in,
                balance_out_groups=balance_out,
                options=tuple(options.items()),
                distribution=distribution,
                pool=None if own_pool else path,
                given=frozenset(data) | frozenset(overrides),
            )
        )
    return groups


def _parse_options(data: Mapping[str, Any], algorithm: str, path: str) -> dict[str, Any]:
    """The hyperparameters of a user algorithm: keys that are not group keys, checked against the
    names its constructor takes (built-in algorithms take none)."""
    extra = {key: value for key, value in data.items() if key not in GROUP_KEYS}
    cls = lookup(algorithm) if algorithm not in BUILTIN_ALGORITHMS else None
    if not extra or cls is None:
        return {}
    accepted = hyperparameters(cls)
    for key in extra:
        if key in accepted:
            continue
        close = difflib.get_close_matches(key, (*accepted, *GROUP_KEYS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        takes = ", ".join(accepted) if accepted else "no hyperparameters"
        raise ConfigError(
            f"{key_path(path, key)}: unknown key{hint}; {cls.__name__}.__init__ accepts {takes} "
            f"besides the group keys: {', '.join(GROUP_KEYS)}"
        )
    return extra


def with_defaults(group: GroupConfig, defaults: Mapping[str, Any]) -> GroupConfig:
    """``group`` with the settings of ``defaults`` that its config did not give.

    This is how a user algorithm's own defaults apply under a config: its constructor may pass, say,
    ``update={"freq": 10}`` on to ``super().__init__``; a config that gives ``update`` wins.

    >>> g = load_config({"sparsity": 0.5}).groups[0]
    >>> with_defaults(g, {"seed": 7, "sparsity": 0.9}).seed, with_defaults(g, {"sparsity": 0.9}).sparsity
    (7, Constant(value=0.5))
    """
    _check_keys(defaults, GROUP_KEYS, group.path)
    fresh = {
        key: value
        for key, value in defaults.items()
        if key not in group.given and key not in ("algorithm", "type")
    }
    if not fresh:
        return group
    fields = {"param_name_patterns": "param_filter", "schedule": "sparsity"}
    data = {"algorithm": group.algorithm, "sparsity": group.sparsity, **fresh}
    parsed = _parse_group(data, group.path)[0]
    changes: dict[str, Any] = {fields.get(key, key): getattr(parsed, fields.get(key, key)) for key in fresh}
    return replace(group, **changes, given=group.given | frozenset(fresh))


def _parse_distribution(data: Mapping[str, Any], path: str) -> str:
    if "distribution" not in data:
        return "uniform"
    value = data["distribution"]
    if not isinstance(value, str) or value.lower() not in DISTRIBUTIONS:
        raise ConfigError(
            f"{path}.distribution: unknown distribution {short_repr(value)}; "
            f"valid: {', '.join(DISTRIBUTIONS)}"
        )
    return value.lower()


def _check_global(
    distribution: str, init_method: Any, balance_in: int | None, balance_out: int | None, path: str
) -> None:
    """``global`` ranks magnitudes across layers: it needs init_method topk and no balance groups."""
    if distribution != "global":
        return
    if init_method != "topk":
        raise ConfigError(
            f"{path}.init_method: distribution 'global' takes one magnitude top-k across the group, so it "
            f"needs init_method 'topk' (the default with 'global'), got {short_repr(init_method)}"
        )
    if balance_in is not None or balance_out is not None:
        raise ConfigError(
            f"{path}: distribution 'global' cannot keep balance groups; "
            "remove balance_in_groups/balance_out_groups"
        )


def _parse_algorithm(data: Mapping[str, Any], path: str) -> str:
    key = _alias(data, "algorithm", "type", path, deprecated=True)
    if key is None:
        return "static"
    value, names = data[key], algorithm_names()
    if not isinstance(value, str) or value.lower() not in names:
        close = difflib.get_close_matches(value.lower(), names, n=1) if isinstance(value, str) else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"{path}.{key}: unknown algorithm {short_repr(value)}; valid: {', '.join(names)}{hint}"
        )
    return value.lower()


def _alias(data: Mapping[str, Any], key: str, alias: str, path: str, *, deprecated: bool) -> str | None:
    """Which of ``key`` or its alias is given (None if neither); both is an error."""
    if key in data and alias in data:
        raise ConfigError(f"{path}: give {key!r} or its alias {alias!r}, not both")
    if alias in data:
        if deprecated:
            _warn(f"{path}.{alias} is deprecated; use '{key}' instead")
        return alias
    return key if key in data else None


def _warn(message: str) -> None:
    """A FutureWarning pointing at the first caller outside this module."""
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, FutureWarning, stacklevel=level)


def _parse_init(value: Any, path: str) -> str | Callable[..., Any]:
    if isinstance(value, str) and value.lower() in INIT_METHODS:
        return value.lower()
    if callable(value) and not isinstance(value, str):
        return value
    raise ConfigError(
        f"{path}: unknown init method {short_repr(value)}; valid: {', '.join(INIT_METHODS)}, or a callable"
    )


def _parse_seed(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ConfigError(f"{path}: expected a non-negative integer, got {short_repr(value)}")
    return int(value)


def _parse_positive(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"{path}: expected a positive integer, got {short_repr(value)}")
    return int(value)


def _parse_group_update(data: Mapping[str, Any], algorithm: str, path: str) -> UpdateSchedule | None:
    if "update" not in data:
        return config_rule(algorithm, "default_update", None)
    if not config_rule(algorithm, "updates_mask", True):
        raise ConfigError(
            f"{path}.update: {algorithm} sparsity never updates its mask; remove 'update' or use a dynamic "
            f"algorithm ({', '.join(name for name in algorithm_names() if name in DYNAMIC_ALGORITHMS)})"
        )
    return parse_update(data["update"], f"{path}.update")


def _parse_drop_fraction(data: Mapping[str, Any], algorithm: str, path: str) -> Schedule | None:
    default = config_rule(algorithm, "default_drop_fraction", DEFAULT_DROP_FRACTION)
    if "drop_fraction" not in data:
        return None if default is None else Constant(default)
    if default is None:
        raise ConfigError(
            f"{path}.drop_fraction: only set and rigl drop and regrow; {algorithm} has no drop_fraction"
        )
    schedule = parse_schedule(data["drop_fraction"], f"{path}.drop_fraction")
    _check_levels(schedule, f"{path}.drop_fraction", upper=1.0, closed=True)
    return schedule


def _parse_balance(data: Mapping[str, Any], path: str) -> tuple[int | None, int | None]:
    if "balance_in_groups" in data and "balance_out_groups" in data:
        raise ConfigError(f"{path}: balance_in_groups and balance_out_groups are mutually exclusive")
    balance_in = balance_out = None
    if "balance_in_groups" in data:
        balance_in = _parse_positive(data["balance_in_groups"], f"{path}.balance_in_groups")
    if "balance_out_groups" in data:
        balance_out = _parse_positive(data["balance_out_groups"], f"{path}.balance_out_groups")
    return balance_in, balance_out


def _parse_filters(data: Mapping[str, Any], path: str) -> list[tuple[str, ParamFilter, dict[str, Any]]]:
    """(group path, filter, overrides) for each group this dict makes; overrides only come from patterns."""
    if "param_name_patterns" in data:
        return _parse_patterns(data["param_name_patterns"], f"{path}.param_name_patterns")
    if "param_filter" not in data:
        return [(path, DEFAULT_FILTER, {})]
    value, fpath = data["param_filter"], f"{path}.param_filter"
    if callable(value) and not isinstance(value, str):
        return [(path, ParamFilter("callable", fn=value), {})]
    globs = [value] if isinstance(value, str) else value
    if not isinstance(globs, (list, tuple)) or len(globs) == 0:
        raise ConfigError(
            f"{fpath}: expected a glob, a non-empty list of globs or a callable, got {short_repr(value)}"
        )
    for index, glob in enumerate(globs):
        check_glob(glob, fpath if isinstance(value, str) else f"{fpath}[{index}]")
    return [(path, ParamFilter("glob", tuple(globs)), {})]


def _parse_patterns(value: Any, path: str) -> list[tuple[str, ParamFilter, dict[str, Any]]]:
    if isinstance(value, str):
        return [(path, _regex_filter(value, path), {})]
    if isinstance(value, (list, tuple)) and len(value) > 0:
        return [(f"{path}[{i}]", _regex_filter(p, f"{path}[{i}]"), {}) for i, p in enumerate(value)]
    if isinstance(value, Mapping) and len(value) > 0:
        entries = []
        for pattern, overrides in value.items():
            entry_path = f"{path}[{short_repr(pattern)}]"
            entries.append(
                (entry_path, _regex_filter(pattern, entry_path), _parse_overrides(overrides, entry_path))
            )
        return entries
    raise ConfigError(
        f"{path}: expected a regex, a non-empty list of regexes or a non-empty dict {{regex: overrides}}, "
        f"got {short_repr(value)}"
    )


def _parse_overrides(value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{path}: expected a dict of overrides ({', '.join(OVERRIDE_KEYS)}) or nothing, "
            f"got {short_repr(value)}"
        )
    _check_string_keys(value, path)
    _check_keys(value, OVERRIDE_KEYS, path)
    overrides: dict[str, Any] = {}
    if "sparsity" in value:
        overrides["sparsity"] = (parse_schedule(value["sparsity"], f"{path}.sparsity"), f"{path}.sparsity")
    if "init_method" in value:
        overrides["init_method"] = _parse_init(value["init_method"], f"{path}.init_method")
    if "seed" in value:
        overrides["seed"] = _parse_seed(value["seed"], f"{path}.seed")
    return overrides


def _regex_filter(pattern: Any, path: str) -> ParamFilter:
    check_regex(pattern, path)
    return ParamFilter("regex", (pattern,))


# ---------------------------------------------------------------------------------------------------------
# Checks shared by the parsers


def _check_string_keys(data: Mapping[Any, Any], path: str) -> None:
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{key_path(path, key)}: keys must be strings, got {short_repr(key)}")


def _check_keys(data: Mapping[str, Any], valid: tuple[str, ...], path: str) -> None:
    for key in data:
        if key in valid:
            continue
        close = difflib.get_close_matches(key, valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key_path(path, key)}: unknown key{hint}; valid keys: {', '.join(valid)}")


def _levels(schedule: Schedule) -> list[float]:
    """The values of a schedule worth range-checking before training: its start and, where known, the rest."""
    if isinstance(schedule, Cycling):
        return list(schedule.values)
    if isinstance(schedule, Polynomial):
        return [schedule.init, schedule.final]
    return [schedule(0)]


def _check_levels(schedule: Schedule, path: str, *, upper: float, closed: bool) -> None:
    interval = f"[0, {upper:g}]" if closed else f"[0, {upper:g})"
    for level in _levels(schedule):
        inside = 0.0 <= level <= upper if closed else 0.0 <= level < upper
        if inside:
            continue
        if isinstance(schedule, Constant):
            raise ConfigError(f"{path}: {level!r} is not in {interval}")
        raise ConfigError(f"{path}: {schedule.kind} schedule reaches {level!r}, which is not in {interval}")


def _check_sparsity(schedule: Schedule, algorithm: str, path: str) -> Schedule:
    """Levels in [0, 1), then the algorithm class's own rule (``check_config_sparsity``), if it has one."""
    _check_levels(schedule, path, upper=1.0, closed=False)
    check = config_rule(algorithm, "check_config_sparsity", None)
    return schedule if check is None else check(schedule, path)
