"""Interval helpers of the fast clock: range maxima, stabbing queries, held (column, output) pairs.

The clock's column reduction asks, for many ranges of rows at once, which row finishes last, and which
rows hold a part of each output; these answer such questions with sparse tables and sorts, without a
Python loop per range, PE or output.

    >>> range_max_1d(torch.tensor([[3], [9], [4], [7]]), torch.tensor([0, 2]), torch.tensor([1, 3])).tolist()
    [[9], [7]]
"""

from __future__ import annotations

import torch

from . import compiled
from .blocking import lane_rank
from .layout import Layout
from .program import lane_bounds
from .queues import CHUNK, NEVER


def busiest_link(bus: torch.Tensor, lane: torch.Tensor, far: torch.Tensor, height: int) -> torch.Tensor:
    """For messages forking ``far`` rows from ``lane`` on ``bus`` (column * 2, + 1 going south), the
    busiest link each crosses, as a queue id ``bus * height + row`` (the row the link leaves): the
    messages crossing a link pass it one at a time, the busiest link's queue stands for the route's."""
    south = bus % 2 == 1
    lo = torch.where(south, lane, lane - far + 1)
    hi = torch.where(south, lane + far - 1, lane)
    used, at = torch.unique(bus, return_inverse=True)  # only the buses some message takes
    if compiled.available(bus, lane, far):
        return bus * height + compiled.busiest_rows(at, lo, hi, len(used), height)
    load = torch.zeros((height + 1, len(used)), dtype=torch.int64)
    load.index_put_((lo, at), torch.ones_like(lo), accumulate=True)
    load.index_put_((hi + 1, at), -torch.ones_like(lo), accumulate=True)
    grid = torch.cumsum(load, 0)[:height, :, None]
    return bus * height + range_max(grid, at, lo, hi)[:, 0] % height


class Columns:
    """A region's active PEs (region-local ids, ascending) by column: each column's rows, for the
    largest and least finish over a column's rows without a ``[height, width, blocks]`` grid."""

    def __init__(self, active: torch.Tensor, width: int, height: int) -> None:
        x, y = active % width, active // width
        key = x * height + y
        self.order = torch.argsort(key)  # active PEs column by column, rows ascending
        self.key, self.y, self.x = key[self.order], y[self.order], x
        self.height, self.width = height, width
        self.full = torch.bincount(x, minlength=width) == height  # columns with no idle PE

    def slowest(
        self, finish: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, t0: int
    ) -> torch.Tensor:
        """``[ranges, blocks]``: the largest finish over rows ``lo..hi`` of column ``x``, encoded ``value
        * height + row`` (ties: the last row); an idle PE finishes at ``t0``, before any active one."""
        h = self.height
        first = torch.searchsorted(self.key, x * h + lo)
        end = torch.searchsorted(self.key, x * h + hi, right=True)
        out = (t0 * h + hi)[:, None].expand(-1, finish.shape[1]).clone()  # ranges of idle PEs only
        some = end > first
        if bool(some.any()):
            lo, hi = first[some], end[some] - 1
            if compiled.available(finish):
                out[some] = compiled.slowest_rows(finish, self.order, self.y, h, lo, hi)
            else:
                out[some] = range_max_1d(finish[self.order] * h + self.y[:, None], lo, hi)
        return out

    def first(self, finish: torch.Tensor, t0: int) -> torch.Tensor:
        """``[width, blocks]``: the least finish in each column (``t0`` where a PE of it is idle)."""
        least = torch.full((self.width, finish.shape[1]), t0, dtype=torch.int64)
        index = self.x[:, None].expand_as(finish)
        in_full = torch.full_like(least, NEVER).scatter_reduce_(0, index, finish, "amin")
        return torch.where(self.full[:, None], in_full, least)


