"""Evaluate a FLOP formula (sympy expression, or anything sympy reads) at given symbol values.

    >>> evaluate("2*batch*seq", {"batch": 4, "seq": 8})
    64
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sympy

__all__ = ["evaluate"]


def evaluate(expr: Any, env: Mapping[Any, Any]) -> int:
    """``expr`` with every symbol in ``env`` (symbols or their names as keys) replaced, as an int.

    >>> batch = sympy.Symbol("batch")
    >>> evaluate(3 * batch + 1, {batch: 2}), evaluate(12, {})
    (7, 12)
    """
    return int(sympy.sympify(expr).subs(env))
