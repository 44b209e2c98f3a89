"""Names under which sparsity algorithms can be selected from a config, and how a name becomes one.

The built-in names are always known. A user subclass of ``SparsityAlgorithm`` registers itself
under its lower-cased class name when it is defined, so configs can name it; abstract classes
(``DynamicSparsityAlgorithm`` itself, or a subclass that leaves ``update_mask`` unimplemented) are
never offered::

    >>> "rigl" in algorithm_names(), "dynamicsparsityalgorithm" in algorithm_names()
    (True, False)

A user algorithm's hyperparameters are the named parameters of its constructor (and of the
constructors it forwards ``**kwargs`` to, up to the sparsefx base class)::

    >>> class Alpha:
    ...     def __init__(self, sparsity, my_alpha=0.1, **kwargs): ...
    >>> hyperparameters(Alpha)
    ('my_alpha',)

Algorithm-specific config rules live on the algorithm classes, as class attributes the parser reads
through ``config_rule`` (the built-in classes are imported on first need, so ``sparsefx.config``
never imports ``sparsefx.sparse.base``). A rule applies to the class that declares it, not to its
subclasses, which get the generic rule::

    >>> config_rule("rigl", "default_drop_fraction", None), config_rule("gmp", "default_drop_fraction", 0.3)
    (0.3, None)
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "BUILTIN_ALGORITHMS",
    "DYNAMIC_ALGORITHMS",
    "GROUP_KEYS",
    "algorithm_names",
    "register_algorithm",
    "unregister_algorithm",
    "lookup",
    "hyperparameters",
    "construct",
    "constructing",
    "resolve_group",
    "config_rule",
]

BUILTIN_ALGORITHMS: tuple[str, ...] = ("static", "gmp", "set", "rigl")
DYNAMIC_ALGORITHMS: frozenset[str] = frozenset({"gmp", "set", "rigl"})
# The keys of one group of a config (``sparsefx.config`` parses them); anything else given to a user
# algorithm is one of its hyperparameters.
GROUP_KEYS: tuple[str, ...] = (
    "algorithm",
    "sparsity",
    "param_filter",
    "param_name_patterns",
    "init_method",
    "seed",
    "update",
    "drop_fraction",
    "balance_in_groups",
    "balance_out_groups",
    "distribution",
    "type",
    "schedule",
)
# Group keys a user constructor may name explicitly: construction passes it the parsed value.
_PASSED_GROUP_KEYS = (
    "sparsity",
    "init_method",
    "seed",
    "update",
    "drop_fraction",
    "balance_in_groups",
    "balance_out_groups",
    "distribution",
)

# where each built-in class is defined (imported on first ``config_rule``): ``sparsefx.sparse.<name>``,
# a sibling of this config package
_SPARSE_PACKAGE = __package__.rpartition(".")[0] + ".sparse"
_BUILTIN_HOMES: dict[str, str] = {name: f"{_SPARSE_PACKAGE}.{name}" for name in BUILTIN_ALGORITHMS}

_registry: dict[str, type | None] = {name: None for name in BUILTIN_ALGORITHMS}
# (algorithm being constructed from a parsed group, that group, the keyword arguments passed to it)
_pending: contextvars.ContextVar[tuple[Any, Any, dict[str, Any]] | None] = contextvars.ContextVar(
    "sparsefx_pending_group", default=None
)


def register_algorithm(cls: type, name: str | None = None) -> type:
    """Make ``cls`` selectable in configs as ``name`` (default: its lower-cased class name)."""
    _registry[(name or cls.__name__).lower()] = cls
    return cls


def unregister_algorithm(name: str) -> None:
    """Forget a user algorithm (built-in names stay)."""
    if name.lower() not in BUILTIN_ALGORITHMS:
        _registry.pop(name.lower(), None)


def algorithm_names() -> tuple[str, ...]:
    """All selectable names: built-ins first, then concrete user subclasses in definition order."""
    return tuple(name for name, cls in _registry.items() if cls is None or not inspect.isabstract(cls))


def lookup(name: str) -> type | None:
    """The class registered under ``name``, or None while a built-in has no class yet."""
    return _registry[name.lower()]


def config_rule(name: str, rule: str, default: Any) -> Any:
    """The config rule ``rule`` as the class registered under ``name`` declares it, else ``default``.

    Rules are read from the class's own attributes (``vars(cls)``), not inherited: a user subclass
    of a built-in algorithm gets the generic rules, as a user algorithm does. A classmethod rule comes
    back bound.
    """
    key = name.lower()
    if _registry.get(key) is None and key in _BUILTIN_HOMES:
        importlib.import_module(_BUILTIN_HOMES[key])
    cls = _registry.get(key)
    if cls is None or rule not in vars(cls):
        return default
    return getattr(cls, rule)


def hyperparameters(cls: type) -> tuple[str, ...]:
    """The extra keyword arguments ``cls``'s constructor takes, besides the config's group keys.

    Walks ``__init__`` up the MRO while each one forwards ``**kwargs``, and stops at the classes
    sparsefx defines (their keywords are the group keys).
    """
    names: list[str] = []
    for klass in cls.__mro__:
        if _is_library_base(klass):
            break
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            break
        for i, param in enumerate(params):
            named = param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
            if i and named and param.name not in GROUP_KEYS and param.name not in names:
                names.append(param.name)
        if not any(param.kind is param.VAR_KEYWORD for param in params):
            break
    return tuple(names)


@contextlib.contextmanager
def constructing(obj: Any, group: Any, kwargs: dict[str, Any]) -> Iterator[None]:
    """While ``obj.__init__(**kwargs)`` runs, ``resolve_group(obj, ...)`` answers ``group``."""
    token = _pending.set((obj, group, kwargs))
    try:
        yield
    finally:
        _pending.reset(token)


def construct(cls: type, group: Any) -> Any:
    """An instance of ``cls`` for one parsed group: hyperparameters from ``group.options``, and the
    group keys the constructor names explicitly (``sparsity`` as a float when constant)."""
    kwargs = dict(group.options)
    accepted = inspect.signature(cls.__init__).parameters
    for key in _PASSED_GROUP_KEYS:
        if key in accepted:
            kwargs[key] = _plain(getattr(group, key))
    _check_required(cls, accepted, kwargs, group.path)
    obj = cls.__new__(cls)
    with constructing(obj, group, kwargs):
        obj.__init__(**kwargs)
    return obj


def _check_required(cls: type, accepted: Mapping[str, Any], kwargs: Mapping[str, Any], path: str) -> None:
    """A hyperparameter without a default that the config does not give is a ConfigError."""
    from ..errors import ConfigError

    for i, (name, param) in enumerate(accepted.items()):
        keyword = param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
        if i and keyword and param.default is param.empty and name not in kwargs:
            raise ConfigError(
                f"{path}.{name}: missing required key: {cls.__name__}.__init__ needs {name!r}; "
                "add it to the config"
            )


def resolve_group(obj: Any, group: Any, kwargs: Mapping[str, Any]) -> Any:
    """The GroupConfig a ``SparsityAlgorithm.__init__(group, **kwargs)`` call stands for.

    ``group`` may be a parsed GroupConfig, None (settings come from ``kwargs``), or a sparsity level
    or schedule passed positionally, Cerebras style (``super().__init__(sparsity, **kwargs)``).
    Under ``construct`` the parsed group wins; group keys the subclass adds on its way up are its
    defaults, used where the config did not give the key.
    """
    from ..config import GroupConfig, load_config, with_defaults
    from ..errors import ConfigError

    pending = _pending.get()
    if pending is not None and pending[0] is obj:
        passed = pending[2]
        added = {k: v for k, v in kwargs.items() if k not in passed or not _same(passed[k], v)}
        return with_defaults(pending[1], added)
    if isinstance(group, GroupConfig):
        return group
    settings = dict(kwargs)
    if group is not None:
        if "sparsity" in settings:
            raise ConfigError(
                f"{type(obj).__name__}: sparsity given twice (positionally as {group!r} and as a keyword)"
            )
        settings["sparsity"] = group
    settings.setdefault("algorithm", type(obj).__dict__.get("name") or type(obj).__name__.lower())
    cfg = load_config(settings)
    if len(cfg.groups) != 1:
        raise ConfigError(f"sparsity: expected one group of settings; got {len(cfg.groups)}")
    return cfg.groups[0]


def _plain(value: Any) -> Any:
    """A constant schedule as its number; anything else as is."""
    from .schedules import Constant

    return value(0) if isinstance(value, Constant) else value


def _is_library_base(klass: type) -> bool:
    """``object``, sparsefx's base classes and its built-in algorithms: their keywords are group keys."""
    if klass is object or any(klass is _registry[name] for name in BUILTIN_ALGORITHMS):
        return True
    return klass.__module__ == "sparsefx.sparse.base" and klass.__name__ in (
        "SparsityAlgorithm",
        "DynamicSparsityAlgorithm",
    )


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False
