"""The fast executor's clock: the cost rules of ``runtime/cost.py``, vectorized over PEs and messages.

``simulate(program, activity)`` times every kernel of a program, in program order, from the flows of
its inputs: when each block of each input leaves its producer. A kernel's messages become one tensor
of ``(PE, arrival, cost)``; ``runtime/queues.py`` runs each PE's tasks in arrival order without a
Python loop per PE, nonzero or wavelet. ``activity[value]`` says which elements of each value are
nonzero: a message whose values are all zero is not sent (``Flow.live``: no wavelets, no link time, no
task on a sparse matmul; a reader learns that its block is complete from the lane's end-of-block mark).
Without it every message is sent. What it returns is a ``runtime/timeline.py`` ``Timeline``.

Cross-route link sharing is not queued here: a route's own messages are serialized on its lanes,
and the hottest links are reported from the traffic. The reference executor queues every link.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from sparsefx.trees import to_device

from .cost import (
    ZERO_SKIPPING,
    axpy_cycles,
    block_rows,
    features_of,
    idle_tasks,
    load_cycles,
    ops_per_element,
    row_streaming_op,
    rows_of,
    task_cycles,
    wavelets,
)
from .layout import Layout, layout, weight_bytes
from .memo import kept_for
from .program import Kernel, ProgramData, lane_bounds
from .queues import CHUNK, fifo, queues
from .timeline import REDUCING_STATS, Flow, KernelTime, Timeline, digest

__all__ = ["simulate", "time_alone", "kernel_alone", "REUSE"]

REUSE = True
"""Whether a kernel met again in the same situation (``_Clock.situation``) takes its earlier timing.
Tests switch it off to check that the reused timings are the ones the clock computes."""

SITUATIONS = 8
"""Timings kept per kernel structure: those of the most recently met situations (a program and its
dense baseline share them for kernels of the same geometry)."""

_NAMES = ("param", "dense")  # attributes that name things (the weight; the baseline's plan), not timing

_NEVER = 1 << 62  # later than any cycle


def _host_flow(
    program: ProgramData, name: str, shape: tuple[int, ...], dtype: str, live: torch.Tensor | None
) -> Flow:
    hw = program.hardware
    f = features_of(shape)
    lanes = max(1, min(program.mesh.height, f))
    rows = rows_of(shape)
    stretch = max(1.0, lanes / hw.host_wavelets_per_cycle)  # the host link is narrower than the lanes
    wave = math.ceil(wavelets(rows, dtype, hw) * stretch)
    ready = torch.zeros((1, f), dtype=torch.int64)
    flow = Flow(name, dtype, f, lanes, rows, rows, torch.tensor([wave]), -1, ready)
    flow.live = _fits(live, flow)
    return flow


def _sizes(rows: int, b: int) -> torch.Tensor:
    """Rows of each block when ``rows`` go ``b`` at a time (the last block takes the rest)."""
    rows = max(rows, 1)
    sizes = torch.full((math.ceil(rows / b),), b, dtype=torch.int64)
    sizes[-1] = rows - b * (len(sizes) - 1)
    return sizes


def _per_block(fn: Callable[[int], int], sizes: torch.Tensor) -> torch.Tensor:
    """``fn(rows)`` of each block, as an int64 tensor."""
    return torch.tensor([fn(int(n)) for n in sizes.tolist()], dtype=torch.int64)


def _lane_rank(bounds: torch.Tensor, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each feature's lane and its place in the lane's message order."""
    lane = torch.searchsorted(bounds, feats, right=True) - 1
    return lane, feats - bounds[lane]


def _lanes(kernel: Kernel, features: int) -> int:
    given = kernel.attrs.get("lanes", kernel.region.height)
    return max(1, min(int(given), features, kernel.region.height))


