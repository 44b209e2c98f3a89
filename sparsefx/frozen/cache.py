"""The CPU's last-level cache: its size, and emptying it before a call that should be timed cold.

A layer of a model whose weights are larger than the cache finds its own weights gone at every call
(the other layers ran in between), so its kernels are compared reading weights from memory, where a
one-token call at 50% moves three quarters of dense's bytes and is faster sparse; a model that fits
keeps them cached, where the same call is faster dense. ``choose`` times the kernels as the model
will run them::

    >>> last_level_bytes() >= 2**20
    True
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

__all__ = ["last_level_bytes", "evict", "release", "FALLBACK_BYTES"]

FALLBACK_BYTES = 32 * 2**20
"""The size assumed where the system does not say (a server part's L3)."""

_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def _parse(size: str) -> int:
    """``"32768K"`` as bytes (sysfs's format)."""
    size = size.strip().upper()
    return int(size[:-1]) * _UNITS[size[-1]] if size[-1:] in _UNITS else int(size)


@functools.cache
def last_level_bytes() -> int:
    """The largest cache CPU 0 reports (Linux sysfs), else ``FALLBACK_BYTES``."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            sizes.append(_parse(f.read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes, default=FALLBACK_BYTES)


@functools.cache
def _buffer() -> torch.Tensor:
    return torch.zeros(2 * last_level_bytes() // 4)


def evict() -> None:
    """Write a buffer twice the last-level cache, so that what a call reads next comes from memory."""
    _buffer().add_(1.0)


def release() -> None:
    """Free ``evict``'s buffer (``freeze`` does when it is done: 64 MB for a 32 MB cache)."""
    _buffer.cache_clear()
