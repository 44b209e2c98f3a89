"""Pipelined stages of about equal time: the mesh's columns shared by what each kernel measures.

In a pipelined program every kernel is resident at once and inputs follow one another through it, so
its steady-state interval is the busiest PE's busy cycles over all kernels (``stats.steady_interval``):
one slow kernel sets the pace for all. ``place.py`` first shares the spare columns by an estimate of
work; an attention matmul, whose work is activations times activations, can then sit on one column
at four times the busy cycles of any weight matmul (gpt-tiny on 64x64: 16,520 cycles against about
5,400), and the interval is the same dense or sparse.

``balance`` shares the columns again from each kernel's measured busiest-PE cycles at its present
width, taking a kernel's busy time to fall in proportion to the columns it gets (its nonzeros, its row
tiles and its outputs per column spread over them). It finds the smallest interval that the columns
can reach under that rule, each kernel between its SRAM minimum and its cap, and gives the columns
left over to the kernels that stay slowest::

    >>> balance(busy=[4000, 100, 1000], widths=[1, 1, 2], mins=[1, 1, 1], caps=[8, 1, 8], columns=8)
    [5, 1, 2]

``rebalance`` measures, shares again, builds and measures again, and keeps a new share only while
the clock confirms it (``Stages.better_than``): a shorter interval with no longer latency, or the same
interval with a shorter latency. The lowering
applies it to the program and, with the same effort, to the dense baseline's plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sparsefx.runtime.fast import simulate
from sparsefx.runtime.program import ProgramData
from sparsefx.runtime.stats import steady_interval

__all__ = ["Stages", "balance", "measured", "rebalance", "ROUNDS"]

P = TypeVar("P")

ROUNDS = 1
"""Shares built and timed at most. Each is a placement, a block plan and a run of the clock: about 10 s
for GPT-2 small pipelined on ``wse2``, where the first share took the sparse program's interval from
98,568 cycles to 27,776 and two more only to 26,992."""


@dataclass(frozen=True)
class Stages(Generic[P]):
    """One placed program as the clock measured it: its interval, its latency, and each kernel's
    busiest PE (in program order) at ``widths`` columns."""

    program: P
    widths: list[int]
    interval: int
    latency: int
    busy: list[int]

    def better_than(self, other: Stages) -> bool:
        """A shorter interval with no longer latency, or the same interval with a shorter latency: a
        share never trades one input's latency for throughput (a sparser model stays no slower)."""
        if self.latency > other.latency:
            return False
        return (self.interval, self.latency) < (other.interval, other.latency)


def _need(work: float, at_most: float, low: int, cap: int) -> int:
    """Columns that bring ``work`` (busy cycles times columns) to ``at_most`` cycles, within bounds."""
    if work <= 0:
        return low
    return min(cap, max(low, math.ceil(work / at_most)))


def balance(busy: list[int], widths: list[int], mins: list[int], caps: list[int], columns: int) -> list[int]:
    """Widths that minimise the largest ``busy[i] * widths[i] / new[i]``, with ``mins[i] <= new[i] <=
    caps[i]`` and ``sum(new) <= columns`` (module docstring), given ``sum(mins) <= columns``."""
    caps = [max(c, m) for c, m in zip(caps, mins)]
    work = [b * w for b, w in zip(busy, widths)]
    best = max([w / c for w, c in zip(work, caps)] + [1.0])  # each kernel at its cap
    lo, hi = max(1, math.floor(best)), max(math.ceil(max(work + [1])), 1)  # at hi every kernel at its minimum
    while lo < hi:  # the smallest interval the columns reach
        mid = (lo + hi) // 2
        if sum(_need(w, mid, m, c) for w, m, c in zip(work, mins, caps)) <= columns:
            hi = mid
        else:
            lo = mid + 1
    new = [_need(w, lo, m, c) for w, m, c in zip(work, mins, caps)]
    for _ in range(columns - sum(new)):  # the columns left over, each to the slowest kernel that can use it
        open_ = [i for i in range(len(new)) if new[i] < caps[i] and work[i] > 0]
        if not open_:
            break
        new[max(open_, key=lambda j: (work[j] / new[j], -j))] += 1
    return new


def rebalance(
    start: Stages[P],
    build: Callable[[list[int]], Stages[P] | None],
    mins: list[int],
    caps: list[int],
    columns: int,
    rounds: int = ROUNDS,
) -> Stages[P]:
    """The best share found from ``start``: ``build(widths)`` places, plans and times one share (None
    where it cannot be placed); a share is kept only if it is ``better_than`` the best so far."""
    best, seen = start, {tuple(start.widths)}
    for _ in range(rounds):
        widths = balance(best.busy, best.widths, mins, caps, columns)
        if tuple(widths) in seen:
            break
        seen.add(tuple(widths))
        tried = build(widths)
        if tried is None or not tried.better_than(best):
            break
        best = tried
    return best


def measured(program: ProgramData) -> Stages[ProgramData]:
    """``program`` as the fast clock times it, every activation taken as nonzero."""
    timeline = simulate(program)
    busy = {kt.name: kt.busy_sums()[0] if kt.busy.numel() else 0 for kt in timeline.kernels}
    widths = [k.region.width for k in program.kernels]
    interval = steady_interval(program, timeline)
    return Stages(program, widths, interval, timeline.cycles, [busy.get(k.name, 0) for k in program.kernels])
