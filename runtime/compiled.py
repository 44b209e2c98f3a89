"""The fast clock's task queues and message arrivals as compiled loops, where numba is installed
(the ``fast`` extra).

In tensor form, ``queues.finishes`` and ``queues.fifo`` sort every task, then take running totals: a
dozen passes over a few hundred thousand entries per kernel. A loop over each PE's tasks, kept in
order as they are gathered (an insertion sort, since later blocks mostly arrive later; one plain sort
once that stops paying), does the same work in one pass and gives the same finishes, tie rules
included; ``arrivals.arrivals_at`` is one pass instead of seven. ``available`` says whether the
loops run: numba installed, ``SPARSEFX_NUMBA`` not ``0``, and the tensors on the CPU. Without numba
the clock keeps its tensor form; ``tests/test_compiled.py`` checks that both give the same times.

numba is imported, and each loop compiled (about a second), on first use; numba caches the
machine code for later processes.

    >>> import torch
    >>> pe = torch.tensor([0, 0, 1])  # PE 0 holds pairs 0 and 1; cost 0 is no task
    >>> arr, cost = torch.tensor([[5, 0, 2], [9, 1, 4]]), torch.tensor([[3, 3, 1], [3, 0, 1]])
    >>> done = finishes(pe, arr, cost, 2, 0, 1 << 62) if available(arr) else None
    >>> ([[8, 12], [3, 5]], [9, 2], 0) if done is None else (done[0].tolist(), done[1].tolist(), done[2])
    ([[8, 12], [3, 5]], [9, 2], 0)
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

import numpy as np
import torch

__all__ = [
    "arrivals_at",
    "available",
    "lazy",
    "busiest_rows",
    "column_sums",
    "fifo",
    "finishes",
    "gaps",
    "lane_departs",
    "lane_sends",
    "lane_starts",
    "last_in",
    "merge_order",
    "reach",
    "range_max_1d",
    "slowest_rows",
    "sparse_tasks",
    "stab",
]

_HAVE_NUMBA = importlib.util.find_spec("numba") is not None
_KEY_TOP = 1 << 62  # sort keys stay below this


def available(*tensors: torch.Tensor) -> bool:
    """Whether the compiled loops run for ``tensors``: numba installed and allowed, tensors on the CPU."""
    return (
        _HAVE_NUMBA
        and os.environ.get("SPARSEFX_NUMBA", "1") != "0"
        and all(t.device.type == "cpu" for t in tensors)  # not ``is_cpu``: a subclass may answer it wrongly
    )


def lazy(loop: Callable) -> Callable:
    """``loop`` compiled by numba on its first call, for a module of its own loops: importing it never
    imports numba, and numba caches the machine code for later processes. Callers check ``available``."""
    done: list[Callable] = []

    def call(*args: object) -> object:
        if not done:
            import numba

            done.append(numba.njit(cache=True, nogil=True)(loop))
        return done[0](*args)

    return call


def finishes(
    pe: torch.Tensor, arr: torch.Tensor, cost: torch.Tensor, pes: int, t0: int, never: int
) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """``queues.finishes`` in one compiled pass: ``[pes, blocks]`` when each PE is done with each block,
    each PE's busy cycles, and the first task's arrival (``never`` if none); ``pe`` is
    non-decreasing (pairs PE by PE). None when the sort keys (arrival, block, pair) would not fit
    in 62 bits."""
    blocks, pairs = arr.shape
    whole, cols = torch.arange(blocks, device="cpu"), torch.zeros(pairs, dtype=torch.int64, device="cpu")
    got = sparse_tasks(pe, arr, cost, whole, cols, None, pes, t0, never)
    return None if got is None else got[:3]


def sparse_tasks(
    pe: torch.Tensor,
    arr: torch.Tensor,
    each: torch.Tensor,
    size_of: torch.Tensor,
    col: torch.Tensor,
    sent: torch.Tensor | None,
    pes: int,
    t0: int,
    never: int,
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor] | None:
    """``queues.sparse_tasks`` in one compiled pass, each task's cost taken where it is needed (no
    ``[blocks, pairs]`` cost or flags): ``finishes``' three results, then each pair's tasks over the
    blocks and whether each block ran a task. None when the sort keys would not fit in 62 bits."""
    blocks, pairs = arr.shape
    finish = _host_full((pes, blocks), t0)
    busy = _host_full(pes, 0)
    first = _host_full(1, never)  # the first task's arrival
    started = _host_full(pairs, 0)
    data = _host_full(blocks, 0)
    flags = np.ones((1, 1), np.bool_) if sent is None else sent.contiguous().numpy()
    if arr.numel():
        ints = (_np(pe), _np(arr), _np(each), _np(size_of), _np(col), flags, sent is not None)
        if not _loops()["tasks"](*ints, finish, busy, first, started, data):
            return None
    done = torch.from_numpy(data) > 0
    finish_t, busy_t, started_t = torch.from_numpy(finish), torch.from_numpy(busy), torch.from_numpy(started)
    return finish_t, busy_t, int(first[0]), started_t, done


def fifo(pe: torch.Tensor, arrival: torch.Tensor, cost: torch.Tensor) -> torch.Tensor | None:
    """``queues.fifo`` compiled: each task's finish when every PE runs its tasks one at a time in arrival
    order, ties in the given order. None when the PE ids spread too far for a count per id, or the
    sort keys (arrival, place on the PE) would not fit in 62 bits."""
    finish = _host_full(len(pe))
    if len(pe):
        p_lo, p_hi = (int(v) for v in torch.aminmax(pe))
        if p_hi - p_lo >= 4 * len(pe) + (1 << 20):
            return None
        if not _loops()["fifo"](_np(pe), _np(arrival), _np(cost), finish, p_lo, p_hi - p_lo + 1):
            return None
    return torch.from_numpy(finish)


def lane_departs(ready: torch.Tensor, sends: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor | None:
    """``Flow._queued`` compiled: ``[blocks, features]`` when each message's head leaves when every lane
    (features ``bounds[l] .. bounds[l + 1] - 1``) sends its messages in the order they are ready, ties
    block by block then feature by feature, ``sends`` wavelets each, one a cycle. None when the sort
    keys would not fit in 62 bits."""
    out = _host_full(tuple(ready.shape))
    if ready.numel() and not _loops()["lane_departs"](_np(ready), _np(sends), _np(bounds), out):
        return None
    return torch.from_numpy(out)


def lane_sends(wave: torch.Tensor, live: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """``timeline.lane_sends`` compiled, for a value whose zeros are known (``live``)."""
    out = _host_full(tuple(live.shape))
    if live.numel():
        _loops()["lane_sends"](_np(wave), live.contiguous().numpy(), _np(bounds), out)
    return torch.from_numpy(out)


def lane_starts(sends: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """``Flow.waiting``'s departures compiled: ``[blocks, features]`` when each message's head leaves,
    counted from the start, if every message waits at it and each lane (features ``bounds[l] ..
    bounds[l + 1] - 1``) sends its own in order, block by block, ``sends`` wavelets each."""
    out = _host_full(tuple(sends.shape))
    if sends.numel():
        _loops()["lane_starts"](_np(sends), _np(bounds), out)
    return torch.from_numpy(out)


def arrivals_at(
    depart: torch.Tensor,
    sends: torch.Tensor,
    live: torch.Tensor | None,
    q: torch.Tensor,
    feats: torch.Tensor,
    hops: torch.Tensor,
    climb: torch.Tensor,
    last: torch.Tensor,
    forked: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``arrivals.arrivals_at`` in one compiled pass over the ``[len(q), len(feats)]`` messages."""
    out = _host_full((len(q), len(feats)))
    flags = np.ones((1, 1), np.bool_) if live is None else live.contiguous().numpy()
    ints = (_np(q), _np(feats), _np(hops), _np(climb), _np(last))
    if forked is None:
        fork = (np.zeros((1, 1), np.int64), np.zeros(1, np.int64), np.full(len(feats), -1, np.int64))
    else:
        fork = tuple(_np(t) for t in forked)
    _loops()["arrivals_at"](_np(depart), _np(sends), flags, live is not None, *ints, *fork, out)
    return torch.from_numpy(out)


