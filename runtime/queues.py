"""Queues of tasks on PEs, vectorized: when each task finishes if every PE runs its tasks one at a time
in arrival order.

``fifo`` takes ``(PE, arrival, cost)`` triples in any order and answers with one segmented ``cummax``
(a PE's last finish is ``max_i(arrival_i + cost_i + ... + cost_last)``), so there is no Python loop per
PE or task. ``queues`` does the same for a sparse matmul's ``[blocks, pairs]`` tasks and keeps only each
PE's last finish per block.

    >>> import torch
    >>> fifo(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 5]), torch.tensor([4, 4, 2])).tolist()
    [4, 8, 7]
"""

from __future__ import annotations

import torch

from . import compiled

__all__ = ["fifo", "finishes", "queues", "sparse_tasks", "BIG", "CHUNK", "NEVER"]

BIG = 1 << 44
NEVER = 1 << 62  # later than any cycle
CHUNK = 1 << 21  # entries of one scratch tensor
_PE_BITS = 22  # PE ids at or above 2**22 take two sorts


def fifo(pe: torch.Tensor, arrival: torch.Tensor, cost: torch.Tensor) -> torch.Tensor:
    """Finish time of each task when every PE runs its tasks one at a time in arrival order.

    Tasks are given in any order; ties in arrival keep the given order. Returns int64 finishes in
    the given order.
    """
    if pe.numel() == 0:
        return torch.zeros(0, dtype=torch.int64)
    pe, arrival, cost = pe.to(torch.int64), arrival.to(torch.int64), cost.to(torch.int64)
    if compiled.available(pe, arrival, cost) and (got := compiled.fifo(pe, arrival, cost)) is not None:
        return got
    p_lo, p_hi = (int(v) for v in torch.aminmax(pe))
    finish = torch.empty_like(arrival)
    a_lo, a_hi = (int(v) for v in torch.aminmax(arrival))
    if p_lo >= 0 and p_hi < 1 << _PE_BITS:
        # One sort of keys from each PE's own base (``queues`` explains it), arrivals counted from the
        # first; the base comes off at the end.
        busy = torch.zeros(p_hi + 1, dtype=torch.int64).index_add_(0, pe, cost)
        span = a_hi - a_lo + int(busy.max()) + 1
        if (p_hi + 1) * span < 1 << 61:
            base = (torch.cumsum(busy, 0) - busy + torch.arange(p_hi + 1) * span)[pe]
            key, order = _sort(base + (arrival - a_lo), 2 * (p_hi + 1) * span)
            c = cost[order]
            total = torch.cumsum(c, 0)
            done = torch.cummax(key.sub_(total).add_(c), 0).values.add_(total)
            finish[order] = done.sub_(base[order]).add_(a_lo)
            return finish
    order = torch.argsort(arrival, stable=True)
    order = order[torch.argsort(pe[order], stable=True)]
    finish[order] = _run_sorted(pe[order], arrival[order], cost[order])
    return finish


