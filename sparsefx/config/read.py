"""Reading a config source into plain data: YAML text, or a YAML file given by path.

A one-line string is a path when such a file exists; a ``.yaml``/``.yml`` name that does not exist is
an error, not YAML text::

    >>> read_text("[0.5, {sparsity: 0.9, param_filter: 'fc*'}]")
    [0.5, {'sparsity': 0.9, 'param_filter': 'fc*'}]
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from ..errors import ConfigError
from .schedules import short_repr

__all__ = ["read_text", "read_file"]

_YAML_SUFFIXES = (".yaml", ".yml")


def read_text(source: str) -> Any:
    """The plain data of YAML text, or of the YAML file a one-line string names.

    >>> read_text("sparsity: 0.5\\nalgorithm: gmp")
    {'sparsity': 0.5, 'algorithm': 'gmp'}
    """
    if "\n" not in source:
        try:
            is_file, is_dir = os.path.isfile(source), os.path.isdir(source)
        except (OSError, ValueError):
            is_file = is_dir = False
        if is_file:
            return read_file(source)
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


def read_file(path: Any) -> Any:
    """The plain data of a YAML file; a missing or unreadable file is a ConfigError naming it."""
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