def range_max_1d(values: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``[ranges, blocks]``: the largest of rows ``lo..hi`` (inclusive, non-empty) of ``values`` ``[n,
    blocks]``. A sparse table built a level at a time up to what the longest range needs, each level
    answering its ranges before the next replaces it (no loop per range); blocks go a few at a time,
    so that a level holds at most about ``CHUNK * 4`` entries."""
    if compiled.available(values, lo, hi):
        return compiled.range_max_1d(values, lo, hi)
    n, blocks = values.shape
    step = max(1, CHUNK * 4 // max(1, n))
    if blocks > step:
        return torch.cat([range_max_1d(values[:, q : q + step], lo, hi) for q in range(0, blocks, step)], 1)
    level = torch.floor(torch.log2((hi - lo + 1).clamp(min=1).to(torch.float64))).to(torch.int64)
    out = torch.empty((len(lo), blocks), dtype=torch.int64)
    table = values  # level j, row i: the largest of rows i .. i + 2^j - 1
    for j in range(int(level.max()) + 1 if len(lo) else 0):
        if j:
            table = torch.maximum(table[: -(1 << (j - 1))], table[1 << (j - 1) :])
        m = level == j
        if bool(m.any()):
            out[m] = torch.maximum(table[lo[m]], table[hi[m] - (1 << j) + 1])
    return out


def range_max(grid: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``[ranges, blocks]``: over rows ``lo..hi`` of column ``x`` of ``grid`` ``[height, width, blocks]``,
    the largest value, encoded ``value * height + row`` (ties: the last row)."""
    height, width, blocks = grid.shape
    encoded = (grid * height + torch.arange(height)[:, None, None]).permute(1, 0, 2)
    return range_max_1d(encoded.reshape(width * height, blocks), x * height + lo, x * height + hi)


def cumcount(key: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``[rows, n]``: the total ``weight`` (``[n]``) of the earlier entries of each row that hold the same
    key. Runs of equal keys are found first, and only the runs are sorted by key.

    >>> cumcount(torch.tensor([[3, 3, 5, 3, 5], [1, 1, 1, 2, 1]]), torch.tensor([1, 1, 1, 1, 2])).tolist()
    [[0, 1, 0, 2, 1], [0, 1, 2, 0, 3]]
    """
    rows, n = key.shape
    if key.numel() == 0:
        return torch.zeros_like(key)
    lo, hi = torch.aminmax(key)
    span = int(hi) - int(lo) + 1
    flat = (key - lo + torch.arange(rows)[:, None] * span).reshape(-1)  # keys never repeat across rows
    change = torch.ones_like(flat, dtype=torch.bool)
    change[1:] = flat[1:] != flat[:-1]
    starts = change.nonzero().squeeze(1)  # each run of equal keys
    weights = weight.repeat(rows)
    upto = torch.cumsum(weights, 0)
    ahead = upto - weights  # weight before each entry, over all rows
    ends = torch.cat([starts[1:], torch.tensor([len(flat)])]) - 1
    totals = upto[ends] - ahead[starts]  # each run's weight
    run_key = flat[starts]
    order = torch.sort(run_key, stable=True).indices
    ordered = totals[order]
    before = torch.cumsum(ordered, 0) - ordered
    new_key = torch.ones_like(order, dtype=torch.bool)
    new_key[1:] = run_key[order][1:] != run_key[order][:-1]
    key_start = torch.cummax(torch.where(new_key, torch.arange(len(order)), 0), 0).values
    earlier = torch.empty_like(before)
    earlier[order] = before - before[key_start]  # weight of the same key in earlier runs
    run = torch.cumsum(change, 0) - 1
    return ((earlier - ahead[starts])[run] + ahead).reshape(rows, n)


class Holders:
    """Which rows of each column hold a part of each output of a sparse matmul's region (``cover``),
    and the largest of a per-PE value over each (column, output) pair's holding rows (``most``).

    Each PE's cyclic output range is one or two intervals of keys ``column * out_features + output``.
    Their ends cut the keys into segments that every interval covers whole or not at all, so the rows
    are found per segment (``stab``) and only the held segments are spread out to keys: the work follows
    the PEs and the held pairs, never the outputs times the PEs that hold them."""

    def __init__(self, s: Layout, width: int, height: int) -> None:
        out_f = s.out_features
        span = s.span.clamp(max=out_f)
        pe = (span > 0).nonzero().squeeze(1)
        none = torch.zeros(0, dtype=torch.int64)
        self.keys, self.ymin, self.ymax, self.segment = none, none, none, none
        self.a, self.b, self.pe, self.segments = none, none, none, 0
        if len(pe) == 0:
            return
        lo = s.out_lo[pe].to(torch.int64) % out_f
        hi = lo + span[pe]
        base = pe % width * out_f
        wrap = hi > out_f  # the part past the last output starts again at output 0
        starts = torch.cat([base + lo, base[wrap]])
        ends = torch.cat([base + hi.clamp(max=out_f), base[wrap] + hi[wrap] - out_f])
        self.pe = torch.cat([pe, pe[wrap]])  # each interval's PE
        rows = self.pe // width
        cuts = torch.unique(torch.cat([starts, ends]))
        self.a, self.b = torch.searchsorted(cuts, starts), torch.searchsorted(cuts, ends)  # segments [a, b)
        self.segments = len(cuts) - 1
        first = stab(self.a, self.b, rows, self.segments, height, "amin")
        last = stab(self.a, self.b, rows, self.segments, -1, "amax")
        held = (last >= 0).nonzero().squeeze(1)
        length = cuts[held + 1] - cuts[held]
        total = int(length.sum())
        offset = torch.repeat_interleave(torch.cumsum(length, 0) - length, length, output_size=total)
        keys = torch.repeat_interleave(cuts[held], length, output_size=total)
        self.keys = keys + torch.arange(total) - offset
        self.segment = torch.repeat_interleave(held, length, output_size=total)  # each key's segment
        self.ymin, self.ymax = first[self.segment], last[self.segment]

    def reach(
        self, finish: torch.Tensor, active: torch.Tensor, t0: int, lane: torch.Tensor, hop: int, width: int
    ) -> torch.Tensor:
        """``[blocks, pairs]``: when each held pair's sum reaches its lane with nothing in its way, the
        latest over its holding rows ``y`` of ``finish + |y - lane| * hop``. ``finish[i, q]``: when PE
        ``active[i]`` is done with block ``q`` (any other PE at ``t0``); ``lane[i]``: pair ``i``'s lane.

        ``|y - lane|`` is the larger of ``y - lane`` and ``lane - y``, so the latest is the larger of
        ``max(finish - y) + lane`` and ``max(finish + y) - lane``: two maxima over the holders, found
        per segment, whatever the lane."""
        blocks = finish.shape[1]
        if not len(self.keys):
            return torch.zeros((blocks, 0), dtype=torch.int64)
        y = self.pe // width * hop
        if len(active):
            at = torch.searchsorted(active, self.pe).clamp_(max=len(active) - 1)
            at = torch.where(active[at] == self.pe, at, -1)  # -1: an idle PE, done at t0
        else:
            at = torch.full((len(self.pe),), -1, dtype=torch.int64)
        if compiled.available(finish, lane):
            return compiled.reach(finish, at, t0, y, self.a, self.b, self.segments, self.segment, lane * hop)
        if len(active):
            done = torch.where((at >= 0)[:, None], finish[at.clamp(min=0)], t0)
        else:
            done = torch.full((len(self.pe), blocks), t0, dtype=torch.int64)
        y = y[:, None]
        both = stab(self.a, self.b, torch.cat([done - y, done + y], 1), self.segments, -NEVER, "amax")
        both = both[self.segment]
        span = (lane * hop)[:, None]
        return torch.maximum(both[:, :blocks] + span, both[:, blocks:] - span).T


def column_load(
    s: Layout, width: int, height: int, lanes: int, held: Holders | None = None
) -> tuple[torch.Tensor, ...]:
    """Partial-sum messages on each vertical link of a sparse matmul's region, ``[width, height]`` south
    and north, and the (column, output) pairs where some PE holds a part of the output, with the rows
    each pair's partial sums travel to reach the output's lane (0: none travel) and the first and last
    row holding a part of it. ``lanes``: how many lanes the outputs are spread over; ``held``: the
    region's ``Holders`` when the caller has them.

    Partial sums of one output merge on their way to its lane, so a link carries each output once: the
    south link below row ``y`` carries the outputs held at or above ``y`` whose lane is further south.

        >>> from sparsefx.runtime.layout import Layout
        >>> one = torch.tensor([0, 0, 0])  # 1 column, 3 rows, each holding output 0 (lane 0)
        >>> s = Layout(1, 1, one, one + 1, one, one + 1, one + 1)
        >>> south, north, *_ = column_load(s, 1, 3, 1)
        >>> south.tolist(), north.tolist()  # rows 1 and 2 send theirs north, up to row 0
        ([[0, 0, 0]], [[1, 1, 0]])
    """
    out_f = s.out_features
    held = held or Holders(s, width, height)
    keys, ymin, ymax = held.keys, held.ymin, held.ymax
    px, o = keys // max(out_f, 1), keys % max(out_f, 1)
    lane = lane_rank(lane_bounds(out_f, lanes), o)[0]
    south = torch.zeros((width, height + 1), dtype=torch.int64)
    north = torch.zeros((width, height + 2), dtype=torch.int64)
    sm = ymin < lane
    ones = torch.ones(int(sm.sum()), dtype=torch.int64)
    south.index_put_((px[sm], ymin[sm]), ones, accumulate=True)
    south.index_put_((px[sm], lane[sm]), -ones, accumulate=True)
    nm = ymax > lane
    ones = torch.ones(int(nm.sum()), dtype=torch.int64)
    north.index_put_((px[nm], lane[nm] + 1), ones, accumulate=True)
    north.index_put_((px[nm], ymax[nm] + 1), -ones, accumulate=True)
    travel = torch.maximum(lane - ymin, ymax - lane).clamp(min=0)
    return south.cumsum(1)[:, :height], north.cumsum(1)[:, 1 : height + 1], px, o, travel, ymin, ymax


def cover(s: Layout, width: int, height: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each (column, output) pair some PE holds a part of, as ascending keys ``column * out_features +
    output``, with the first and last row holding one (``Holders``)."""
    held = Holders(s, width, height)
    return held.keys, held.ymin, held.ymax


def stab(a: torch.Tensor, b: torch.Tensor, value: torch.Tensor, n: int, empty: int, how: str) -> torch.Tensor:
    """``[n]``: the least (``how="amin"``) or largest (``"amax"``) ``value[i]`` of the ranges ``a[i] ..
    b[i] - 1`` (non-empty) that hold each index, ``empty`` where none does (``[n, blocks]`` for a
    ``value`` of ``[ranges, blocks]``: each column on its own). Each range is two blocks of a
    power-of-two length ``2^j``, as in a sparse table; a level's blocks then pass their value to the
    two halves below, from the longest level down, so the work is the indices times the levels."""
    if compiled.available(a, b, value):
        flat = value.reshape(len(value), -1).to(torch.int64)
        return compiled.stab(a, b, flat, n, empty, how == "amax").reshape(n, *value.shape[1:])
    level = torch.floor(torch.log2((b - a).to(torch.float64))).to(torch.int64)
    top = int(level.max()) if len(level) else 0
    pick = torch.minimum if how == "amin" else torch.maximum
    shape = (n, *value.shape[1:])  # a value per range, or a row of them (``[ranges, blocks]``)
    best = torch.full(shape, empty, dtype=torch.int64)
    for j in range(top, -1, -1):
        here = torch.full(shape, empty, dtype=torch.int64)
        m = level == j
        if bool(m.any()):
            at = torch.cat([a[m], b[m] - (1 << j)])
            v = value[m].repeat(2, *([1] * (value.dim() - 1)))
            here.scatter_reduce_(0, at.reshape(-1, *([1] * (value.dim() - 1))).expand_as(v), v, how)
        if j < top:  # a block 2^(j+1) long at i covers the blocks 2^j long at i and at i + 2^j
            here = pick(here, best)
            half = 1 << j
            here[half:] = pick(here[half:], best[:-half])
        best = here
    return best


def lane_merges(s: Layout, width: int, height: int, lanes: int, held: Holders | None = None) -> torch.Tensor:
    """``merges`` of a region whose outputs are spread over ``lanes`` lanes (``lane_bounds``), as a
    sparse matmul's are."""
    lane = lane_rank(lane_bounds(s.out_features, lanes), torch.arange(s.out_features))[0]
    return merges(s, width, height, lane, held)


def merges(
    s: Layout, width: int, height: int, lanes: torch.Tensor, held: Holders | None = None
) -> torch.Tensor:
    """``[width * height]``: the partial-sum adds each PE of a sparse matmul's region does per block.

    ``lanes[o]`` is output ``o``'s lane (a row of the region). A column's parts of an output travel to
    its lane and merge on the way: each holding row a part passes adds it in, and the lane's PE adds
    what meets there (its own part and one sum from each side, or the two sides' sums); then each
    column east of the output's first adds the sum arriving from the west. The reference executor
    plays the same adds message by message (``ReferenceMachine._reduce``). ``held``: the region's
    ``Holders`` when the caller has them.

        >>> from sparsefx.runtime.layout import Layout
        >>> one = torch.tensor([0, 0, 0])  # 1 column, 3 rows, each holding output 0 (lane 1)
        >>> s = Layout(1, 1, one, one + 1, one, one + 1, one + 1)
        >>> merges(s, 1, 3, torch.tensor([1])).tolist()  # both sides' sums meet the lane's own part
        [0, 2, 0]
    """
    out_f = s.out_features
    adds = torch.zeros(width * height, dtype=torch.int64)
    held = held or Holders(s, width, height)
    keys, ymin, ymax = held.keys, held.ymin, held.ymax
    if len(keys) == 0:
        return adds
    # A part passing on its way to the lane adds itself in at every holding row but the ends (the first
    # row below the lane, the last above it) and the lane's own: each PE counts the outputs it holds,
    # less those it is an end or the lane of, counted per (column, output) pair, never per PE and output.
    span = s.span.clamp(max=out_f).to(torch.int64)
    adds += span
    column, output = keys // out_f, keys % out_f
    lane_k = lanes[output]
    at = lane_k * width + column  # the lane's PE of each pair, in the column
    offset = (output - s.out_lo.to(torch.int64)[at]) % out_f
    held_at_lane = offset < span[at]
    adds.index_add_(0, ymin * width + column, -(ymin < lane_k).to(torch.int64))
    adds.index_add_(0, ymax * width + column, -(ymax > lane_k).to(torch.int64))
    meet = (ymin < lane_k).to(torch.int64) + (ymax > lane_k).to(torch.int64)
    adds.index_add_(0, at, torch.where(held_at_lane, meet - 1, 0))
    sides = ~held_at_lane & (ymin < lane_k) & (ymax > lane_k)  # the two sides meet at a PE holding none
    west = torch.full((out_f,), width, dtype=torch.int64).scatter_reduce(0, output, column, "amin")
    east = column > west[output]  # a sum from the west adds in
    adds.index_add_(0, lane_k * width + column, sides.to(torch.int64) + east.to(torch.int64))
    return adds
