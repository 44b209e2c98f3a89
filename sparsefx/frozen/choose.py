"""Which kernel a frozen layer runs, by tokens: measured on this machine when the model is frozen.

For each token count in ``BUCKETS`` the candidates (``kernels.available_kernels``) run on random
inputs in interleaved rounds; the median of each kernel's times picks the fastest. ``dense`` is always
a candidate, so a layer whose sparse kernels are not faster at some size stays dense there. A call
takes the choice of the largest bucket at or below its tokens (``kernel_for``). Sizes past
``BUDGET`` multiply-accumulates of dense work are not timed; they take the largest timed bucket's
choice. Layers of one shape and density share one measurement (``choose_all``)::

    >>> kernel_for(("spmv", "torch", "torch", "rows", "rows"), 1), kernel_for(("spmv", "torch"), 20)
    ('spmv', 'torch')
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from .kernels import KERNELS
from .packed import PackedWeight

__all__ = ["BUCKETS", "BUDGET", "ROUNDS", "choose", "kernel_for"]

BUCKETS = (1, 8, 32, 128, 512)
"""Token counts the choice is measured at."""

BUDGET = 2**31
"""The most dense multiply-accumulates a timed call may take (GPT-2's LM head at 512 tokens is 2e10)."""

ROUNDS = 5
"""Interleaved timing rounds per bucket (after one warm-up call of each kernel)."""


def kernel_for(choice: Sequence[str], tokens: int) -> str:
    """The kernel ``choice`` (one name per bucket of ``BUCKETS``) names for a call of ``tokens``."""
    at = 0
    for i, b in enumerate(BUCKETS[: len(choice)]):
        if tokens >= b:
            at = i
    return choice[at]


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def choose(p: PackedWeight, candidates: Sequence[str], *, rounds: int = ROUNDS) -> tuple[str, ...]:
    """The fastest of ``candidates`` for ``p`` at each bucket (``spmv`` only at one token)."""
    gen = torch.Generator().manual_seed(0)
    choice: list[str] = []
    for tokens in BUCKETS:
        if tokens * p.in_features * p.out_features > BUDGET and choice:
            choice.append(choice[-1])
            continue
        x = torch.randn(tokens, p.in_features, generator=gen, dtype=p.values.dtype)
        names = [k for k in candidates if k != "spmv" or tokens == 1]
        times: dict[str, list[float]] = {k: [] for k in names}
        for k in names:  # warm-up: numba compiles, MKL sets up
            KERNELS[k](p, x)
        for r in range(rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order each round
                times[k].append(_time(lambda k=k, x=x: KERNELS[k](p, x)))
        choice.append(min(names, key=lambda k: statistics.median(times[k])))
    return tuple(choice)