def _sort(key: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A stable sort of keys in ``[0, top)``: as int32 where they fit, which sorts about twice as fast."""
    if top <= 1 << 31:
        k, order = torch.sort(key.to(torch.int32), stable=True)
        return k.to(torch.int64), order
    return torch.sort(key, stable=True)


def _run_sorted(p: torch.Tensor, a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``fifo``'s finishes for tasks already sorted by PE, then arrival: one segmented ``cummax``."""
    total = torch.cumsum(c, 0)
    first = torch.ones_like(p, dtype=torch.bool)
    first[1:] = p[1:] != p[:-1]
    start_index = torch.cummax(torch.where(first, torch.arange(len(p)), 0), 0).values
    base = (total - c)[start_index]  # cost before each PE's first task
    done = total - base  # cumulative cost within the PE
    seg = torch.cumsum(first.to(torch.int64), 0)
    key = a - (done - c) + seg * BIG
    best = torch.cummax(key, 0).values - seg * BIG
    return done + best


def queues(
    pe: torch.Tensor, arr: torch.Tensor, cost: torch.Tensor, pes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fifo`` for a sparse matmul's tasks: ``[pes, blocks]`` when each PE finishes its last task of each
    block (0 where it has none), and each PE's busy cycles.

    Task ``(q, n)`` (block ``q``, pair ``n`` on PE ``pe[n]``, pairs PE by PE) arrives at ``arr[q, n]`` and
    takes ``cost[q, n]`` cycles; cost 0 is no task. Ties in arrival go block by block, then pair by pair.
    Sorts of ``(PE, arrival)`` keys over every ``(q, n)``, whole PEs at a time: a missing task is given
    arrival 0, so it sorts first on its PE and never holds the PE up.
    """
    blocks, pairs = arr.shape
    busy = torch.zeros(pes, dtype=torch.int64).index_add_(0, pe, cost.sum(0))
    if arr.numel() == 0:
        return torch.zeros((pes, blocks), dtype=torch.int64), busy
    a_lo, a_hi = (int(v) for v in torch.aminmax(arr))
    span = a_hi - a_lo + (int(busy.max()) if pes else 0) + 1  # arrivals counted from the first
    if pes * span >= 1 << 61:
        return _queues_slow(pe, arr, cost, pes), busy
    best = torch.zeros(pes * blocks, dtype=torch.int64)
    # Each PE's keys start at its own base: the cost of the PEs before it plus ``span`` per PE, so every
    # key of a PE sorts after those of the PE before it and one running total and one cummax serve all
    # PEs. A task ends at its PE's running total + the largest (arrival - running total before it) of
    # the PE's tasks up to it; the sums below carry the base, taken off per PE at the end.
    base = torch.cumsum(busy, 0) - busy + torch.arange(pes) * span
    ends = torch.cumsum(torch.bincount(pe, minlength=pes), 0)  # each PE's pairs end there
    group = torch.div(ends - 1, max(1, CHUNK // blocks), rounding_mode="floor")
    last = torch.cumsum(torch.unique_consecutive(group, return_counts=True)[1], 0) - 1
    bounds = [0] + ends[last].tolist()
    slot = pe[None, :] * blocks + torch.arange(blocks)[:, None]  # [blocks, pairs]: each task's (PE, block)
    for n0, n1 in zip(bounds[:-1], bounds[1:]):  # whole PEs at a time, about CHUNK tasks
        if n1 == n0:
            continue
        c = cost[:, n0:n1]
        key = torch.where(c > 0, arr[:, n0:n1] - a_lo, 0).add_(base[pe[n0:n1]][None, :]).reshape(-1)
        key, order = _sort(key, 2 * pes * span)
        c = c.reshape(-1)[order]
        total = torch.cumsum(c, 0)
        finish = torch.cummax(key.sub_(total).add_(c), 0).values.add_(total).masked_fill_(c == 0, 0)
        best.scatter_reduce_(0, slot[:, n0:n1].reshape(-1)[order], finish, "amax")
    best = best.reshape(pes, blocks).sub_(base[:, None])  # > 0 where a PE has tasks of a block
    return torch.where(best > 0, best + a_lo, 0), busy


def finishes(
    pe: torch.Tensor, arr: torch.Tensor, cost: torch.Tensor, pes: int, t0: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``[pes, blocks]``: when each PE is done with each block of a sparse matmul; each PE's busy
    cycles; and when the first task arrives (``NEVER`` if there is none). A PE is done with block
    ``q`` once its tasks of ``q`` have run (``queues``), every message of its columns in ``q`` has
    come (tasks or not: it cannot know a column is empty before its message), it is done with
    ``q - 1``, and not before ``t0``.

        >>> pe = torch.tensor([0, 0])
        >>> arr, cost = torch.tensor([[1, 6], [2, 3]]), torch.tensor([[4, 0], [0, 0]])
        >>> finish, busy, first = finishes(pe, arr, cost, 1, 0)
        >>> finish.tolist(), busy.tolist(), first
        ([[6, 6]], [4], 1)
    """
    if compiled.available(pe, arr, cost):
        got = compiled.finishes(pe, arr, cost, pes, t0, NEVER)
        if got is not None:
            return got
    best, busy = queues(pe, arr, cost, pes)
    barrier = torch.full((arr.shape[0], pes), t0, dtype=torch.int64)
    barrier.scatter_reduce_(1, pe[None, :].expand_as(arr), arr, "amax")
    first = int(arr.masked_fill(cost == 0, NEVER).amin()) if arr.numel() else NEVER
    return torch.cummax(torch.maximum(best, barrier.T), dim=1).values, busy, first


def sparse_tasks(
    pe: torch.Tensor,
    arr: torch.Tensor,
    each: torch.Tensor,
    size_of: torch.Tensor,
    col: torch.Tensor,
    sent: torch.Tensor | None,
    pes: int,
    t0: int,
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]:
    """A sparse matmul's tasks (``finishes``) from what sets them: pair ``n`` (on PE ``pe[n]``, reading
    input column ``col[n]``) has a task in block ``q`` when the column's message of ``q`` is sent
    (``sent[q, col[n]]``; None: every message is) and the task costs something, ``each[size_of[q], n]``
    cycles (0: the pair has no nonzero). Returns ``finishes``' three results, each pair's tasks over
    the blocks and whether each block ran a task.

        >>> pe, col = torch.tensor([0, 0]), torch.tensor([0, 1])
        >>> arr, each = torch.tensor([[1, 6], [2, 3]]), torch.tensor([[4, 0]])
        >>> sent = torch.tensor([[True, True], [False, True]])
        >>> got = sparse_tasks(pe, arr, each, torch.tensor([0, 0]), col, sent, 1, 0)
        >>> got[0].tolist(), got[1].tolist(), got[2], got[3].tolist(), got[4].tolist()
        ([[6, 6]], [4], 1, [1, 0], [True, False])
    """
    if compiled.available(pe, arr, each):
        got = compiled.sparse_tasks(pe, arr, each, size_of, col, sent, pes, t0, NEVER)
        if got is not None:
            return got
    has = each[size_of] > 0
    work = has if sent is None else sent[:, col] & has
    finish, busy, first = finishes(pe, arr, torch.where(work, each[size_of], 0), pes, t0)
    return finish, busy, first, work.sum(0), work.any(1)


def _queues_slow(pe: torch.Tensor, arr: torch.Tensor, cost: torch.Tensor, pes: int) -> torch.Tensor:
    """``queues`` for arrivals too large for one sort key: the tasks through ``fifo``."""
    blocks = arr.shape[0]
    q, n = (cost > 0).nonzero(as_tuple=True)
    finish = fifo(pe[n], arr[q, n], cost[q, n])
    return torch.zeros(pes * blocks, dtype=torch.int64).scatter_reduce_(
        0, pe[n] * blocks + q, finish, "amax"
    ).reshape(pes, blocks)