def range_max_1d(values: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``intervals.range_max_1d`` compiled: ``[ranges, blocks]`` the largest of rows ``lo..hi`` of
    ``values`` ``[n, blocks]``, from one sparse table built in place a level at a time."""
    out = _host_full((len(lo), values.shape[1]))
    if len(lo):
        _loops()["range_max_1d"](values.to(torch.int64, copy=True).numpy(), _np(lo), _np(hi), out)
    return torch.from_numpy(out)


def busiest_rows(
    at: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, buses: int, height: int
) -> torch.Tensor:
    """``intervals.busiest_link``'s rows compiled: for messages crossing rows ``lo..hi`` of bus ``at``
    (``0 .. buses - 1``), the row of each one's busiest link, counting every message's rows (ties: the
    last row), from one grid of loads built in place and one sparse table over it."""
    table = _host_full((buses * height, 1))  # the loop writes every entry
    out = _host_full((len(at), 1))
    if len(at):
        _loops()["busiest_rows"](_np(at), _np(lo), _np(hi), height, table, out)
    return torch.from_numpy(out[:, 0] % height)


def merge_order(
    nz_ptr: torch.Tensor,
    col_off: torch.Tensor,
    col_ptr: torch.Tensor,
    row_idx: torch.Tensor,
    in_lo: torch.Tensor,
    out_lo: torch.Tensor,
    span: torch.Tensor,
    out_features: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | int:
    """``sparse_eval._merge``'s indices in one compiled pass over the PEs' slices: each nonzero's input
    feature and output, and the nonzeros ordered by output, PE by PE and in input order within a PE
    (a stable counting sort). A PE whose row index leaves its output range: that PE's index."""
    nnz = len(row_idx)
    feature, output, order = _host_full(nnz), _host_full(nnz), _host_full(nnz)
    ints = tuple(_np(t) for t in (nz_ptr, col_off, col_ptr, row_idx, in_lo, out_lo, span))
    bad = _loops()["merge_order"](*ints, out_features, feature, output, order)
    if bad >= 0:
        return int(bad)
    return torch.from_numpy(feature), torch.from_numpy(output), torch.from_numpy(order)


def gaps(
    nz_ptr: torch.Tensor,
    col_off: torch.Tensor,
    col_ptr: torch.Tensor,
    row_idx: torch.Tensor,
    span: torch.Tensor,
) -> torch.Tensor | None:
    """``encoding.encode``'s gaps in one compiled pass over placed CSC slices: each nonzero's slots
    skipped since the one before it on its PE (slot ``column * span + row``). None where a row leaves its
    PE's span or goes back within a column (``encode`` then keeps CSC)."""
    out = _host_full(len(row_idx))
    ints = tuple(_np(t) for t in (nz_ptr, col_off, col_ptr, row_idx, span))
    return torch.from_numpy(out) if _loops()["gaps"](*ints, out) else None


def slowest_rows(
    finish: torch.Tensor,
    order: torch.Tensor,
    y: torch.Tensor,
    height: int,
    lo: torch.Tensor,
    hi: torch.Tensor,
) -> torch.Tensor:
    """``Columns.slowest``'s ranges compiled: ``[ranges, blocks]`` the largest ``finish[order[i], q] *
    height + y[i]`` over ``i`` in ``lo..hi`` (inclusive, non-empty), from one sparse table."""
    out = _host_full((len(lo), finish.shape[1]))
    if len(lo):
        _loops()["slowest"](_np(finish), _np(order), _np(y), height, _np(lo), _np(hi), out)
    return torch.from_numpy(out)


def stab(
    a: torch.Tensor, b: torch.Tensor, value: torch.Tensor, n: int, empty: int, largest: bool
) -> torch.Tensor:
    """``intervals.stab`` compiled: ``[n, blocks]`` the largest (or least) ``value`` of the ranges
    ``a[i] .. b[i] - 1`` holding each index, ``empty`` where none does; ``value`` is ``[ranges, blocks]``."""
    out = _host_full((n, value.shape[1]), empty)
    if len(a) and n:
        _loops()["stab"](_np(a), _np(b), _np(value), out, largest)
    return torch.from_numpy(out)


def reach(
    finish: torch.Tensor,
    at: torch.Tensor,
    t0: int,
    y: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    segments: int,
    segment: torch.Tensor,
    span: torch.Tensor,
) -> torch.Tensor:
    """``Holders.reach`` compiled: ``[blocks, keys]``. Interval ``i`` holds rows of PE ``at[i]`` of
    ``finish`` (``-1``: an idle PE, done at ``t0``) at ``y[i]`` cycles from row 0 and covers segments
    ``a[i] .. b[i] - 1``; key ``k`` is in ``segment[k]``, ``span[k]`` cycles from row 0."""
    blocks = finish.shape[1]
    out = _host_full((blocks, len(segment)))
    if len(segment):
        intervals = (_np(at), t0, _np(y), _np(a), _np(b), segments)
        _loops()["reach"](_np(finish), *intervals, _np(segment), _np(span), out)
    return torch.from_numpy(out)


def column_sums(
    arrive: torch.Tensor,
    slowest: torch.Tensor,
    pairs: tuple[torch.Tensor, ...],
    columns: tuple[torch.Tensor, torch.Tensor],
    wave: torch.Tensor,
    height: int,
    latest: torch.Tensor,
    ready: torch.Tensor,
    q0: int,
) -> None:
    """The column reduction's queues (``FastClock._reduce``'s loop over blocks) in one compiled pass over
    blocks ``q0 ..`` of ``arrive`` (``[blocks, pairs]``, each held pair's sum at its lane) and ``slowest``
    (``[blocks, segments]``). ``pairs``: each pair's column, output, segment, lane, whether its sums
    travel, its rank on its column's bus, its lead (rows travelled, then to the edge) and its trip to the
    edge, in cycles; ``columns``: ``ahead`` and ``idle`` (``[width, all blocks]``). Updates ``latest``
    (``[width]``, each column bus's running start, carried from block to block) and ``ready``
    (``[all blocks, outputs]``) in place."""
    ints = tuple(_np(t) for t in pairs) + tuple(_np(t) for t in columns)
    loop = _loops()["column_sums"]
    loop(_np(arrive), _np(slowest), *ints, _np(wave), height, latest.numpy(), ready.numpy(), q0)


def last_in(heads: torch.Tensor, sends: torch.Tensor, sizes: list[int], lo: int, rate: float) -> torch.Tensor:
    """``host._last_in`` compiled: ``[len(sizes)]`` when each output's last message is in the host
    (output ``i`` holds the next ``sizes[i]`` messages; every head at least ``lo``), from one bin per
    (arrival, output) filled in one pass over the messages and drained in one over the bins, with
    the tensor form's floating-point steps in its order (so the same cycles)."""
    last = _host_full(len(sizes), 0)
    if len(heads):
        ends = np.cumsum(np.asarray(sizes, np.int64))
        bins = (int(heads.max()) - lo + 1) * len(sizes)
        _loops()["last_in"](_np(heads), _np(sends), ends, lo, float(rate), bins, last)
    return torch.from_numpy(last)


def _host_full(shape: int | tuple[int, ...], fill: int | None = None) -> np.ndarray:
    """A scratch or result array the loops write, allocated by torch (as the tensor form's are), so
    that the memory a run frees and takes again comes from one allocator."""
    size = (shape,) if isinstance(shape, int) else shape
    cpu = torch.device("cpu")  # whatever device context a clock runs in: numpy's memory is the host's
    if fill is None:
        return torch.empty(size, dtype=torch.int64, device=cpu).numpy()
    return torch.full(size, fill, dtype=torch.int64, device=cpu).numpy()


def _np(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.int64).contiguous().numpy()


_LOOPS: dict[str, object] = {}


def _loops() -> dict[str, object]:
    """The loops, compiled on first use (so that importing the runtime never imports numba)."""
    if not _LOOPS:
        import numba

        jit = numba.njit(cache=True, nogil=True)
        global _bits, _push, _sort_tail, _merge_runs, _range_max_loop, _stab_plan, _stab_marks  # in the loops
        _bits, _push, _sort_tail, _merge_runs = jit(_bits), jit(_push), jit(_sort_tail), jit(_merge_runs)
        _range_max_loop, _stab_plan, _stab_marks = jit(_range_max_loop), jit(_stab_plan), jit(_stab_marks)
        _LOOPS.update(
            tasks=jit(_tasks_loop),
            fifo=jit(_fifo_loop),
            arrivals_at=jit(_arrivals_loop),
            lane_departs=jit(_lane_departs_loop),
            lane_starts=jit(_lane_starts_loop),
            lane_sends=jit(_lane_sends_loop),
            range_max_1d=_range_max_loop,
            busiest_rows=jit(_busiest_rows_loop),
            merge_order=jit(_merge_order_loop),
            stab=jit(_stab_loop),
            reach=jit(_reach_loop),
            slowest=jit(_slowest_loop),
            last_in=jit(_last_in_loop),
            column_sums=jit(_column_sums_loop),
            gaps=jit(_gaps_loop),
        )
    return _LOOPS


# -- the loops (plain Python until ``_loops`` compiles them) -------------------------------------------

_INSERTION_BUDGET = 8  # shifts per key before the insertion sort gives way to one plain sort
_RUNS_FOR = 16  # PEs whose blocks are sorted one by one and merged after one insertion sort gave way


def _push(keys, k, key, shifts):  # pragma: no cover - runs compiled
    """Put ``key`` into ``keys[:k]``: in order while ``shifts`` (the work so far) is within budget,
    else at the end. Returns the new shift count; past the budget, ``_sort_tail`` sorts."""
    j = k
    if shifts <= _INSERTION_BUDGET * (k + 1):
        while j > 0 and keys[j - 1] > key:
            keys[j] = keys[j - 1]
            j -= 1
            shifts += 1
    else:
        shifts = _INSERTION_BUDGET * (k + 2) + 1  # stays past the budget for the rest of the group
    keys[j] = key
    return shifts


def _sort_tail(keys, k, shifts):  # pragma: no cover - runs compiled
    """Sort ``keys[:k]`` if ``_push`` gave up keeping them in order."""
    if shifts > _INSERTION_BUDGET * (k + 1):
        keys[:k] = np.sort(keys[:k])


def _merge_runs(keys, scratch, runs, count):  # pragma: no cover - runs compiled
    """Sort ``keys[runs[0]:runs[count]]``, made of ``count`` sorted runs starting at ``runs[i]``, by
    merging neighbouring runs pairwise (nothing to do where each run ends below the next's start)."""
    ordered = True
    for r in range(1, count):
        if runs[r] > runs[r - 1] and runs[r] < runs[count] and keys[runs[r] - 1] > keys[runs[r]]:
            ordered = False
    if ordered:
        return
    src, dst = keys, scratch
    width, passes = 1, 0
    while width < count:
        for r in range(0, count, 2 * width):
            lo, mid, hi = runs[r], runs[min(r + width, count)], runs[min(r + 2 * width, count)]
            i, j = lo, mid
            for o in range(lo, hi):
                if j >= hi or (i < mid and src[i] < src[j]):
                    dst[o] = src[i]
                    i += 1
                else:
                    dst[o] = src[j]
                    j += 1
        src, dst = dst, src
        width, passes = width * 2, passes + 1
    if passes % 2:  # the merged keys are in the scratch
        keys[runs[0] : runs[count]] = scratch[runs[0] : runs[count]]


def _bits(x):  # pragma: no cover - runs compiled
    """Bits that hold every value below ``x``."""
    b = 0
    while (1 << b) < x:
        b += 1
    return b


def _tasks_loop(
    pe, arr, each, size_of, col, sent, filtered, finish, busy, first, started, data
):  # pragma: no cover - runs compiled
    blocks, pairs = arr.shape
    lo, hi = arr[0, 0], arr[0, 0]
    for q in range(blocks):
        for n in range(pairs):
            lo, hi = min(lo, arr[q, n]), max(hi, arr[q, n])
    most, n0 = 0, 0
    while n0 < pairs:  # the most pairs on one PE: the size of the scratch keys
        n1 = n0
        while n1 < pairs and pe[n1] == pe[n0]:
            n1 += 1
        most = max(most, n1 - n0)
        n0 = n1
    bq, bn = _bits(blocks), _bits(most)
    if (hi - lo + 1) >= _KEY_TOP >> (bq + bn):
        return False
    keys, scratch = np.empty(blocks * most, np.int64), np.empty(blocks * most, np.int64)
    runs = np.empty(blocks + 1, np.int64)  # where each block's keys start among the PE's
    low_q, low_n = (1 << bq) - 1, (1 << bn) - 1
    n0, by_runs, left = 0, False, 0  # by_runs: PEs just before overlapped blocks too much for one sort
    while n0 < pairs:
        p, n1 = pe[n0], n0
        while n1 < pairs and pe[n1] == p:
            n1 += 1
        k, shifts = 0, 0
        for q in range(blocks):  # key: arrival, then block, then pair (the tie rule), as bit fields
            s, runs[q] = size_of[q], k
            if by_runs:  # each block's keys in order on their own, then the blocks merged
                shifts = 0
            here = keys[k:] if by_runs else keys
            for n in range(n0, n1):
                finish[p, q] = max(finish[p, q], arr[q, n])  # every message of its columns has come
                if each[s, n] > 0 and (not filtered or sent[q, col[n]]):
                    first[0] = min(first[0], arr[q, n])
                    started[n] += 1
                    data[q] = 1
                    key = (((arr[q, n] - lo) << bq | q) << bn) | (n - n0)
                    shifts = _push(here, k - runs[q] if by_runs else k, key, shifts)
                    k += 1
            if by_runs:
                _sort_tail(here, k - runs[q], shifts)
        runs[blocks] = k
        if by_runs:
            _merge_runs(keys, scratch, runs, blocks)
            left -= 1
            by_runs = left > 0  # then one insertion sort is tried again
        else:
            if shifts > _INSERTION_BUDGET * (k + 1):
                by_runs, left = True, _RUNS_FOR
            _sort_tail(keys, k, shifts)
        t, total = lo, np.int64(0)
        for j in range(k):
            q = (keys[j] >> bn) & low_q
            n = n0 + (keys[j] & low_n)
            c = each[size_of[q], n]
            t = max(t, arr[q, n]) + c
            total += c
            finish[p, q] = max(finish[p, q], t)
        busy[p] += total
        for q in range(1, blocks):  # done with a block once done with the one before
            finish[p, q] = max(finish[p, q], finish[p, q - 1])
        n0 = n1
    return True


def _fifo_loop(pe, arrival, cost, finish, p_lo, groups):  # pragma: no cover - runs compiled
    n = len(pe)
    lo, hi = arrival[0], arrival[0]
    for i in range(n):
        lo, hi = min(lo, arrival[i]), max(hi, arrival[i])
    start = np.zeros(groups + 1, np.int64)
    for i in range(n):
        start[pe[i] - p_lo + 1] += 1
    most = 0
    for g in range(groups):
        most = max(most, start[g + 1])
        start[g + 1] += start[g]
    bits = _bits(most)
    if (hi - lo + 1) >= _KEY_TOP >> bits:
        return False
    order = np.empty(n, np.int64)  # tasks PE by PE, in the given order within a PE
    fill = start[:-1].copy()
    for i in range(n):
        g = pe[i] - p_lo
        order[fill[g]] = i
        fill[g] += 1
    keys = np.empty(most, np.int64)
    low = (1 << bits) - 1
    for g in range(groups):
        s, m = start[g], start[g + 1] - start[g]
        k, shifts = 0, 0
        for j in range(m):  # key: arrival, then place in the given order (the tie rule)
            shifts = _push(keys, k, (arrival[order[s + j]] - lo) << bits | j, shifts)
            k += 1
        _sort_tail(keys, k, shifts)
        t = lo
        for j in range(k):
            i = order[s + (keys[j] & low)]
            t = max(t, arrival[i]) + cost[i]
            finish[i] = t
    return True


def _lane_departs_loop(ready, sends, bounds, out):  # pragma: no cover - runs compiled
    blocks, features = ready.shape
    lo, hi = ready[0, 0], ready[0, 0]
    for q in range(blocks):
        for f in range(features):
            lo, hi = min(lo, ready[q, f]), max(hi, ready[q, f])
    most = 0
    for lane in range(len(bounds) - 1):
        most = max(most, bounds[lane + 1] - bounds[lane])
    bits = _bits(blocks * most)
    if (hi - lo + 1) >= _KEY_TOP >> bits:
        return False
    keys = np.empty(blocks * most, np.int64)
    low = (1 << bits) - 1
    for lane in range(len(bounds) - 1):
        f0, width = bounds[lane], bounds[lane + 1] - bounds[lane]
        k, shifts = 0, 0
        for q in range(blocks):  # key: ready, then block, then feature (the tie rule)
            for f in range(f0, f0 + width):
                shifts = _push(keys, k, (ready[q, f] - lo) << bits | (q * width + f - f0), shifts)
                k += 1
        _sort_tail(keys, k, shifts)
        t = lo
        for j in range(k):
            at = keys[j] & low
            q, f = at // width, f0 + at % width
            t = max(t, ready[q, f])
            out[q, f] = t
            t += sends[q, f]
    return True


def _lane_sends_loop(wave, live, bounds, out):  # pragma: no cover - runs compiled
    blocks = live.shape[0]
    for q in range(blocks):
        for lane in range(len(bounds) - 1):
            for f in range(bounds[lane], bounds[lane + 1]):
                out[q, f] = wave[q] if live[q, f] else 0
            last = bounds[lane + 1] - 1
            if last >= bounds[lane] and out[q, last] < 1:  # the lane's end-of-block mark
                out[q, last] = 1


def _lane_starts_loop(sends, bounds, out):  # pragma: no cover - runs compiled
    blocks = sends.shape[0]
    for lane in range(len(bounds) - 1):
        t = 0
        for q in range(blocks):
            for f in range(bounds[lane], bounds[lane + 1]):
                out[q, f] = t
                t += sends[q, f]


def _arrivals_loop(
    depart, sends, live, filtered, q, feats, hops, climb, last, start, q_at, k_of, out
):  # pragma: no cover - runs compiled
    for i in range(len(q)):
        d, w = depart[q[i]], sends[q[i]]
        for n in range(len(feats)):
            f = feats[n]
            if filtered and not live[q[i], f]:
                f = last[f]  # the lane's end-of-block mark
            elif k_of[n] >= 0:  # it forked onto a column's links and left them when queued there
                out[i, n] = start[q_at[i], k_of[n]] + climb[n] + w[f]
                continue
            out[i, n] = d[f] + hops[n] + climb[n] + w[f]


def _busiest_rows_loop(at, lo, hi, height, table, out):  # pragma: no cover - runs compiled
    buses = table.shape[0] // height
    load = np.zeros(buses * (height + 1), np.int64)
    for m in range(len(at)):  # each message adds one to the links of its rows
        load[at[m] * (height + 1) + lo[m]] += 1
        load[at[m] * (height + 1) + hi[m] + 1] -= 1
    for b in range(buses):
        run = 0
        for r in range(height):
            run += load[b * (height + 1) + r]
            table[b * height + r, 0] = run * height + r  # the load, ties to the last row
    first, last = np.empty(len(at), np.int64), np.empty(len(at), np.int64)
    for m in range(len(at)):
        first[m], last[m] = at[m] * height + lo[m], at[m] * height + hi[m]
    _range_max_loop(table, first, last, out)


def _merge_order_loop(
    nz_ptr, col_off, col_ptr, row_idx, in_lo, out_lo, span, out_features, feature, output, order
):  # pragma: no cover - runs compiled
    pes = len(nz_ptr) - 1
    wrap = max(out_features, 1)
    counts = np.zeros(wrap + 1, np.int64)
    for p in range(pes):
        n0, e0, e1 = nz_ptr[p], col_off[p], col_off[p + 1]
        for e in range(e0, e1 - 1):  # every entry but a PE's last opens a column
            for j in range(n0 + col_ptr[e], n0 + col_ptr[e + 1]):
                feature[j] = in_lo[p] + e - e0
        for j in range(n0, nz_ptr[p + 1]):
            r = row_idx[j]
            if r < 0 or r >= span[p]:
                return p
            output[j] = (out_lo[p] + r) % wrap
            counts[output[j] + 1] += 1
    for o in range(wrap):
        counts[o + 1] += counts[o]
    for j in range(len(output)):  # stable: PE by PE, input order within a PE, for each output
        order[counts[output[j]]] = j
        counts[output[j]] += 1
    return -1


def _range_max_loop(table, lo, hi, out):  # pragma: no cover - runs compiled
    n, blocks = table.shape
    level = np.empty(len(lo), np.int64)
    for r in range(len(lo)):
        level[r] = _bits(hi[r] - lo[r] + 2) - 1  # floor(log2(length))
    top = level.max()
    by_level = np.argsort(level, kind="mergesort")
    r = 0
    for j in range(top + 1):
        if j:  # in place, rows ascending: row i + half still holds the level below
            half = 1 << (j - 1)
            for i in range(n - (1 << j) + 1):
                for q in range(blocks):
                    table[i, q] = max(table[i, q], table[i + half, q])
        while r < len(lo) and level[by_level[r]] == j:
            k = by_level[r]
            for q in range(blocks):
                out[k, q] = max(table[lo[k], q], table[hi[k] - (1 << j) + 1, q])
            r += 1


def _stab_loop(a, b, value, best, largest):  # pragma: no cover - runs compiled
    level, order, direct = _stab_plan(a, b, best.shape[0])
    _stab_marks(a, b, level, order, direct, value, best, largest)


def _stab_plan(a, b, n):  # pragma: no cover - runs compiled
    """How ``_stab_marks`` takes ranges ``a[i] .. b[i] - 1`` of ``n`` indices, whatever the values: each
    range's level (floor(log2(length))), the ranges by level, and whether they are short enough to
    mark their indices directly (the sparse table's levels cost more there)."""
    ranges = len(a)
    covered = 0
    level = np.empty(ranges, np.int64)
    for i in range(ranges):
        covered += b[i] - a[i]
        level[i] = _bits(b[i] - a[i] + 1) - 1
    return level, np.argsort(level, kind="mergesort"), covered <= 2 * ranges + n


def _stab_marks(a, b, level, order, direct, value, best, largest):  # pragma: no cover - runs compiled
    n, blocks = best.shape
    ranges = len(a)
    if direct:
        for i in range(ranges):
            for at in range(a[i], b[i]):
                for q in range(blocks):
                    v = value[i, q]
                    if (v > best[at, q]) if largest else (v < best[at, q]):
                        best[at, q] = v
        return
    # every range is two runs of 2^j indices (j = floor(log2(length))); from the longest level down,
    # a level's runs take the marks of the ranges of that level, then pass them to the halves below
    empty = best[0, 0]  # ``best`` comes filled with ``empty``
    cur, below = best.copy(), np.empty_like(best)  # a level and the one below, swapped as they go
    r = ranges - 1
    for j in range(level.max(), -1, -1):
        while r >= 0 and level[order[r]] == j:
            i = order[r]
            for at in (a[i], b[i] - (1 << j)):
                for q in range(blocks):
                    v = value[i, q]
                    if (v > cur[at, q]) if largest else (v < cur[at, q]):
                        cur[at, q] = v
            r -= 1
        if j == 0:
            break
        half = 1 << (j - 1)
        below[:, :] = empty
        for at in range(n):
            for q in range(blocks):
                v = cur[at, q]
                if (v > below[at, q]) if largest else (v < below[at, q]):
                    below[at, q] = v
                if at + half < n and ((v > below[at + half, q]) if largest else (v < below[at + half, q])):
                    below[at + half, q] = v
        cur, below = below, cur
    best[:, :] = cur


_CHUNK_BLOCKS = 8  # blocks a loop takes at a time: a cache line of each row, the rest in cache


def _reach_loop(finish, at, t0, y, a, b, segments, segment, span, out):  # pragma: no cover
    blocks, keys = out.shape
    level, order, direct = _stab_plan(a, b, segments)
    for q0 in range(0, blocks, _CHUNK_BLOCKS):
        m = min(_CHUNK_BLOCKS, blocks - q0)
        value = np.empty((len(at), 2 * m), np.int64)  # each interval's finish - y, then finish + y
        for i in range(len(at)):
            for c in range(m):
                done = t0 if at[i] < 0 else finish[at[i], q0 + c]
                value[i, c] = done - y[i]
                value[i, m + c] = done + y[i]
        both = np.full((segments, 2 * m), -(1 << 62), np.int64)
        _stab_marks(a, b, level, order, direct, value, both, True)
        for c in range(m):
            for k in range(keys):
                s = segment[k]
                out[q0 + c, k] = max(both[s, c] + span[k], both[s, m + c] - span[k])


def _slowest_loop(finish, order, y, height, lo, hi, out):  # pragma: no cover - runs compiled
    blocks = finish.shape[1]
    table = np.empty((len(order), blocks), np.int64)  # rows of every block side by side: one SIMD pass
    for i in range(len(order)):
        for q in range(blocks):
            table[i, q] = finish[order[i], q] * height + y[i]
    _range_max_loop(table, lo, hi, out)


def _column_sums_loop(
    arrive, slowest, x, o, seg, lane, moving, rank, lead, edge, ahead, idle, wave, h, latest, ready, q0
):  # pragma: no cover - runs compiled
    blocks, pairs = arrive.shape
    width = len(latest)
    never = np.int64(1) << 62
    first_done = np.empty(width, np.int64)
    count = np.zeros(width * h * 2, np.int64)  # sums before, per (column, slowest row, side)
    touched = np.empty(pairs, np.int64)
    for j in range(blocks):
        q = q0 + j
        w = wave[q]
        first_done[:] = never
        for i in range(pairs):  # the first sum that can travel on each column's bus
            if moving[i]:
                first_done[x[i]] = min(first_done[x[i]], arrive[j, i] - (lead[i] - edge[i]))
        for c in range(width):  # the bus starts once done with the block before
            latest[c] = max(latest[c], min(first_done[c], idle[c, q]) - ahead[c, q])
        used = 0
        for i in range(pairs):
            if not moving[i]:  # the sum leaves from where it is
                ready[q, o[i]] = max(ready[q, o[i]], arrive[j, i] + edge[i])
                continue
            row = slowest[j, seg[i]] % h
            earlier = 0
            if lane[i] != row:  # sums leaving one row queue on the side of it their lane is on
                key = (x[i] * h + row) * 2 + (1 if lane[i] > row else 0)
                earlier = count[key]
                if earlier == 0:
                    touched[used] = key
                    used += 1
                count[key] = earlier + 1
            on_bus = ahead[x[i], q] + latest[x[i]] + rank[i] * w + lead[i]
            ready[q, o[i]] = max(ready[q, o[i]], on_bus, earlier * w + arrive[j, i] + edge[i])
        for u in range(used):
            count[touched[u]] = 0


def _last_in_loop(heads, sends, ends, lo, rate, bins, last):  # pragma: no cover - runs compiled
    n, outputs = len(heads), len(ends)
    wave = np.zeros(bins, np.int64)
    top = np.zeros(bins, np.int64)
    first = np.full(bins, n, np.int64)  # n: an empty bin
    which = 0
    for i in range(n):
        while i >= ends[which]:
            which += 1
        k = (heads[i] - lo) * outputs + which
        wave[k] += sends[i]
        if sends[i] > top[k]:
            top[k] = sends[i]
        if first[k] == n:
            first[k] = i
    upto = 0
    run = -np.inf
    for k in range(bins):
        if first[k] == n:
            continue
        upto += wave[k]
        u = np.float64(upto)
        w0 = np.float64(sends[first[k]])
        before = (u - np.float64(wave[k]) + w0) / rate - w0 / rate
        head = k // outputs + lo
        run = max(run, np.float64(head) - before)
        done = max(np.int64(np.ceil(u / rate + run - 1e-9)), head + top[k])
        o = k % outputs
        if done > last[o]:
            last[o] = done


def _gaps_loop(nz_ptr, col_off, col_ptr, row, span, out):  # pragma: no cover - runs compiled
    for p in range(len(nz_ptr) - 1):
        base, first, s, before = nz_ptr[p], col_off[p], span[p], -1
        for j in range(col_off[p + 1] - first - 1):
            for i in range(base + col_ptr[first + j], base + col_ptr[first + j + 1]):
                r = row[i]
                if r < 0 or r >= s or j * s + r <= before:
                    return False
                out[i] = j * s + r - before - 1
                before = j * s + r
    return True
