"""Sparsity configs: a float, a dict (either Cerebras grammar), a list of groups, or YAML, parsed once.

``load_config`` validates everything it can without a model; ``SparsityConfig.resolve`` then decides,
for each named parameter, whether it is sparse, at what level and why::

    >>> import torch
    >>> cfg = load_config({"sparsity": 0.9, "param_filter": "fc*.weight"})
    >>> plan = cfg.resolve([("fc1.weight", torch.empty(4, 4)), ("fc1.bias", torch.empty(4))])
    >>> plan["fc1.weight"].sparsity, plan["fc1.bias"].reason
    (0.9, 'no pattern matched')
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import hashlib
import numbers
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import yaml

from sparsefx.errors import ConfigError
from sparsefx.sparse.distributions import METHODS, layer_densities
from sparsefx.sparse.registry import (
    BUILTIN_ALGORITHMS,
    DYNAMIC_ALGORITHMS,
    GROUP_KEYS,
    algorithm_names,
    hyperparameters,
    lookup,
)
from sparsefx.sparse.schedules import (
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

DEFAULT_SEED = 0
INIT_METHODS = ("random", "topk", "from_zeros", "checkerboard")
DEFAULT_EXCLUDED_WORDS = ("embedding", "norm", "lm_head")
DISTRIBUTIONS = (*METHODS, "global")
DEFAULT_DROP_FRACTION = 0.3
DEFAULT_UPDATES = {
    "gmp": UpdateSchedule(freq=1),
    "set": UpdateSchedule(freq=100),
    "rigl": UpdateSchedule(freq=100),
}
GRAMMARS = ("float", "modelzoo", "cstorch", "list")
FILTER_KINDS = ("default", "regex", "glob", "callable")
OVERRIDE_KEYS = ("sparsity", "init_method", "seed")
PARAMS_FILE_SECTIONS = ("model", "optimizer", "train_input", "eval_input", "runconfig")
_YAML_SUFFIXES = (".yaml", ".yml")


def param_seed(base_seed: int, name: str) -> int:
    """The seed of one parameter's pattern, from the base seed and its name only (stable across processes).

    >>> param_seed(0, "fc.weight") == param_seed(0, "fc.weight") != param_seed(1, "fc.weight")
    True
    """
    digest = hashlib.blake2b(f"{base_seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


def _shape(param: Any) -> tuple[int, ...]:
    return tuple(int(size) for size in param.shape)


def _default_exclusion(name: str, shape: tuple[int, ...]) -> str | None:
    """Why the default filter leaves a parameter dense, or None when it makes it sparse."""
    if len(shape) <= 1:
        return "default exclusion: ndim <= 1"
    lowered = name.lower()
    for word in DEFAULT_EXCLUDED_WORDS:
        if word in lowered:
            return f"default exclusion: name contains {word!r}"
    return None


@dataclass(frozen=True)
class ParamFilter:
    """Which parameters a group selects: the default rule, regexes (re.search), globs or a callable.

    >>> ParamFilter("glob", ("*.weight",)).matches("fc.weight", None)
    True
    """

    kind: str = "default"
    patterns: tuple[str, ...] = ()
    fn: Callable[[str, Any], bool] | None = None

    def __post_init__(self) -> None:
        if self.kind not in FILTER_KINDS:
            raise ConfigError(f"param filter kind {self.kind!r} is not one of {', '.join(FILTER_KINDS)}")
        if self.kind == "callable" and not callable(self.fn):
            raise ConfigError(f"a callable param filter needs a callable fn, got {short_repr(self.fn)}")
        for pattern in self.patterns:
            if self.kind == "regex":
                _check_regex(pattern, "param filter")
            else:
                _check_glob(pattern, "param filter")

    def matches(self, name: str, param: Any) -> bool:
        """True when this filter selects ``name``."""
        return self.explain(name, param)[0]

    def explain(self, name: str, param: Any) -> tuple[bool, str]:
        """(selected, reason), e.g. ``(True, "matched param_filter '*.weight'")``."""
        if self.kind == "default":
            why = _default_exclusion(name, _shape(param))
            return why is None, why or "default filter"
        if self.kind == "callable":
            label = getattr(self.fn, "__qualname__", type(self.fn).__name__)
            return bool(self.fn(name, param)), f"matched param_filter callable {label}"
        for pattern in self.patterns:
            if self.pattern_matches(pattern, name):
                return True, f"matched {self.key} {pattern!r}"
        return False, "no pattern matched"

    def pattern_matches(self, pattern: str, name: str) -> bool:
        """Does one of this filter's patterns select ``name``?"""
        if self.kind == "regex":
            return re.search(pattern, name) is not None
        return fnmatch.fnmatchcase(name, pattern)

    @property
    def key(self) -> str:
        """The config key this filter came from."""
        return "param_name_patterns" if self.kind == "regex" else "param_filter"