class _Clock:
    def __init__(
        self,
        program: ProgramData,
        activity: Mapping[str, torch.Tensor] | None,
        layouts: Mapping[str, Layout] | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.p = program
        self.device = device  # None: the CPU, outside any ``torch.device`` context
        self.layouts = layouts or {}
        self.hw = program.hardware
        self.activity = {n: a.to(device or "cpu") for n, a in (activity or {}).items()}
        self.flows: dict[str, Flow] = {
            s.name: _host_flow(program, s.name, s.shape, s.dtype, self.live(s.name, max(rows_of(s.shape), 1)))
            for s in program.inputs
        }
        self.streaming = program.mode == "streaming"
        self.prev_end = 0
        self.loader_free = 0
        self.prev_start = 0
        self.t0 = 0
        self.reuse = REUSE  # keep and reuse kernel timings (``situation``)

    def live(self, value: str, b: int) -> torch.Tensor | None:
        """``[blocks, features]``: which messages of ``value`` in blocks of ``b`` rows hold a nonzero
        (None: unknown, every message is sent)."""
        seen = self.activity.get(value)
        return None if seen is None or seen.dim() != 2 else _blocked(seen, b)

    def _kept(self, k: Kernel, key: tuple, build: Callable[[], Any]) -> Any:
        """``build()`` once per kernel structure, ``key`` and device: what depends on the program, not
        the inputs. Only timings depend on a row-wise kernel's rows: the rest is kept for any rows (the
        lowering times a long kernel's first blocks, ``kernel_alone``)."""
        if key[0] != "timings" and row_streaming_op(k):
            k = dataclasses.replace(k, shape=(features_of(k.shape),))
        if self.device is None:
            return kept_for(self.p, k, key, build)
        return kept_for(self.p, k, (*key, str(self.device)), lambda: to_device(build(), self.device))

    def _on_host(self, fn: Callable[[ProgramData, Kernel], Any], k: Kernel) -> Any:
        """``fn(program, k)`` where the program's arrays are (the CPU), whatever device the clock is on;
        ``_kept`` moves the result."""
        if self.device is None:
            return fn(self.p, k)
        with torch.device("cpu"):
            return fn(self.p, k)

    # -- arrivals -------------------------------------------------------------------------------------

    def _source_blocks(self, flow: Flow, kernel: Kernel, value: str, blocks: int, b: int) -> torch.Tensor:
        if row_streaming_op(kernel) and flow.rows == rows_of(kernel.shape) and blocks > 1:
            ends = torch.clamp(torch.arange(1, blocks + 1) * b, max=flow.rows) - 1
            return torch.clamp(ends // flow.block, max=flow.blocks - 1)
        return torch.full((blocks,), flow.blocks - 1, dtype=torch.int64)

    def _hops(self, flow: Flow, x: torch.Tensor) -> torch.Tensor:
        if flow.east < 0:
            return x + 1
        if self.streaming:
            return flow.east + x
        return (x - flow.east).clamp(min=1)

    def arrivals(
        self,
        value: str,
        kernel: Kernel,
        blocks: int,
        b: int,
        feats: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        key: tuple = (),
    ) -> torch.Tensor:
        """``[blocks, n]``: when feature ``feats[n]`` of each block reaches the PE at ``(x, y)``. ``key``
        names ``feats``, ``x`` and ``y`` among the kernel's structures (``_kept``)."""
        flow, hop = self.flows[value], self.hw.hop_cycles
        rise, forks, fork_at, k_at, pair, queue = self._kept(  # pair: the fork that queues for a message
            kernel, ("arrivals", flow.features, flow.lanes) + key, lambda: self._forks(flow, feats, x, y)
        )
        q = self._source_blocks(flow, kernel, value, blocks, b)
        depart = flow.depart(self.t0 if self.streaming else 0)
        sends = flow.sends[q]  # [blocks, all features]
        hops = (self._hops(flow, x) * hop)[None, :]
        head = depart[q][:, feats].add_(hops)  # at (x, lane row)
        if forks:  # up or down the column: queued on the busiest link the message crosses
            qs, q_at = torch.unique(q, return_inverse=True)
            first = torch.full((len(qs),), blocks, dtype=torch.int64).scatter_reduce(
                0, q_at, torch.arange(blocks), "amin"
            )  # a consumer block that reads each source block
            at_column = head[first[:, None], pair[None, :]]  # [source blocks, messages on a column]
            cost = flow.sends[qs][:, feats[pair]]  # a filtered message (0 wavelets) does not queue
            lanes_of = queue[None, :].expand_as(at_column)
            done = fifo(lanes_of.reshape(-1), at_column.reshape(-1), cost.reshape(-1))
            start = done.reshape(cost.shape) - cost
            head[:, fork_at] = start[q_at[:, None], k_at[None, :]]
        climb = (rise.abs() * hop)[None, :]
        arrived = head.add_(climb).add_(sends[:, feats])
        if flow.live is None:
            return arrived
        # a filtered message: its reader knows it is all zero when its lane's end-of-block mark arrives
        last = flow.last[feats]
        mark = depart[q][:, last].add_(hops).add_(climb).add_(sends[:, last])
        return torch.where(flow.live[q][:, feats], arrived, mark)

    def _forks(self, flow: Flow, feats: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple:
        """How messages reach their PEs, whatever their times: each PE's rows from the lane (``rise``);
        whether any fork up or down a column, which do (``fork_at``), one entry per message on a
        column and direction (``k_at``: each fork's message; a fork of each message), and the queue of
        the busiest link each message crosses."""
        lane, _ = _lane_rank(flow.bounds, feats)
        rise = y - lane
        at = (rise != 0).nonzero().squeeze(1)
        if len(at) == 0:
            return rise, False, at, at, at, at
        buses = 2 * self.p.mesh.width + 2
        bus = x[at] * 2 + (rise[at] > 0).to(torch.int64)  # a column and a direction
        keys, k_at = torch.unique(feats[at] * buses + bus, return_inverse=True)  # one message each
        pair = torch.zeros(len(keys), dtype=torch.int64).scatter_(0, k_at, torch.arange(len(k_at)))
        far = torch.zeros(len(keys), dtype=torch.int64).scatter_reduce(0, k_at, rise[at].abs(), "amax")
        queue = _busiest_link(keys % buses, lane[at][pair], far, buses, self.p.mesh.height)
        return rise, True, at, k_at, at[pair], queue

    # -- kernels --------------------------------------------------------------------------------------

    def time(self, k: Kernel) -> KernelTime:
        t0, load = self._begin(k)
        self.t0 = t0
        if self.reuse:  # kept relative to the kernel's start: the rules only add and compare times
            timings = self._kept(k, ("timings", *self.setting(k)), OrderedDict)
            key = self.situation(k, t0)
            if key in timings:
                timings.move_to_end(key)
            else:
                timings[key] = _moved(k, *self._time(k, t0), -t0, True)
                while len(timings) > SITUATIONS:  # a ReLU model meets a new zero pattern every run
                    timings.popitem(last=False)
            kt, flow = _moved(k, *timings[key], t0)
            mine = _fits(self.live(k.name, flow.block), flow)  # its own zeros, not the kept timing's
            if not _same(flow.live, mine):
                flow = dataclasses.replace(flow, live=mine, _departs={}, _shared={})
        else:
            kt, flow = self._time(k, t0)
        kt.load = load
        self.flows[k.name] = flow
        if self.streaming:
            self.prev_start, self.prev_end = kt.start, kt.end
            if load is not None and load[1] >= max(kt.start, 1) and kt.waits_on != "previous":
                kt.waits_on = "load"
        return kt

    def _time(self, k: Kernel, t0: int) -> tuple[KernelTime, Flow]:
        if k.op == "sparse_matmul":
            return self._sparse(k, t0)
        if k.op == "constant":
            return self._constant(k, t0)
        return self._dense(k, t0)

    def setting(self, k: Kernel) -> tuple:
        """What a kernel's timing depends on besides its structure (``_kept``) and inputs: its attributes
        (but the names among them), the hardware and the mode."""
        attrs = sorted((n, v) for n, v in k.attrs.items() if n not in _NAMES)
        return repr(attrs), repr(self.hw), self.streaming

    def situation(self, k: Kernel, t0: int) -> tuple:
        """What a kernel's timing depends on besides its structure and ``setting``, relative to its start
        ``t0``: how each input's messages leave their producer (when, counted from ``t0``, and how many
        wavelets) and, for a sparse matmul, which of its input vectors are sent. A program run again on
        inputs with the same zero pattern (a GELU model: none) meets every kernel in the situation of
        the first run. Tensors enter as 160-bit digests of their bytes."""
        parts: list[Any] = []
        for value in dict.fromkeys(k.inputs):
            f = self.flows[value]  # t0 is 0 outside streaming mode, as ``arrivals`` reads departures
            sent = f.waiting()[1] if f.waits(t0) else digest(f.depart(t0) - t0)
            live = None if f.live is None else digest(f.live)
            parts.append((f.east, f.features, f.lanes, f.rows, f.block, digest(f.wave), sent, live))
        seen = self._input_live(k)
        if seen is not None:
            parts.append(digest(_blocked(seen, block_rows(k))))
        own = self.live(k.name, block_rows(k))  # which of its tasks make only zeros (``idle_tasks``)
        if own is not None and k.op in ZERO_SKIPPING:
            parts.append(digest(own))
        return ("timed", *parts)

    def _input_live(self, k: Kernel) -> torch.Tensor | None:
        """``[rows, in_features]``: which input values of a sparse matmul (not a convolution, whose
        tasks read im2col columns) are nonzero; None for other kernels or when unknown."""
        if k.op != "sparse_matmul" or k.attrs.get("kind") not in ("linear", "addmm", "matmul"):
            return None
        seen = self.activity.get(k.inputs[0])
        return None if seen is None else seen.reshape(-1, int(k.attrs["in_features"]))

    def _begin(self, k: Kernel) -> tuple[int, tuple[int, int] | None]:
        if not self.streaming:
            return 0, None
        nbytes = weight_bytes(self.p, k)
        begin = max(self.loader_free, self.prev_start)
        done = begin + load_cycles(nbytes, self.hw)
        self.loader_free = done
        return max(self.prev_end, done), (begin, done)

    def _geometry(self, k: Kernel) -> tuple[torch.Tensor, torch.Tensor]:
        local = torch.arange(k.region.pes)
        return k.region.x + local % k.region.width, k.region.y + local // k.region.width

    def _waves(self, sizes: torch.Tensor, dtype: str) -> torch.Tensor:
        return _per_block(lambda n: wavelets(n, dtype, self.hw), sizes)

    def _out_flow(self, k: Kernel, ready: torch.Tensor, b: int, wave: torch.Tensor) -> Flow:
        """The result's flow: ``ready[q, f]`` when each message reaches the region's east edge."""
        f = features_of(k.shape)
        east = k.region.x + k.region.width - 1
        flow = Flow(k.name, k.dtype, f, _lanes(k, f), rows_of(k.shape), b, wave, east, ready)
        flow.live = _fits(self.live(k.name, b), flow)
        return flow

    def _blocks(self, k: Kernel) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        """Rows per block, blocks, each block's rows and each block's wavelets per message."""
        b = block_rows(k)
        sizes = _sizes(rows_of(k.shape), b)
        return b, len(sizes), sizes, self._waves(sizes, k.dtype)

    def _constant(self, k: Kernel, t0: int) -> tuple[KernelTime, Flow]:
        zeros = torch.zeros(k.region.pes, dtype=torch.int64)
        b, _, _, wave = self._blocks(k)
        ready = torch.full((len(wave), features_of(k.shape)), t0, dtype=torch.int64)
        flow = self._out_flow(k, ready, b, wave)
        return KernelTime(k.name, k.op, t0, self._end(flow), zeros, zeros.clone(), 1), flow

    def _end(self, flow: Flow) -> int:
        """When a kernel whose result is ``flow`` ends: its last message has left (streaming: is wholly at
        the region's edge, where it stays until a later step sends it). An empty result (a cat's empty
        cache) sends nothing and ends at the kernel's start, as in the reference executor."""
        if not flow.ready.numel():
            return self.t0
        if self.streaming:
            return max(flow.done, int((flow.ready + flow.sends).max()))  # its lanes pass one wavelet a cycle
        return flow.done

    def _waits(self, latest: dict[str, int], t0: int) -> str | None:
        if not latest:
            return "previous" if self.streaming and t0 > 0 else None
        name, when = max(latest.items(), key=lambda kv: kv[1])
        if self.streaming and t0 >= when:
            return "previous"
        return name

    def _sparse(self, k: Kernel, t0: int) -> tuple[KernelTime, Flow]:
        hw, r = self.hw, k.region
        s = self.layouts.get(k.name) or self._kept(k, ("layout",), lambda: self._on_host(layout, k))
        b, blocks, sizes, wave_out = self._blocks(k)
        pe, col, x, y = self._kept(k, ("pairs",), lambda: self._pairs(k, s))
        count = s.counts  # nonzeros of each (PE, column)
        value = k.inputs[0]
        kind = k.attrs.get("kind")
        conv = kind in ("conv1d", "conv2d")  # im2col columns exist once the whole image has arrived
        feats = torch.full_like(col, self.flows[value].features - 1) if conv else col
        arr = self.arrivals(value, k, blocks, b, feats, x, y, ("pairs", conv)).clamp_(min=t0)
        live = self._input_live(k)
        sent = None if live is None or conv else _blocked(live, b)[:, col]  # None: every message sent
        axpy = _per_block(lambda n: axpy_cycles(n, k.dtype, hw), sizes)
        has = count > 0
        work = has[None, :].expand(blocks, -1) if sent is None else sent & has[None, :]
        cost = torch.where(work, count[None, :] * axpy[:, None], 0)  # [blocks, pairs]; 0: no task
        # PEs without a pair are done with every block at t0: only the active ones are timed
        active, at = self._kept(k, ("active",), lambda: torch.unique_consecutive(pe, return_inverse=True))
        best, busy_active = queues(at, arr, cost, len(active))
        busy = torch.zeros(r.pes, dtype=torch.int64).index_put_((active,), busy_active)
        barrier = torch.full((blocks, len(active)), t0, dtype=torch.int64).scatter_reduce(
            1, at[None, :].expand_as(arr), arr, "amax"
        )  # a PE's block is done once every message of its columns has come
        finish = torch.maximum(best.reshape(len(active), blocks), barrier.T)
        finish = torch.cummax(finish, dim=1).values
        # a block in which no PE ran a task has only zero partial sums: none is sent (zero wavelets)
        summed = torch.where(work.any(1), wave_out, 0) if sent is not None else wave_out
        south, north, ready = self._reduce(k, s, finish, active, summed, t0)
        flow = self._out_flow(k, ready, b, wave_out)
        tasks = count * work.sum(0)  # AXPYs of each (PE, column) over the blocks
        overhead = torch.zeros(r.pes, dtype=torch.int64).index_add_(0, pe, tasks) * hw.task_start_cycles
        messages = blocks * len(col) if sent is None else int(sent.sum())
        axpys = int(tasks.sum())
        latest = {value: int(ready.max())} if ready.numel() else {}
        start = int(arr.masked_fill(~work, _NEVER).amin()) if axpys else int(ready.min())
        kt = KernelTime(
            k.name,
            k.op,
            start,
            self._end(flow),
            busy,
            overhead,
            blocks,
            messages=messages,
            skipped=blocks * len(col) - messages,
            axpys=axpys,
            skipped_axpys=blocks * int(count.sum()) - axpys,
            waits_on=self._waits(latest, t0),
            bus=(south * int(summed.sum()), north * int(summed.sum())),
        )
        return kt, flow

    def _heard(self, flow: Flow, k: Kernel, value: str, blocks: int, b: int) -> torch.Tensor:
        """``[blocks, features]``: whether any message of ``value`` that block ``q`` of ``k`` reads for a
        feature holds data (every one, when the zeros are unknown)."""
        if flow.live is None:
            return torch.ones((blocks, flow.features), dtype=torch.bool)
        rows = rows_of(k.shape)
        if not (row_streaming_op(k) and flow.rows == rows):  # it reads the whole value
            return flow.live.any(0, keepdim=True).expand(blocks, -1)
        lo = torch.arange(blocks) * b // flow.block
        hi = (torch.clamp(torch.arange(1, blocks + 1) * b, max=rows) - 1) // flow.block
        seen = torch.cat([torch.zeros((1, flow.features), dtype=torch.int64), torch.cumsum(flow.live, 0)])
        return (seen[hi + 1] - seen[lo]) > 0

    def _pairs(self, k: Kernel, s: Layout) -> tuple[torch.Tensor, ...]:
        """Each (PE, input column) pair of a sparse matmul: its PE, its column and the PE's place."""
        widths = s.in_hi - s.in_lo
        pe = torch.repeat_interleave(torch.arange(k.region.pes), widths)
        col = s.in_lo[pe] + (torch.arange(len(pe)) - (torch.cumsum(widths, 0) - widths)[pe])
        x, y = self._geometry(k)
        return pe, col, x[pe], y[pe]

    def _reduce(
        self,
        k: Kernel,
        s: Layout,
        finish: torch.Tensor,
        active: torch.Tensor,
        wave_out: torch.Tensor,
        t0: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Partial sums down and up each column, then east: the vertical links' loads and ``[blocks,
        features]`` when each output message reaches the region's east edge. ``finish[i, q]``: when
        PE ``active[i]`` is done with block ``q``; every other PE is done with each block at ``t0``."""
        hw, r = self.hw, k.region
        blocks, h = finish.shape[1], r.height
        lanes = _lanes(k, s.out_features)  # a convolution reduces its channels, not its features
        south, north, held_x, held_o, travel, segments, seg_of = self._kept(
            k, ("column_load", lanes), lambda: self._segments(k, s, lanes)
        )
        vload = torch.maximum(south.amax(1), north.amax(1))
        # A column's bus carries one block's partial sums after another, in output order: block q's
        # start once the column is done with q and the bus with q - 1, and its busiest link passes
        # one output per message time.
        per_block = vload[:, None] * wave_out[None, :]
        occupy = torch.cumsum(per_block, dim=1)  # [width, blocks]
        columns = self._kept(k, ("columns",), lambda: _Columns(active, r.width, h))
        moving = travel > 0
        # An output's sum waits at the slowest row holding a part of it; sums waiting at one row
        # leave it one message time apart. Pairs with the same column and rows share that row:
        # find it once per such segment, [blocks, segments].
        slowest = columns.slowest(finish, segments // (h * h), segments // h % h, segments % h, t0).T
        done_seg, group_seg = slowest // h, slowest % h + (segments // (h * h) * h)[None, :]
        # The bus starts with the first partial sum that can travel: the earliest segment of moving
        # pairs to be done (a column with none starts with its first PE done).
        first_done = in_column = columns.first(finish, t0)
        users = _users(held_x, moving, r.width)
        if bool(moving.any()):
            seg_x = segments // (h * h)
            go = torch.zeros(len(segments), dtype=torch.bool)
            go[seg_of[moving]] = True
            per_seg = done_seg[:, go].T  # [segments, blocks]
            index = seg_x[go][:, None].expand_as(per_seg)
            first_done = torch.full_like(first_done, _NEVER).scatter_reduce_(0, index, per_seg, "amin")
            first_done = first_done.minimum(torch.where(users[:, None] > 0, _NEVER, in_column))
        bus_start = occupy - per_block + torch.cummax(first_done - (occupy - per_block), 1).values
        before = torch.cumsum(moving.to(torch.int64), 0) - moving.to(torch.int64)
        first = torch.cumsum(users, 0) - users
        rank = (before - first[held_x]) * vload[held_x] // users[held_x].clamp(min=1)  # on the busiest link
        east = r.x + r.width - 1
        to_edge = (east - (r.x + torch.arange(r.width))) * hw.hop_cycles
        ready = torch.full((blocks, s.out_features), t0, dtype=torch.int64)
        still = ~moving
        if bool(still.any()):  # no partial sum travels: the sum leaves from where it is
            at = done_seg[:, seg_of[still]] + to_edge[held_x[still]][None, :]
            ready.scatter_reduce_(1, held_o[still][None, :].expand_as(at), at, "amax")
        if bool(moving.any()):
            seg_m, x_m, o_m = seg_of[moving], held_x[moving], held_o[moving]
            lead = travel[moving] * hw.hop_cycles + to_edge[x_m]
            # Consecutive pairs of one segment always share a row: work on runs of them, [blocks,
            # runs], and let each pair add its place in its run.
            new_run = torch.ones_like(seg_m, dtype=torch.bool)
            new_run[1:] = seg_m[1:] != seg_m[:-1]
            starts = new_run.nonzero().squeeze(1)
            run_of = torch.cumsum(new_run, 0) - 1
            within = torch.arange(len(seg_m)) - starts[run_of]
            run_seg = seg_m[starts]
            earlier = _cumcount(group_seg[:, run_seg], torch.diff(starts, append=torch.tensor([len(seg_m)])))
            bus_run, done_run = bus_start.T[:, x_m[starts]], done_seg[:, run_seg]
            rank_m, o_m = rank[moving], o_m[None, :]
            step = max(1, CHUNK // len(seg_m))  # blocks at a time: bounded scratch memory
            offsets: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            for q0, q1, w in _chunks(wave_out, step):  # blocks whose messages have the same wavelets
                if w not in offsets:  # on the bus after the pairs before; at the row after its run
                    offsets[w] = ((rank_m * w).add_(lead)[None, :], (within * w).add_(lead)[None, :])
                on_bus, at_row = offsets[w]
                at = torch.index_select(bus_run[q0:q1], 1, run_of).add_(on_bus)
                queued = torch.index_select(done_run[q0:q1] + earlier[q0:q1] * w, 1, run_of).add_(at_row)
                torch.maximum(at, queued, out=at)
                ready[q0:q1].scatter_reduce_(1, o_m.expand_as(at), at, "amax")
        # an output is ready once every column holding a part of it has sent it on
        if s.out_features != features_of(k.shape):  # a convolution's channels are not its features
            ready = ready.amax(1, keepdim=True).expand(-1, features_of(k.shape)).contiguous()
        return south, north, ready

    def _segments(self, k: Kernel, s: Layout, lanes: int) -> tuple[torch.Tensor, ...]:
        """``_column_load``, with the rows of each pair as one segment id ``(column * h + first) * h +
        last`` (the distinct ones, and each pair's)."""
        south, north, held_x, held_o, travel, y_lo, y_hi = self._column_load(k, s, lanes)
        h = k.region.height
        segments, seg_of = torch.unique((held_x * h + y_lo) * h + y_hi, return_inverse=True)
        return south, north, held_x, held_o, travel, segments, seg_of

    def _column_load(
        self, k: Kernel, s: Layout, lanes: int
    ) -> tuple[torch.Tensor, ...]:
        """Partial-sum messages on each vertical link, ``[width, height]`` south and north, and the
        (column, output) pairs where some PE holds a part of the output, with the rows each pair's
        partial sums travel to reach the output's lane (0: none travel) and the first and last row
        holding a part of it.

        Partial sums of one output merge on their way to its lane, so a link carries each output
        once: the south link below row ``y`` carries the outputs held at or above ``y`` whose lane is
        further south.
        """
        r = k.region
        out_f = s.out_features
        keys, ymin, ymax = _cover(s, r.width, r.height)
        px, o = keys // max(out_f, 1), keys % max(out_f, 1)
        lane = _lane_rank(lane_bounds(out_f, lanes), o)[0]
        south = torch.zeros((r.width, r.height + 1), dtype=torch.int64)
        north = torch.zeros((r.width, r.height + 2), dtype=torch.int64)
        sm = ymin < lane
        ones = torch.ones(int(sm.sum()), dtype=torch.int64)
        south.index_put_((px[sm], ymin[sm]), ones, accumulate=True)
        south.index_put_((px[sm], lane[sm]), -ones, accumulate=True)
        nm = ymax > lane
        ones = torch.ones(int(nm.sum()), dtype=torch.int64)
        north.index_put_((px[nm], lane[nm] + 1), ones, accumulate=True)
        north.index_put_((px[nm], ymax[nm] + 1), -ones, accumulate=True)
        travel = torch.maximum(lane - ymin, ymax - lane).clamp(min=0)
        return south.cumsum(1)[:, : r.height], north.cumsum(1)[:, 1 : r.height + 1], px, o, travel, ymin, ymax

    def _dense(self, k: Kernel, t0: int) -> tuple[KernelTime, Flow]:
        hw, r = self.hw, k.region
        b, blocks, sizes, wave = self._blocks(k)
        f = features_of(k.shape)
        lanes = _lanes(k, f)
        feats = torch.arange(f)
        lane, rank = _lane_rank(lane_bounds(f, lanes), feats)
        px = r.x + rank % r.width
        py = r.y + lane
        pe_local = lane * r.width + rank % r.width
        arr = torch.full((blocks, f), t0, dtype=torch.int64)
        latest: dict[str, int] = {}
        heard = torch.zeros((blocks, f), dtype=torch.bool)  # some input message of the task has data
        for value in dict.fromkeys(k.inputs):
            flow = self.flows[value]
            if flow.features == 0:  # an empty value (a cat's empty cache, say) sends no message
                continue
            fin = torch.clamp(feats * flow.features // max(f, 1), max=flow.features - 1)
            a = self.arrivals(value, k, blocks, b, fin, px, py, ("dense",))
            latest[value] = int(a.max())
            arr = torch.maximum(arr, a)
            heard |= self._heard(flow, k, value, blocks, b)[:, fin]
        ops = ops_per_element(self.p, k)
        cost = _per_block(lambda n: task_cycles(ops, n, k.dtype, hw), sizes)
        cost_b = cost[:, None].expand(blocks, f)
        idle = idle_tasks(k.op, heard, _sized(self.live(k.name, b), blocks, f))
        if idle is not None:
            cost_b = cost_b.masked_fill(idle, 0)
        pes_b = pe_local[None, :].expand(blocks, f)
        fin = fifo(pes_b.reshape(-1), arr.reshape(-1), cost_b.reshape(-1)).reshape(blocks, f)
        if idle is not None:
            fin = torch.where(idle, arr, fin)
        extra = 0
        if k.op in REDUCING_STATS and lanes > 1:
            extra = 2 * ((lanes - 1) * hw.hop_cycles + hw.task_start_cycles)
        east = r.x + r.width - 1
        done = fin.amax(dim=1, keepdim=True) + extra if extra else fin  # the all-reduce: a barrier
        flow = self._out_flow(k, done + ((east - px) * hw.hop_cycles)[None, :], b, wave)
        busy = torch.zeros(r.pes, dtype=torch.int64).index_add_(0, pes_b.reshape(-1), cost_b.reshape(-1))
        overhead = torch.zeros(r.pes, dtype=torch.int64).index_add_(
            0, pes_b.reshape(-1), (cost_b > 0).reshape(-1).to(torch.int64) * hw.task_start_cycles
        )
        kt = KernelTime(
            k.name,
            k.op,
            int(arr.min()),
            self._end(flow),
            busy,
            overhead,
            blocks,
            messages=blocks * f,
            waits_on=self._waits(latest, t0),
        )
        return kt, flow


def _moved(k: Kernel, kt: KernelTime, flow: Flow, dt: int, keep: bool = False) -> tuple[KernelTime, Flow]:
    """A timing and result flow moved ``dt`` cycles later, as new objects named for ``k``. A timing
    kept for reuse (``keep``) names the input it waits on by its place among the kernel's inputs, as
    another kernel of the same structure may take it."""
    inputs = list(dict.fromkeys(k.inputs))
    waits = kt.waits_on
    if isinstance(waits, int):
        waits = inputs[waits]
    elif keep and waits in inputs:
        waits = inputs.index(waits)
    moved = dataclasses.replace(kt, name=k.name, start=kt.start + dt, end=kt.end + dt, waits_on=waits)
    flow = dataclasses.replace(flow, value=k.name, ready=flow.ready + dt, _departs={}, _shared=flow._shared)
    return moved, flow


def _users(held_x: torch.Tensor, moving: torch.Tensor, width: int) -> torch.Tensor:
    """How many (column, output) pairs of each column send partial sums over its bus."""
    return torch.zeros(width, dtype=torch.int64).index_add_(0, held_x, moving.to(torch.int64))


def _busiest_link(
    bus: torch.Tensor, lane: torch.Tensor, far: torch.Tensor, buses: int, height: int
) -> torch.Tensor:
    """For messages forking ``far`` rows from ``lane`` on ``bus`` (column * 2, + 1 going south), the
    busiest link each crosses, as a queue id ``bus * height + row`` (the row the link leaves): the
    messages crossing a link pass it one at a time, the busiest link's queue stands for the route's."""
    south = bus % 2 == 1
    lo = torch.where(south, lane, lane - far + 1)
    hi = torch.where(south, lane + far - 1, lane)
    load = torch.zeros((height + 1, buses), dtype=torch.int64)
    load.index_put_((lo, bus), torch.ones_like(lo), accumulate=True)
    load.index_put_((hi + 1, bus), -torch.ones_like(lo), accumulate=True)
    grid = torch.cumsum(load, 0)[:height, :, None]
    return bus * height + _range_max(grid, bus, lo, hi)[:, 0] % height


class _Columns:
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
            encoded = finish[self.order] * h + self.y[:, None]
            out[some] = _range_max_1d(encoded, first[some], end[some] - 1)
        return out

    def first(self, finish: torch.Tensor, t0: int) -> torch.Tensor:
        """``[width, blocks]``: the least finish in each column (``t0`` where a PE of it is idle)."""
        least = torch.full((self.width, finish.shape[1]), t0, dtype=torch.int64)
        index = self.x[:, None].expand_as(finish)
        in_full = torch.full_like(least, _NEVER).scatter_reduce_(0, index, finish, "amin")
        return torch.where(self.full[:, None], in_full, least)


def _range_max_1d(values: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``[ranges, blocks]``: the largest of rows ``lo..hi`` (inclusive, non-empty) of ``values`` ``[n,
    blocks]``. A sparse table built a level at a time up to what the longest range needs, each level
    answering its ranges before the next replaces it (no loop per range); blocks go a few at a time,
    so that a level holds at most about ``CHUNK * 4`` entries."""
    n, blocks = values.shape
    step = max(1, CHUNK * 4 // max(1, n))
    if blocks > step:
        return torch.cat([_range_max_1d(values[:, q : q + step], lo, hi) for q in range(0, blocks, step)], 1)
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


def _range_max(grid: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``[ranges, blocks]``: over rows ``lo..hi`` of column ``x`` of ``grid`` ``[height, width, blocks]``,
    the largest value, encoded ``value * height + row`` (ties: the last row)."""
    height, width, blocks = grid.shape
    encoded = (grid * height + torch.arange(height)[:, None, None]).permute(1, 0, 2)
    return _range_max_1d(encoded.reshape(width * height, blocks), x * height + lo, x * height + hi)


def _cumcount(key: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``[rows, n]``: the total ``weight`` (``[n]``) of the earlier entries of each row that hold the same
    key. Runs of equal keys are found first, and only the runs are sorted by key.

    >>> _cumcount(torch.tensor([[3, 3, 5, 3, 5], [1, 1, 1, 2, 1]]), torch.tensor([1, 1, 1, 1, 2])).tolist()
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


def _cover(s: Layout, width: int, height: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each (column, output) pair some PE holds a part of, as ascending keys ``column * out_features +
    output``, with the first and last row holding one.

    Each PE's cyclic output range is one or two intervals of keys. Their ends cut the keys into
    segments that every interval covers whole or not at all, so the rows are found per segment
    (``_stab``) and only the held segments are spread out to keys: the work follows the PEs and the
    held pairs, never the outputs times the PEs that hold them."""
    out_f = s.out_features
    span = s.span.clamp(max=out_f)
    pe = (span > 0).nonzero().squeeze(1)
    if len(pe) == 0:
        none = torch.zeros(0, dtype=torch.int64)
        return none, none, none
    lo = s.out_lo[pe].to(torch.int64) % out_f
    hi = lo + span[pe]
    base = pe % width * out_f
    wrap = hi > out_f  # the part past the last output starts again at output 0
    starts = torch.cat([base + lo, base[wrap]])
    ends = torch.cat([base + hi.clamp(max=out_f), base[wrap] + hi[wrap] - out_f])
    rows = torch.cat([pe // width, (pe // width)[wrap]])
    cuts = torch.unique(torch.cat([starts, ends]))
    a, b = torch.searchsorted(cuts, starts), torch.searchsorted(cuts, ends)  # segments [a, b)
    segments = len(cuts) - 1
    first = _stab(a, b, rows, segments, height, "amin")
    last = _stab(a, b, rows, segments, -1, "amax")
    held = (last >= 0).nonzero().squeeze(1)
    length = cuts[held + 1] - cuts[held]
    total = int(length.sum())
    offset = torch.repeat_interleave(torch.cumsum(length, 0) - length, length, output_size=total)
    keys = torch.repeat_interleave(cuts[held], length, output_size=total) + torch.arange(total) - offset
    ymin = torch.repeat_interleave(first[held], length, output_size=total)
    ymax = torch.repeat_interleave(last[held], length, output_size=total)
    return keys, ymin, ymax


def _stab(
    a: torch.Tensor, b: torch.Tensor, value: torch.Tensor, n: int, empty: int, how: str
) -> torch.Tensor:
    """``[n]``: the least (``how="amin"``) or largest (``"amax"``) ``value[i]`` of the ranges ``a[i] ..
    b[i] - 1`` (non-empty) that hold each index, ``empty`` where none does. Each range is two blocks of a
    power-of-two length ``2^j``, as in a sparse table; a level's blocks then pass their value to the
    two halves below, from the longest level down, so the work is the indices times the levels."""
    level = torch.floor(torch.log2((b - a).to(torch.float64))).to(torch.int64)
    top = int(level.max()) if len(level) else 0
    pick = torch.minimum if how == "amin" else torch.maximum
    best = torch.full((n,), empty, dtype=torch.int64)
    for j in range(top, -1, -1):
        here = torch.full((n,), empty, dtype=torch.int64)
        m = level == j
        if bool(m.any()):
            at = torch.cat([a[m], b[m] - (1 << j)])
            here.scatter_reduce_(0, at, value[m].repeat(2), how)
        if j < top:  # a block 2^(j+1) long at i covers the blocks 2^j long at i and at i + 2^j
            here = pick(here, best)
            half = 1 << j
            here[half:] = pick(here[half:], best[:-half])
        best = here
    return best


def _chunks(wave: torch.Tensor, step: int) -> list[tuple[int, int, int]]:
    """``(first, end, wavelets)`` of runs of at most ``step`` consecutive blocks whose messages have
    the same wavelets (all blocks but a shorter last one, usually)."""
    values, counts = torch.unique_consecutive(wave, return_counts=True)
    out, q0 = [], 0
    for n, w in zip(counts.tolist(), values.tolist()):
        out += [(q, min(q + step, q0 + n), w) for q in range(q0, q0 + n, step)]
        q0 += n
    return out


def _fits(live: torch.Tensor | None, flow: Flow) -> torch.Tensor | None:
    """``live`` if it has a flag per message of ``flow``; None for an empty value (nothing to filter)."""
    return _sized(live, flow.blocks, flow.features)


def _sized(live: torch.Tensor | None, blocks: int, features: int) -> torch.Tensor | None:
    return live if live is not None and tuple(live.shape) == (blocks, features) else None


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool(torch.equal(a, b))


def _blocked(rows: torch.Tensor, b: int) -> torch.Tensor:
    """``[rows, features]`` nonzero flags -> ``[blocks, features]``: whether any row of a block is nonzero."""
    blocks = -(-rows.shape[0] // b)
    padded = torch.zeros((blocks * b, rows.shape[1]), dtype=torch.bool)
    padded[: rows.shape[0]] = rows
    return padded.reshape(blocks, b, -1).any(dim=1)


def simulate(
    program: ProgramData,
    activity: Mapping[str, torch.Tensor] | None = None,
    device: str | torch.device | None = None,
) -> Timeline:
    """Time ``program`` (module docstring); ``activity[value]`` is ``[rows, features]`` bool, which
    elements of a value (a program input or a kernel's result) are nonzero.

    ``device`` runs the clock's tensors there (CPU by default): every tensor it makes is made there,
    and the program's arrays and ``activity`` are moved there once. The timeline comes back on the
    CPU, the same cycle for cycle wherever it ran."""
    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type == "cpu":
        return _simulate(_Clock(program, activity))
    with dev:  # factory calls (``torch.arange``, ``torch.zeros``...) make their tensors on ``dev``
        return _on_cpu(_simulate(_Clock(program, activity, device=dev)))


def _simulate(clock: _Clock) -> Timeline:
    program = clock.p
    kernels = [clock.time(k) for k in program.kernels]
    done: dict[str, int] = {}
    hw, mesh = program.hardware, program.mesh
    for name in program.outputs:
        flow = clock.flows[name]
        hops = (mesh.width - flow.east) if not clock.streaming else (flow.east + 1 + mesh.width)
        if flow.east < 0:
            hops = mesh.width
        done[name] = flow.done + hops * hw.hop_cycles
    cycles = max([kt.end for kt in kernels] + list(done.values()) + [0])
    return Timeline(kernels, clock.flows, cycles, done)


def _on_cpu(timeline: Timeline) -> Timeline:
    """A timeline whose tensors are on the CPU, for the stats: kernels' busy cycles and link loads, and
    the flows' ready times and wavelets (their cached departures are left behind)."""
    cpu = torch.device("cpu")
    kernels = [
        dataclasses.replace(kt, busy=kt.busy.cpu(), overhead=kt.overhead.cpu(), bus=to_device(kt.bus, cpu))
        for kt in timeline.kernels
    ]
    flows = {
        n: dataclasses.replace(
            f, wave=f.wave.cpu(), ready=f.ready.cpu(), live=to_device(f.live, cpu), _departs={}, _shared={}
        )
        for n, f in timeline.flows.items()
    }
    return dataclasses.replace(timeline, kernels=kernels, flows=flows)


def time_alone(program: ProgramData, kernel: Kernel, known: Layout | None = None) -> int:
    """Cycles ``kernel`` takes alone: its inputs stream in back to back, in its own blocks, from west
    of its region. The lowering compares mappings (block sizes) with it; ``known`` is the kernel's
    layout when the caller has read it already."""
    return kernel_alone(program, kernel, known).end


def kernel_alone(
    program: ProgramData, kernel: Kernel, known: Layout | None = None, rows: int | None = None
) -> KernelTime:
    """``time_alone``'s whole timing: when the kernel ends, and each PE's busy cycles. ``rows`` times
    only the first rows of a row-wise kernel (its inputs' as many): the lowering's block search
    times a few blocks of a long kernel and extrapolates (``passes/lower/blocks.py``)."""
    clock = _Clock(program, None, {kernel.name: known} if known is not None else None)
    clock.streaming = False
    clock.reuse = False  # the lowering times each mapping once: keeping its timings only holds memory
    full = rows_of(kernel.shape)
    if rows is not None and rows < full and row_streaming_op(kernel):
        kernel = dataclasses.replace(kernel, shape=(rows, features_of(kernel.shape)))
    b = block_rows(kernel)
    for value in dict.fromkeys(kernel.inputs):
        shape, dtype = program.value(value).shape, program.value(value).dtype
        f, n = features_of(shape), rows_of(shape)
        if n == full:  # row-streamed: as many rows as the kernel
            n = rows_of(kernel.shape)
        lanes = _lanes(kernel, f)
        block = b if n == rows_of(kernel.shape) else max(n, 1)
        wave = clock._waves(_sizes(n, block), dtype)
        ready = torch.zeros((len(wave), f), dtype=torch.int64)
        clock.flows[value] = Flow(value, dtype, f, lanes, n, block, wave, kernel.region.x - 1, ready)
    return clock.time(kernel)
