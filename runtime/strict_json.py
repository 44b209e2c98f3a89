"""JSON from an untrusted file: UTF-8, one top-level value, no repeated keys, no NaN or Infinity.

Every flaw is a ``ProgramFormatError`` naming ``what`` was read::

    >>> loads(b'{"a": 1}', "manifest.json")
    {'a': 1}
    >>> loads(b'{"a": 1, "a": 2}', "manifest.json")
    Traceback (most recent call last):
    ...
    sparsefx.errors.ProgramFormatError: manifest.json repeats the key 'a'
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sparsefx.errors import ProgramFormatError

__all__ = ["loads", "unique_keys"]


def unique_keys(fail: Callable[[str], Exception]) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """An ``object_pairs_hook`` that raises ``fail(key)`` for a key an object repeats."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise fail(key)
            out[key] = value
        return out

    return pairs


def loads(raw: bytes, what: str) -> Any:
    """The JSON value in ``raw``; ``what`` names it in errors."""
    pairs = unique_keys(lambda key: ProgramFormatError(f"{what} repeats the key {key!r}"))

    def constant(name: str) -> Any:
        raise ProgramFormatError(f"{what} holds {name}, which is not JSON")

    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant)
    except ProgramFormatError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, over-long ints
        raise ProgramFormatError(f"{what} is not valid JSON: {exc}") from None
