"""Which kernel a frozen layer runs, by tokens: measured on this machine when the model is frozen.

For each token count in ``BUCKETS`` the candidates (``kernels.available_kernels``) run on random inputs in
interleaved rounds, each sample ``SAMPLE`` seconds of calls after an untimed one, or, for a model larger
than the cache (``cold``), one call after the cache is emptied (``cache.py``). The two fastest are timed
again with dense and the two sets averaged (a burst of load on a shared machine can flip one set).
``dense`` is always a candidate and a sparse kernel wins only by ``MARGIN``, in each set, so a layer whose
sparse kernels are not clearly faster at some size stays dense there. A call takes the choice of the
largest bucket at or below its tokens, but dense between it and a next bucket that chose dense
(``kernel_for``). Where a layer's dense work at a bucket is past ``BUDGET`` multiply-accumulates (an LM
head at 512 tokens), its first output rows are timed, as many as the budget holds. Layers of one shape
and density share one measurement (``freeze.py``)::

    >>> kernel_for(("spmv", "torch", "torch", "rows", "rows"), 1), kernel_for(("spmv", "torch"), 20)
    ('spmv', 'torch')
    >>> [kernel_for(("rows", "dense", "rows"), t) for t in (1, 2, 8, 32)]
    ['rows', 'dense', 'dense', 'rows']
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from . import cache
from .kernels import FEW_TOKENS, bind
from .packed import PackedWeight

__all__ = ["BUCKETS", "BUDGET", "ROUNDS", "choose", "fastest", "kernel_for"]

BUCKETS = (1, 8, 32, 128, 512)
"""Token counts the choice is measured at."""

BUDGET = 2**31
"""The most dense multiply-accumulates a timed call takes (GPT-2's LM head at 512 tokens would take 2e10).
A slice times the kernels' fixed costs (the input's transpose) against fewer rows than the layer
has, so it is kept for layers that would take seconds: GPT-2's 3072x768 at 512 tokens is timed whole."""

ROUNDS = 5
"""Interleaved timing rounds per bucket (after one warm-up call of each kernel)."""

SAMPLE = 2e-3
"""Seconds of calls one timing sample takes (a one-token call is tens of microseconds: too noisy alone)."""

MARGIN = 0.9
"""A sparse kernel is chosen only where its median is below this share of the dense one's: within noise
of dense, a layer stays dense. On a shared machine a kernel 5% faster when frozen ran 5% slower in a
later run (GPT-2's 3072x768 at 50% and 128 tokens), so the margin is 10%."""


def kernel_for(choice: Sequence[str], tokens: int, buckets: Sequence[int] = BUCKETS) -> str:
    """The kernel ``choice`` (one name per bucket of ``buckets``) runs at ``tokens``: a bucket's own
    at its size; above it (below the next), the same unless the next bucket measured dense, then
    dense: between two measured sizes a sparse kernel runs only where it won at both. Below the first
    bucket, the first one's rule; past the last, the last one's choice."""
    at = 0
    for i, b in enumerate(buckets[: len(choice)]):
        if tokens >= b:
            at = i
    if tokens != buckets[at] and at + 1 < len(choice) and choice[at + 1] == "dense":
        return "dense"
    return choice[at]


def _time(fn: Callable[[], object], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def _rows(p: PackedWeight, n: int) -> PackedWeight:
    """``p``'s first ``n`` output rows (all of them when it has no more): every kernel's time grows
    with the rows in proportion, so a layer too large to time whole is timed on a slice of itself.
    Always a new ``PackedWeight``: what the kernels timed make of it (a dense copy, other layouts)
    goes with it, not into the layer."""
    if n >= p.out_features:
        return PackedWeight(p.values, p.indices, p.indptr, p.in_features)
    end = int(p.indptr[n])
    return PackedWeight(p.values[:end], p.indices[:end], p.indptr[: n + 1].clone(), p.in_features)


def _sample(fn: Callable[[], object], calls: int, cold: bool) -> float:
    """Seconds a call of ``fn``: one call with the cache emptied first (``cold``), else ``calls``
    calls after an untimed one (which brings back what the other kernels' samples evicted)."""
    if cold:
        cache.evict()
        return _time(fn, 1)
    fn()
    return _time(fn, calls)


def _medians(
    run: dict[str, Callable[[], object]], names: Sequence[str], calls: dict[str, int], rounds: int, cold: bool
) -> dict[str, float]:
    """Each call's median seconds over ``rounds`` interleaved rounds, the order rotated each."""
    names = list(names)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            times[k].append(_sample(run[k], calls[k], cold))
    return {k: statistics.median(v) for k, v in times.items()}


def fastest(run: dict[str, Callable[[], object]], *, rounds: int = ROUNDS, cold: bool = False) -> str:
    """The name of the fastest call of ``run`` (one of them is ``"dense"``), measured as the module
    docstring says: dense unless another is below ``MARGIN`` of it in both sets of rounds."""
    calls = {}
    for k, fn in run.items():  # warm-up (numba compiles, MKL sets up), then enough calls for SAMPLE seconds
        fn()
        calls[k] = max(1, min(1000, round(SAMPLE / max(_time(fn, 1), 1e-7))))
    first = _medians(run, list(run), calls, rounds, cold)
    finalists = list(dict.fromkeys([*sorted(run, key=first.__getitem__)[:2], "dense"]))
    again = _medians(run, finalists, calls, rounds, cold)  # the two fastest and dense, timed again
    median = {k: (first[k] + again[k]) / 2 for k in finalists}
    best = min(finalists, key=median.__getitem__)
    wins = all(times[best] < MARGIN * times["dense"] for times in (first, again))
    return best if wins else "dense"  # won in both sets: a burst of load on the dense side flips one


def choose(
    p: PackedWeight,
    candidates: Sequence[str],
    bias: torch.Tensor | None = None,
    *,
    rounds: int = ROUNDS,
    cold: bool = False,
) -> tuple[str, ...]:
    """The fastest of ``candidates`` for ``p`` (and ``bias``, as the layer adds it) at each bucket
    (``kernels.FEW_TOKENS`` only up to 8 tokens), each call timed cold where ``cold`` (module
    docstring). The sparse kernels take float32; a weight of another dtype stays dense (torch's CSR
    product has no bfloat16 kernel on the CPU)."""
    if p.values.dtype != torch.float32:
        return ("dense",) * len(BUCKETS)
    gen = torch.Generator().manual_seed(0)
    choice: list[str] = []
    for tokens in BUCKETS:
        q = _rows(p, max(1, BUDGET // (tokens * p.in_features)))
        x = torch.randn(tokens, p.in_features, generator=gen, dtype=p.values.dtype)
        b = None if bias is None else bias.detach()[: q.out_features]
        names = [k for k in candidates if k not in FEW_TOKENS or tokens <= 8]
        run = {k: functools.partial(bind(k, q, b), x) for k in names}
        choice.append(fastest(run, rounds=rounds, cold=cold))
    return tuple(choice)
