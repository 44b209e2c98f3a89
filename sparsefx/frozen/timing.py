"""How much faster a frozen model runs than dense, timed side by side (the demo, ``sparsefx bench``).

Each round calls both sides once, the order alternating so neither always runs first, after one
warm-up call each; a round's figure is the dense call's seconds over the frozen call's::

    >>> len(speedup_rounds(lambda: sum(range(1000)), lambda: sum(range(10)), 4))
    4
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["speedup_rounds"]


def speedup_rounds(dense: Callable[[], object], frozen: Callable[[], object], rounds: int) -> list[float]:
    """Per round, ``dense()``'s seconds over ``frozen()``'s (module docstring)."""
    dense(), frozen()
    sides = [("dense", dense), ("frozen", frozen)]
    out = []
    for r in range(rounds):
        seconds = {}
        for name, fn in sides if r % 2 == 0 else sides[::-1]:
            t0 = time.perf_counter()
            fn()
            seconds[name] = time.perf_counter() - t0
        out.append(seconds["dense"] / max(seconds["frozen"], 1e-9))
    return out
