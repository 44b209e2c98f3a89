"""The one rule for how many entries a level keeps: ``floor((1 - s) * n)``, evaluated exactly.

A level is read as the decimal it prints as (``Fraction(str(s))``), so a product that is a whole
number in decimal stays whole; ``int((1 - 0.9) * 100)`` is 9 in float64, this rule gives 10::

    >>> keep_count(100, 0.9), keep_count(10, 0.9), keep_count(10, 0.7)
    (10, 1, 3)
    >>> int((1 - 0.9) * 100)
    9

Every count in sparsefx (init masks, GMP, drop-and-grow survivors, global and balanced top-k,
retargeting, accounting) calls ``keep_count``.
"""

from __future__ import annotations

import functools
import numbers
from decimal import Decimal
from fractions import Fraction

import numpy as np
import torch

__all__ = ["keep_count", "exact_level"]


def keep_count(numel: int, sparsity: float) -> int:
    """How many of ``numel`` entries a top-k at ``sparsity`` keeps: ``floor((1 - s) * numel)`` exactly.

    ``sparsity`` may be a Python, numpy or 0-d torch number; the result lies in ``[0, numel]``.

    >>> keep_count(266200, 0.9), keep_count(7, 0), keep_count(10, 1)
    (26620, 7, 0)
    """
    n = int(numel)
    if n <= 0:
        return 0
    num, den = _density(_scalar(sparsity))
    return min(n, max(0, n * num // den))


def exact_level(sparsity: object) -> Fraction:
    """``sparsity`` as the exact fraction of the decimal it prints as (floats: shortest repr).

    >>> exact_level(0.9), exact_level(torch.tensor(0.3)), exact_level(1)
    (Fraction(9, 10), Fraction(3, 10), Fraction(1, 1))
    """
    return _exact(_scalar(sparsity))


def _scalar(sparsity: object) -> object:
    """A 0-d or one-entry tensor as the numpy scalar of its dtype; anything else unchanged."""
    if not isinstance(sparsity, torch.Tensor):
        return sparsity
    if sparsity.numel() != 1:
        raise ValueError(f"sparsity must be a single number; got a tensor shaped {tuple(sparsity.shape)}")
    return sparsity.detach().cpu().reshape(()).numpy()[()]


def _exact(sparsity: object) -> Fraction:
    """The exact fraction; a numpy float32 0.3 prints as ``0.3``, though its float64 value does not."""
    if isinstance(sparsity, Fraction):
        return sparsity
    if isinstance(sparsity, numbers.Integral):
        return Fraction(int(sparsity))
    if isinstance(sparsity, Decimal):
        return Fraction(sparsity)
    if isinstance(sparsity, (float, np.floating)):
        return Fraction(str(sparsity))
    if isinstance(sparsity, numbers.Real):
        return Fraction(str(float(sparsity)))
    raise TypeError(f"sparsity must be a real number; got {type(sparsity).__name__} {sparsity!r}")


@functools.lru_cache(maxsize=4096, typed=True)
def _density(sparsity: object) -> tuple[int, int]:
    """``1 - sparsity`` exactly, as (numerator, denominator); cached per value and type."""
    density = 1 - _exact(sparsity)
    return density.numerator, density.denominator