DEFAULT_FILTER = ParamFilter()


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
        params = _collect(named_params)
        self._check_patterns([name for name, _, _ in params], aliases or {})
        forced = dict(dense or {})
        by_default = dict(default_dense or {})
        decisions = [self._decide(name, param, shape, forced, by_default) for name, param, shape in params]
        return SparsityPlan(tuple(self._distribute(decisions)))

    def _distribute(self, decisions: list[ParamDecision]) -> list[ParamDecision]:
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

    def _check_patterns(self, names: list[str], aliases: Mapping[str, str]) -> None:
        """Every regex or glob must select at least one parameter: a typo should not silently do nothing."""
        for group in self.groups:
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
        self,
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
        for index, group in enumerate(self.groups):
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
            shape = _shape(param)
        except Exception:
            raise ConfigError(f"named_params: {name!r} has no usable shape ({short_repr(param)})") from None
        params.append((name, param, shape))
    return params


def closest_names(pattern: str, names: list[str], aliases: Mapping[str, str] | None = None) -> str:
    """A hint naming the parameters most like ``pattern``, for a pattern that matches none.

    Names are ranked by the word tokens of the pattern they contain (``weight`` and ``bias`` count
    last): whole tokens of the dotted or underscored name first, then substrings, rarer tokens
    first, then by difflib similarity. With
    no token in common, difflib alone ranks them. ``aliases`` (``{other name: listed name}``) of tied
    parameters are candidates too, and shown as ``'<listed>' (tied with '<other>')``.

    >>> closest_names("ffn.*weight", ["ln_f.weight", "blocks.0.ffn.fc.weight", "blocks.0.ffn.fc.bias"])
    "closest parameter names: 'blocks.0.ffn.fc.weight', 'blocks.0.ffn.fc.bias', 'ln_f.weight'"
    >>> closest_names("lm_head", ["wte.weight", "ln_f.weight"], {"lm_head.weight": "wte.weight"})
    "closest parameter names: 'wte.weight' (tied with 'lm_head.weight')"
    """
    if not names:
        return "the model has no parameters"
    aliases = dict(aliases or {})
    candidates = [*names, *aliases]
    tokens = _pattern_tokens(pattern)
    counts = {token: sum(token in name.lower() for name in candidates) for token in tokens}
    scored = [(_token_score(name, tokens, counts), name) for name in candidates]
    ranked = [name for score, name in sorted(scored, key=lambda item: item[0], reverse=True) if score[1]]
    limit = 3
    if not ranked:
        ranked = difflib.get_close_matches(pattern, candidates, n=3, cutoff=0.3)
    if not ranked:
        ranked, limit = names[:5], 5
    shown: dict[str, str | None] = {}  # listed name -> its other name, when tied
    for name in ranked:
        listed = aliases.get(name, name)
        if listed in shown:
            continue
        shown[listed] = name if name != listed else _alias_of(listed, aliases)
        if len(shown) == limit:
            break
    return "closest parameter names: " + ", ".join(
        repr(name) + (f" (tied with {alias!r})" if alias else "") for name, alias in shown.items()
    )


_PARAM_KINDS = frozenset({"weight", "bias"})


def _pattern_tokens(pattern: str) -> tuple[str, ...]:
    """The word tokens of a regex or glob, escapes and character classes left out.

    >>> _pattern_tokens(r"blocks\\.\\d+\\.ffn.*weight")
    ('blocks', 'ffn', 'weight')
    """
    text = re.sub(r"\\[A-Za-z]|\[[^\]]*\]|\{[^}]*\}", " ", pattern.lower())
    return tuple(dict.fromkeys(token for token in re.split(r"[^a-z0-9]+", text) if token))


def _token_score(name: str, tokens: tuple[str, ...], counts: Mapping[str, int]) -> tuple[float, ...]:
    """(tokens matched other than weight/bias, tokens matched, whole tokens, rarity of those matched,
    difflib similarity), to sort descending: ``weight`` says little about which module was meant."""
    lowered = name.lower()
    words = set(re.split(r"[^a-z0-9]+", lowered))
    whole = [token for token in tokens if token in words]
    partial = [token for token in tokens if token not in words and token in lowered]
    matched = (*whole, *partial)
    telling = sum(token not in _PARAM_KINDS for token in matched)
    rarity = sum(1.0 / counts[token] for token in matched)
    similarity = difflib.SequenceMatcher(None, " ".join(tokens), lowered).ratio()
    return (telling, len(matched), len(whole), rarity, similarity)


