"""Which parameters a group selects: the default rule, regexes (re.search), globs (whole name) or a callable.

Without patterns, the default rule leaves dense every parameter with ``ndim <= 1`` and every name that
contains ``embedding``, ``norm`` or ``lm_head`` (case-insensitive)::

    >>> import torch
    >>> DEFAULT_FILTER.explain("blocks.0.norm.weight", torch.empty(4, 4))
    (False, "default exclusion: name contains 'norm'")
    >>> ParamFilter("regex", ("ffn.*weight",)).explain("blocks.0.ffn.fc.weight", None)
    (True, "matched param_name_patterns 'ffn.*weight'")
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .schedules import short_repr

__all__ = [
    "FILTER_KINDS",
    "DEFAULT_EXCLUDED_WORDS",
    "ParamFilter",
    "DEFAULT_FILTER",
    "default_exclusion",
    "param_shape",
    "check_regex",
    "check_glob",
]

FILTER_KINDS = ("default", "regex", "glob", "callable")
DEFAULT_EXCLUDED_WORDS = ("embedding", "norm", "lm_head")


def param_shape(param: Any) -> tuple[int, ...]:
    """A parameter's shape as a tuple of ints."""
    return tuple(int(size) for size in param.shape)


def default_exclusion(name: str, shape: tuple[int, ...]) -> str | None:
    """Why the default filter leaves a parameter dense, or None when it makes it sparse.

    >>> default_exclusion("ln_f.weight", (8,)), default_exclusion("LayerNorm.w", (8, 8))
    ('default exclusion: ndim <= 1', "default exclusion: name contains 'norm'")
    """
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
                check_regex(pattern, "param filter")
            else:
                check_glob(pattern, "param filter")

    def matches(self, name: str, param: Any) -> bool:
        """True when this filter selects ``name``."""
        return self.explain(name, param)[0]

    def explain(self, name: str, param: Any) -> tuple[bool, str]:
        """(selected, reason), e.g. ``(True, "matched param_filter '*.weight'")``."""
        if self.kind == "default":
            why = default_exclusion(name, param_shape(param))
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


def check_regex(pattern: Any, path: str) -> None:
    if not isinstance(pattern, str):
        raise ConfigError(f"{path}: expected a regex string, got {short_repr(pattern)}")
    try:
        re.compile(pattern)
    except Exception as exc:  # re.error, and RecursionError/OverflowError on pathological patterns
        raise ConfigError(f"{path}: invalid regex {short_repr(pattern)}: {exc}") from None


def check_glob(glob: Any, path: str) -> None:
    if not isinstance(glob, str):
        raise ConfigError(f"{path}: expected a glob string, got {short_repr(glob)}")
    try:
        fnmatch.fnmatchcase("", glob)
    except Exception as exc:
        raise ConfigError(f"{path}: invalid glob {short_repr(glob)}: {exc}") from None
