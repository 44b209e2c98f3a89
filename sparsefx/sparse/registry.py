"""Names under which sparsity algorithms can be selected from a config.

The built-in names are always known. A user subclass of ``SparsityAlgorithm`` registers itself
under its lower-cased class name when it is defined, so configs can name it::

    >>> "rigl" in algorithm_names()
    True
"""

from __future__ import annotations

__all__ = [
    "BUILTIN_ALGORITHMS",
    "DYNAMIC_ALGORITHMS",
    "algorithm_names",
    "register_algorithm",
    "unregister_algorithm",
    "lookup",
]

BUILTIN_ALGORITHMS: tuple[str, ...] = ("static", "gmp", "set", "rigl")
DYNAMIC_ALGORITHMS: frozenset[str] = frozenset({"gmp", "set", "rigl"})

_registry: dict[str, type | None] = {name: None for name in BUILTIN_ALGORITHMS}


def register_algorithm(cls: type, name: str | None = None) -> type:
    """Make ``cls`` selectable in configs as ``name`` (default: its lower-cased class name)."""
    _registry[(name or cls.__name__).lower()] = cls
    return cls


def unregister_algorithm(name: str) -> None:
    """Forget a user algorithm (built-in names stay)."""
    if name.lower() not in BUILTIN_ALGORITHMS:
        _registry.pop(name.lower(), None)


def algorithm_names() -> tuple[str, ...]:
    """All selectable names: built-ins first, then user subclasses in definition order."""
    return tuple(_registry)


def lookup(name: str) -> type | None:
    """The class registered under ``name``, or None while a built-in has no class yet."""
    return _registry[name.lower()]
