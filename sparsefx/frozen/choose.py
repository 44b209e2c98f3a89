"""Which kernel a frozen layer runs, by tokens: measured on this machine when the model is frozen.

For each token count in ``BUCKETS`` the candidates (``kernels.available_kernels``) run on random
inputs in interleaved rounds, each sample ``SAMPLE`` seconds of calls. The two fastest are timed again
with dense and the two sets averaged (a burst of load on a shared machine can flip one set). ``dense``
is always a candidate and a sparse kernel wins only by ``MARGIN``, so a layer whose sparse kernels are
not clearly faster at some size stays dense there. A call takes the choice of the largest bucket at or
below its tokens (``kernel_for``). Where a layer's dense work at a bucket is past ``BUDGET``
multiply-accumulates (an LM head at 512 tokens), its first output rows are timed, as many as the
budget holds. Layers of one shape and density share one measurement (``freeze.py``)::

    >>> kernel_for(("spmv", "torch", "torch", "rows", "rows"), 1), kernel_for(("spmv", "torch"), 20)
    ('spmv', 'torch')
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from .kernels import Kernel, bind
from .packed import PackedWeight

__all__ = ["BUCKETS", "BUDGET", "ROUNDS", "choose", "kernel_for"]

BUCKETS = (1, 8, 32, 128, 512)
"""Token counts the choice is measured at."""

BUDGET = 2**28
"""The most dense multiply-accumulates a timed call takes (GPT-2's LM head at 512 tokens would take 2e10)."""

ROUNDS = 5
"""Interleaved timing rounds per bucket (after one warm-up call of each kernel)."""

SAMPLE = 2e-3
"""Seconds of calls one timing sample takes (a one-token call is tens of microseconds: too noisy alone)."""

MARGIN = 0.95
"""A sparse kernel is chosen only where its median is below this share of the dense one's: within noise
of dense, a layer stays dense."""


def kernel_for(choice: Sequence[str], tokens: int) -> str:
    """The kernel ``choice`` (one name per bucket of ``BUCKETS``) names for a call of ``tokens``."""
    at = 0
    for i, b in enumerate(BUCKETS[: len(choice)]):
        if tokens >= b:
            at = i
    return choice[at]


def _time(fn: Callable[[], object], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def _rows(p: PackedWeight, n: int) -> PackedWeight:
    """``p``'s first ``n`` output rows (all of them when it has no more): every kernel's time grows
    with the rows in proportion, so a layer too large to time whole is timed on a slice of itself."""
    if n >= p.out_features:
        return p
    end = int(p.indptr[n])
    return PackedWeight(p.values[:end], p.indices[:end], p.indptr[: n + 1].clone(), p.in_features)


def _medians(
    run: dict[str, Kernel], x: torch.Tensor, names: Sequence[str], calls: dict[str, int], rounds: int
) -> dict[str, float]:
    """Each kernel's median seconds a call over ``rounds`` interleaved rounds, the order rotated each."""
    names = list(names)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            times[k].append(_time(lambda k=k: run[k](x), calls[k]))
    return {k: statistics.median(v) for k, v in times.items()}


def choose(
    p: PackedWeight, candidates: Sequence[str], bias: torch.Tensor | None = None, *, rounds: int = ROUNDS
) -> tuple[str, ...]:
    """The fastest of ``candidates`` for ``p`` (and ``bias``, as the layer adds it) at each bucket
    (``spmv`` only up to 8 tokens). The sparse kernels take float32; a weight of another dtype stays
    dense (torch's CSR product has no bfloat16 kernel on the CPU)."""
    if p.values.dtype != torch.float32:
        return ("dense",) * len(BUCKETS)
    gen = torch.Generator().manual_seed(0)
    choice: list[str] = []
    for tokens in BUCKETS:
        q = _rows(p, max(1, BUDGET // (tokens * p.in_features)))
        x = torch.randn(tokens, p.in_features, generator=gen, dtype=p.values.dtype)
        names = [k for k in candidates if k != "spmv" or tokens <= 8]
        b = None if bias is None else bias.detach()[: q.out_features]
        run = {k: bind(k, q, b) for k in names}
        calls = {}
        for k in names:  # warm-up (numba compiles, MKL sets up), then enough calls for SAMPLE seconds
            run[k](x)
            once = _time(functools.partial(run[k], x), 1)
            calls[k] = max(1, min(1000, round(SAMPLE / max(once, 1e-7))))
        first = _medians(run, x, names, calls, rounds)
        finalists = list(dict.fromkeys([*sorted(names, key=first.__getitem__)[:2], "dense"]))
        again = _medians(run, x, finalists, calls, rounds)  # the two fastest and dense, timed again
        median = {k: (first[k] + again[k]) / 2 for k in finalists}
        best = min(finalists, key=median.__getitem__)
        choice.append(best if median[best] < MARGIN * median["dense"] else "dense")
    return tuple(choice)