def _alias_of(name: str, aliases: Mapping[str, str]) -> str | None:
    """The first other name of a tied parameter listed as ``name``, if it has one."""
    return next((alias for alias, listed in aliases.items() if listed == name), None)


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


# ---------------------------------------------------------------------------------------------------------
# Loading: source -> plain data -> groups


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
        return _parse_top(_read_file(source))
    if isinstance(source, str):
        return _parse_top(_read_str(source))
    return _parse_top(source)


def _read_str(source: str) -> Any:
    if "\n" not in source:
        try:
            is_file, is_dir = os.path.isfile(source), os.path.isdir(source)
        except (OSError, ValueError):
            is_file = is_dir = False
        if is_file:
            return _read_file(source)
        if is_dir:
            raise ConfigError(f"config path {source!r} is a directory, not a YAML file")
        if source.strip().lower().endswith(_YAML_SUFFIXES):
            raise ConfigError(f"config file {source!r} not found")
    data = _yaml(source, "YAML text")
    if isinstance(data, str):
        raise ConfigError(
            f"sparsity: YAML text {short_repr(source)} is a plain string, not a config "
            "(if it is a file path, the file was not found)"
        )
    return data


def _read_file(path: Any) -> Any:
    try:
        name = os.fspath(path)
        with open(name, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, ValueError, TypeError) as exc:
        kind = "not found" if isinstance(exc, FileNotFoundError) else f"cannot be read ({exc})"
        raise ConfigError(f"config file {short_repr(path)} {kind}") from None
    return _yaml(text, f"config file {name!r}")


def _yaml(text: str, origin: str) -> Any:
    try:
        return yaml.safe_load(text)
    except Exception as exc:  # YAMLError, and the odd ValueError/RecursionError from hostile input
        raise ConfigError(f"{origin}: invalid YAML: {exc}") from None


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


# ---------------------------------------------------------------------------------------------------------
# One group dict (both grammars share the keys; param_filter and param_name_patterns exclude each other)


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
        return DEFAULT_UPDATES.get(algorithm)
    if algorithm == "static":
        raise ConfigError(
            f"{path}.update: static sparsity never updates its mask; remove 'update' or use a dynamic "
            f"algorithm ({', '.join(name for name in algorithm_names() if name in DYNAMIC_ALGORITHMS)})"
        )
    return parse_update(data["update"], f"{path}.update")


def _parse_drop_fraction(data: Mapping[str, Any], algorithm: str, path: str) -> Schedule | None:
    if "drop_fraction" not in data:  # user algorithms may call drop_and_grow too
        return None if algorithm in ("static", "gmp") else Constant(DEFAULT_DROP_FRACTION)
    if algorithm in ("static", "gmp"):
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
        _check_glob(glob, fpath if isinstance(value, str) else f"{fpath}[{index}]")
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
    _check_regex(pattern, path)
    return ParamFilter("regex", (pattern,))


def _check_regex(pattern: Any, path: str) -> None:
    if not isinstance(pattern, str):
        raise ConfigError(f"{path}: expected a regex string, got {short_repr(pattern)}")
    try:
        re.compile(pattern)
    except Exception as exc:  # re.error, and RecursionError/OverflowError on pathological patterns
        raise ConfigError(f"{path}: invalid regex {short_repr(pattern)}: {exc}") from None


def _check_glob(glob: Any, path: str) -> None:
    if not isinstance(glob, str):
        raise ConfigError(f"{path}: expected a glob string, got {short_repr(glob)}")
    try:
        fnmatch.fnmatchcase("", glob)
    except Exception as exc:
        raise ConfigError(f"{path}: invalid glob {short_repr(glob)}: {exc}") from None


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
    _check_levels(schedule, path, upper=1.0, closed=False)
    if algorithm == "static" and not schedule.is_constant:
        raise ConfigError(
            f"{path}: static sparsity needs a constant level, got a {schedule.kind} schedule; "
            "use algorithm: gmp for a level that changes over training"
        )
    if algorithm == "static" and isinstance(schedule, Cycling):
        return Constant(schedule.values[0])
    if algorithm == "gmp" and schedule.is_constant:
        raise ConfigError(
            f"{path}: gmp needs a schedule that changes over training, got constant {schedule(0)!r}; "
            "use static for a fixed level"
        )
    return schedule
