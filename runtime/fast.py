"""The fast executor's clock: the cost rules of ``runtime/cost.py``, vectorized over PEs and messages.

``simulate(program, activity)`` times every kernel of a program, in program order, from the flows of
its inputs: when each block of each input leaves its producer. A kernel's messages become one tensor
of ``(PE, arrival, cost)``; ``runtime/queues.py`` runs each PE's tasks in arrival order without a
Python loop per PE, nonzero or wavelet. ``activity[value]`` says which elements of each value are
nonzero: a message whose values are all zero is not sent (``Flow.live``: no wavelets, no link time, no
task on a sparse matmul; a reader learns that its block is complete from the lane's end-of-block mark).
Without it every message is sent. What it returns is a ``runtime/timeline.py`` ``Timeline``.

Cross-route link sharing is mostly not queued here: a route's own messages are serialized on its
lanes, pipelined program inputs take turns on the host's rows (``_share_host_rows``), and the hottest
links are reported from the traffic. The event-driven reference executor queues every link.

Its helpers live beside it: ``runtime/intervals.py`` (range maxima and held pairs for the column
reduction), ``runtime/blocking.py`` (blocks, lanes, zero flags), ``runtime/reuse.py`` (which timings
are taken again) and ``runtime/alone.py`` (a kernel timed alone, for the lowering's tuner).
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from sparsefx.trees import to_device

from . import compiled, reuse
from .arrivals import arrivals_at
from .blocking import (
    block_sizes,
    blocked,
    feature_lanes,
    fits,
    kernel_lanes,
    lane_rank,
    per_block,
    same_flags,
    sized,
    wave_runs,
)
from .cost import (
    allreduce_cycles,
    block_rows,
    epilogue_cycles,
    features_of,
    idle_tasks,
    load_cycles,
    ops_per_element,
    partial_add_cycles,
    row_streaming_op,
    rows_of,
    sparse_task_cycles,
    task_cycles,
    task_overhead,
    wavelets,
)
from .homes import back, final_pes, stays, sums
from .host import edge_queued, outputs_in_host
from .intervals import Columns, Holders, busiest_link, column_load, cumcount, lane_merges
from .layout import Layout, layout, weight_bytes
from .memo import kept_for
from .op_kinds import ROW_MATMULS, op_kind
from .program import Kernel, ProgramData, lane_bounds
from .queues import CHUNK, NEVER, fifo, sparse_tasks
from .ramps import links_of, output_departs, shared_departs
from .tiles import edge_ready, tile_place, tile_rows
from .timeline import Flow, KernelTime, Timeline

__all__ = ["FastClock", "simulate"]


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
    flow.live = fits(live, flow)
    return flow


def _share_host_rows(flows: list[Flow]) -> None:
    """Pipelined, every program input leaves the host at once, and they share the host's rows: on each
    row the inputs' messages take turns, one of each input in turn (the links' round-robin by color),
    each input's own in lane order. Sets each message's ``ready`` to its turn."""
    if len(flows) < 2:
        return
    rows, ranks, which, sends = [], [], [], []
    for i, flow in enumerate(flows):
        if flow.features == 0:
            continue
        lane = flow.lane
        rank = torch.arange(flow.features) - flow.bounds[lane]  # its place in its lane's queue
        rows.append(lane)
        ranks.append(rank)
        which.append(torch.full((flow.features,), i, dtype=torch.int64))
        sends.append(flow.sends[0])
    if len(rows) < 2:
        return
    row, rank, value, cost = (torch.cat(t) for t in (rows, ranks, which, sends))
    order = torch.argsort(rank * len(flows) + value, stable=True)  # round-robin: turn by turn
    finish = torch.empty_like(cost)
    finish[order] = fifo(row[order], torch.zeros_like(cost), cost[order])
    start = finish - cost
    for i, flow in enumerate(flows):
        if flow.features:
            flow.ready = start[value == i][None, :].clone()
            flow._departs.clear()
            flow._shared.clear()


_Read = tuple[str, torch.Tensor, tuple]
"""A value a kernel reads, the feature each of its PEs takes from it, and the key of those PEs among
the kernel's structures (``FastClock.arrivals``)."""


@dataclasses.dataclass
class _Plan:
    """A value's messages to a kernel's PEs before the column links (``FastClock._plan``): when they
    leave and their hops to the column, and the entries of those that fork onto the column's links
    (``queue``, one link id per entry; None when none fork), with where their queued starts go back
    (``q_at``, ``k_of``; ``fork_start``, once queued: when each forking message left its queue)."""

    flow: Flow
    feats: torch.Tensor
    q: torch.Tensor
    depart: torch.Tensor
    hops: torch.Tensor
    climb: torch.Tensor
    queue: torch.Tensor | None = None
    at_column: torch.Tensor | None = None
    cost: torch.Tensor | None = None
    q_at: torch.Tensor | None = None
    k_of: torch.Tensor | None = None
    fork_start: torch.Tensor | None = None


class FastClock:
    """The mesh of ``runtime/cost.py`` as the fast executor times it: kernel by kernel in program order,
    each kernel from its inputs' ``Flow``s, all of its messages and tasks at once as tensors (one
    ``queues``/``fifo`` pass for the PEs' task queues, sparse tables for a column's partial sums), never
    message by message as ``ReferenceMachine`` (``runtime/reference.py``) plays the same rules.

    ``time(k)`` times the next kernel and keeps its result's flow in ``flows``; what a kernel's timing
    derives from the program alone is kept per program (``runtime/memo.py``), and a kernel met again in
    the same situation takes its earlier timing (``runtime/reuse.py``). ``activity`` holds each value's
    nonzero elements (``[rows, features]`` bool; None: every message is sent); ``layouts`` sparse matmul
    layouts the caller has read already; ``device`` where the clock's tensors are made (None: the CPU).
    """

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
        self._blocked: dict[tuple[str, int], torch.Tensor | None] = {}
        self.flows: dict[str, Flow] = {
            s.name: _host_flow(program, s.name, s.shape, s.dtype, self.live(s.name, max(rows_of(s.shape), 1)))
            for s in program.inputs
        }
        self.streaming = program.mode == "streaming"
        self._rows0 = {k.name: k.region.y for k in program.kernels}  # each result's lane 0; inputs: 0
        if not self.streaming:
            _share_host_rows(list(self.flows.values()))
        self.prev_end = 0
        self.loader_free = 0
        self.prev_start = 0
        self.t0 = 0
        self.reuse = reuse.REUSE  # keep and reuse kernel timings (``runtime/reuse.py``)

    def live(self, value: str, b: int) -> torch.Tensor | None:
        """``[blocks, features]``: which messages of ``value`` in blocks of ``b`` rows hold a nonzero
        (None: unknown, every message is sent)."""
        if (value, b) not in self._blocked:  # each value's flags in blocks of ``b``, once a run
            seen = self.activity.get(value)
            self._blocked[value, b] = None if seen is None or seen.dim() != 2 else blocked(seen, b)
        return self._blocked[value, b]

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
        reads: list[_Read],
        kernel: Kernel,
        blocks: int,
        b: int,
        x: torch.Tensor,
        y: torch.Tensor,
        through: bool | None = None,
    ) -> list[torch.Tensor]:
        """For each value ``kernel`` reads, ``(value, feats, key)``: ``[blocks, n]``, when feature
        ``feats[n]`` of each block reaches the PE at ``(x, y)``. ``key`` names ``feats``, ``x`` and ``y``
        among the kernel's structures (``_kept``). The values' messages that fork up or down the kernel's
        columns queue on those links together, as the reference's do (two operands of an attention
        matmul share the column they climb). ``through``: where stored values' messages meet
        (``_shared_departs``)."""
        shared = self._shared_departs([value for value, _, _ in reads], kernel, through)
        plans = [self._plan(read, kernel, blocks, b, x, y, shared.get(read[0])) for read in reads]
        queued = [p for p in plans if p.queue is not None]
        if queued:
            done = fifo(
                torch.cat([p.queue for p in queued]),
                torch.cat([p.at_column.reshape(-1) for p in queued]),
                torch.cat([p.cost.reshape(-1) for p in queued]),
            )
            for p, d in zip(queued, torch.split(done, [p.cost.numel() for p in queued])):
                p.fork_start = d.reshape(p.cost.shape) - p.cost
        return [self._arrived(p) for p in plans]

    def tile_arrivals(
        self,
        reads: list[_Read],
        kernel: Kernel,
        blocks: int,
        b: int,
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> list[torch.Tensor]:
        """``arrivals`` at every row tile's PEs, ``x`` ``[tiles, n]``: ``[tiles, blocks, n]`` each.
        Each tile reads every message (it keeps its share of the rows); where no message forks up or
        down a column, a tile's arrivals are tile 0's beyond column 0 moved by its extra hops along the
        lanes."""
        first = here = self.arrivals(reads, kernel, blocks, b, x[0], y)
        on0 = x[0] == 0
        if self.streaming and kernel.region.width > 1 and bool(on0.any()):
            # a PE on column 0 takes the stored values' messages off column 0's router, before they
            # queue for the link east out of it, as a one-column reader does (``ramps.py``)
            off = self.arrivals(reads, kernel, blocks, b, x[0], y, through=False)
            here = [torch.where(on0[None, :], a0, a) for a0, a in zip(off, first)]
        if x.shape[0] == 1:
            return [a[None] for a in here]
        if any(self._forked(read, kernel, x[0], y) for read in reads):
            tiled = [
                self.arrivals([(v, fs, (*key, "tile", t)) for v, fs, key in reads], kernel, blocks, b, xt, y)
                for t, xt in enumerate(x[1:], 1)
            ]
            return [torch.stack([a, *(t[i] for t in tiled)]) for i, a in enumerate(here)]
        hop = self.hw.hop_cycles
        out = []
        for (value, _, _), a, a0 in zip(reads, first, here):
            flow = self.flows[value]
            moved = (self._hops(flow, x) - self._hops(flow, x[0])[None, :]) * hop  # [tiles, n]
            at = a[None] + moved[:, None, :]
            at[0] = a0
            out.append(at)
        return out

    def _forked(self, read: _Read, kernel: Kernel, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether any message of ``read`` forks up or down a column to reach ``(x, y)``."""
        value, feats, key = read
        flow = self.flows[value]
        args = ("arrivals", flow.features, flow.lanes) + key
        return bool(self._kept(kernel, args, lambda: self._forks(flow, feats, x, y))[1])

    def _shared_departs(
        self, values: list[str], kernel: Kernel, through: bool | None = None
    ) -> dict[str, torch.Tensor]:
        """Streaming: the departures of stored values a kernel reads whose messages meet on the links
        of a row (``ramps.shared_departs``), by value; a value that meets none is not in it.
        ``through``: they go on east of column 0 (default: where the kernel is wider than one column)."""
        if not self.streaming:
            return {}
        stored = self._stored(values)
        if len(stored) < 2:
            return {}
        if through is None:
            through = kernel.region.width > 1
        ramps = [links_of(self.flows[v], self.row0(v), through) for v in stored]
        groups: list[tuple[list[str], set[int]]] = []  # values that share a ramp, joined
        for v, used in zip(stored, ramps):
            meets = [g for g in groups if g[1] & used]
            names = [n for g in meets for n in g[0]] + [v]
            groups = [g for g in groups if not g[1] & used] + [(names, used.union(*(g[1] for g in meets)))]
        out: dict[str, torch.Tensor] = {}
        for names, _ in groups:
            if len(names) > 1:
                group = sorted(names, key=stored.index)  # program order: the round-robin's
                flows = [self.flows[v] for v in group]
                rows0 = [self.row0(v) for v in group]
                departs = shared_departs(flows, rows0, self.t0, self.hw.hop_cycles, through)
                out.update(zip(group, departs))
        return out

    def _stored(self, values: Iterable[str]) -> list[str]:
        """``values``, each once in order, that are stored on the mesh with something to send."""
        return [v for v in dict.fromkeys(values) if self.flows[v].east >= 0 and self.flows[v].features > 0]

    def _departs(self, flow: Flow, shared: torch.Tensor | None) -> torch.Tensor:
        """``[blocks, features]``: when each message of ``flow`` leaves for the kernel being timed:
        ``shared`` where it shares its ramps with other values the kernel reads (``_shared_departs``),
        else its own lanes' departures (a stored value is sent again from the step's start). A value
        kept where it was made leaves on its lanes' schedule (``homes.py``): each message
        passes column 0 when it would have from the east column."""
        return shared if shared is not None else flow.depart(self.t0 if self.streaming else 0)

    def row0(self, value: str) -> int:
        """The mesh row of ``value``'s lane 0: its producer's first row (a program input: row 0)."""
        return self._rows0.get(value, 0)

    def _plan(
        self,
        read: _Read,
        kernel: Kernel,
        blocks: int,
        b: int,
        x: torch.Tensor,
        y: torch.Tensor,
        depart: torch.Tensor | None = None,
    ) -> _Plan:
        """One read's messages to ``(x, y)`` up to the column they fork on, and the queue entries of
        those that fork (``_Plan``)."""
        value, feats, key = read
        flow, hop = self.flows[value], self.hw.hop_cycles
        rise, forks, k_of, pair, queue = self._kept(  # pair: the fork that queues for a message
            kernel, ("arrivals", flow.features, flow.lanes) + key, lambda: self._forks(flow, feats, x, y)
        )
        q = self._source_blocks(flow, kernel, value, blocks, b)
        depart = self._departs(flow, depart)
        hops = self._hops(flow, x) * hop  # to (x, lane row)
        plan = _Plan(flow, feats, q, depart, hops, rise.abs() * hop)
        if forks:  # up or down the column: queued on the busiest link the message crosses
            # every block of the value up to the last one read crosses the column: a kernel whose
            # blocks are longer than the value's reads two or more of them a block, not only the last
            qs, q_at = torch.arange(int(q.max()) + 1), q
            sent = feats[pair]
            plan.at_column = depart[qs][:, sent].add_(hops[None, pair])  # [source blocks, column messages]
            plan.cost = flow.sends[qs][:, sent]  # a filtered message (0 wavelets) does not queue
            plan.queue = queue[None, :].expand_as(plan.at_column).reshape(-1)
            plan.q_at, plan.k_of = q_at, k_of
        return plan

    @staticmethod
    def _arrived(plan: _Plan) -> torch.Tensor:
        """When each planned message's last wavelet reaches its PE (a filtered one: its lane's mark)."""
        flow = plan.flow
        forked = None if plan.fork_start is None else (plan.fork_start, plan.q_at, plan.k_of)
        args = (plan.depart, flow.sends, flow.live, plan.q, plan.feats, plan.hops, plan.climb, flow.last)
        return arrivals_at(*args, forked)

    def _forks(self, flow: Flow, feats: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple:
        """How messages reach their PEs, whatever their times: each PE's rows from the lane (``rise``);
        whether any fork up or down a column, one entry per message on a column and direction
        (``k_of[n]``: the entry of PE ``n``'s message, -1 where it does not fork; ``pair``: a PE of each
        entry), and the queue of the busiest link each entry crosses."""
        lane, _ = lane_rank(flow.bounds, feats)
        rise = y - lane
        at = (rise != 0).nonzero().squeeze(1)
        if len(at) == 0:
            return rise, False, at, at, at
        buses = 2 * self.p.mesh.width + 2
        bus = x[at] * 2 + (rise[at] > 0).to(torch.int64)  # a column and a direction
        keys, k_at = torch.unique(feats[at] * buses + bus, return_inverse=True)  # one message each
        pair = torch.zeros(len(keys), dtype=torch.int64).scatter_(0, k_at, torch.arange(len(k_at)))
        far = torch.zeros(len(keys), dtype=torch.int64).scatter_reduce(0, k_at, rise[at].abs(), "amax")
        queue = busiest_link(keys % buses, lane[at][pair], far, self.p.mesh.height)
        k_of = torch.full_like(feats, -1).index_put_((at,), k_at)
        return rise, True, k_of, at[pair], queue

    # -- kernels --------------------------------------------------------------------------------------

    def time(self, k: Kernel) -> KernelTime:
        t0, load = self._begin(k)
        self.t0 = t0
        if self.reuse:  # kept relative to the kernel's start: the rules only add and compare times
            timings = self._kept(k, ("timings", *self.setting(k)), OrderedDict)
            kt, flow = reuse.take(timings, self.situation(k, t0), k, t0, lambda: self._time(k, t0))
            mine = fits(self.live(k.name, flow.block), flow)  # its own zeros, not the kept timing's
            if not same_flags(flow.live, mine):
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
        """``reuse.setting`` of ``k`` on this clock's hardware and mode, whether its result stays where
        it is made (``homes.py``: not for a program output) and whether it is a program output."""
        return (*reuse.setting(k, self.hw, self.streaming), stays(self.p, k), k.name in self.p.outputs)

    def situation(self, k: Kernel, t0: int) -> tuple:
        """``reuse.situation`` of ``k`` starting at ``t0``: its inputs' flows, the input vectors it is sent
        (a sparse matmul) and, for an op that skips tasks making only zeros or a sparse matmul with an
        epilogue, its own result's zeros."""
        seen = self._input_live(k)
        sent = None if seen is None else blocked(seen, block_rows(k))
        # an epilogue's zeros (a ReLU's) decide which results are filtered, and so when the kernel ends
        zeros_matter = op_kind(k.op).skips_zero_tasks or "epilogue" in k.attrs
        own = self.live(k.name, block_rows(k)) if zeros_matter else None
        return reuse.situation(k, self.flows, t0, sent, own)

    def _input_live(self, k: Kernel) -> torch.Tensor | None:
        """``[rows, in_features]``: which input values of a sparse matmul (not a convolution, whose
        tasks read im2col columns) are nonzero; None for other kernels or when unknown."""
        if k.op != "sparse_matmul" or k.attrs.get("kind") not in ROW_MATMULS:
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

    def waves(self, sizes: torch.Tensor, dtype: str) -> torch.Tensor:
        """Wavelets of each block's messages, for blocks of ``sizes`` rows."""
        return per_block(lambda n: wavelets(n, dtype, self.hw), sizes)

    def _out_flow(self, k: Kernel, ready: torch.Tensor, b: int, wave: torch.Tensor) -> Flow:
        """The result's flow: ``ready[q, f]`` when each message reaches the region's east edge, or,
        where it stays where it is made (``homes.py``), when its last share is made."""
        f = features_of(k.shape)
        east = k.region.x + k.region.width - 1
        flow = Flow(k.name, k.dtype, f, kernel_lanes(k, f), rows_of(k.shape), b, wave, east, ready)
        flow.live = fits(self.live(k.name, b), flow)
        if stays(self.p, k):
            flow.back = self._kept(k, ("back",), lambda: back(self.p, k))
        if self.streaming and k.name in self.p.outputs:  # it leaves in its own step, for the host
            flow.own = self._output_departs(k, flow)
        return flow

    def _output_departs(self, k: Kernel, flow: Flow) -> torch.Tensor | None:
        """``ramps.output_departs``: program output ``flow`` leaving ``k``'s east column beside the
        stored values ``k``'s step sends again from there (None: none is)."""
        values = self._stored(k.inputs)
        shared = self._shared_departs(values, k)
        sent = [(self.flows[v], self._departs(self.flows[v], shared.get(v)), self.row0(v)) for v in values]
        east = k.region.x + k.region.width - 1
        return output_departs(flow, k.region.y, east, sent, self.hw.hop_cycles)

    def _blocks(self, k: Kernel) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        """Rows per block, blocks, each block's rows and each block's wavelets per message."""

        def build() -> tuple[int, int, torch.Tensor, torch.Tensor]:
            b = block_rows(k)
            sizes = block_sizes(rows_of(k.shape), b)
            return b, len(sizes), sizes, self.waves(sizes, k.dtype)

        # kept by what sets them: the rows, the rows per block, the dtype and the wavelet size
        key = ("blocks", rows_of(k.shape), block_rows(k), k.dtype, self.hw.wavelet_bytes)
        return self._kept(k, key, build)

    def _constant(self, k: Kernel, t0: int) -> tuple[KernelTime, Flow]:
        zeros = torch.zeros(k.region.pes, dtype=torch.int64)
        b, _, _, wave = self._blocks(k)
        ready = torch.full((len(wave), features_of(k.shape)), t0, dtype=torch.int64)
        flow = self._out_flow(k, ready, b, wave)
        return KernelTime(k.name, k.op, t0, self._end(flow), zeros, zeros.clone(), 1), flow

    def _end(self, flow: Flow) -> int:
        """When a kernel whose result is ``flow`` ends (``Flow.end``, the rule both executors share)."""
        return flow.end(self.streaming, self.t0)

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
        arr = self.arrivals([(value, feats, ("pairs", conv))], k, blocks, b, x, y)[0].clamp_(min=t0)
        live = self._input_live(k)
        sent = None if live is None or conv else blocked(live, b)  # [blocks, in_features]; None: all sent
        rows, size_of = torch.unique(sizes, return_inverse=True)  # a block size or two
        each = torch.stack([sparse_task_cycles(count, int(n), k.dtype, hw) for n in rows.tolist()])
        # PEs without a pair are done with every block at t0: only the active ones are timed
        active, at = self._kept(k, ("active",), lambda: torch.unique_consecutive(pe, return_inverse=True))
        finish, busy_active, first, started, data = sparse_tasks(
            at, arr, each, size_of, col, sent, len(active), t0
        )  # started: tasks of each (PE, column) over the blocks; data: blocks where some PE ran a task
        # a message is an input vector of a block, however many PEs it forks to (as the reference counts)
        vectors = blocks * s.in_features
        messages = vectors if sent is None else int(sent.sum())
        busy = torch.zeros(r.pes, dtype=torch.int64).index_put_((active,), busy_active)
        # a block in which no PE ran a task has only zero partial sums: none is sent (zero wavelets)
        summed = torch.where(data, wave_out, 0) if sent is not None else wave_out
        south, north, ready = self._reduce(k, s, finish, active, summed, t0)
        if stays(self.p, k):
            ready = self._moved(k, ready, summed)
        applied = None
        if "epilogue" in k.attrs:
            ready, applied = self._epilogue(k, ready, sizes, data)
        flow = self._out_flow(k, ready, b, wave_out)
        tasks = count * started  # their AXPYs
        overhead = torch.zeros(r.pes, dtype=torch.int64).index_add_(0, pe, task_overhead(started, tasks, hw))
        adds = self._kept(k, ("merges",), lambda: self._merges(k, s))  # per block with partial sums
        busy += adds * int(per_block(lambda n: partial_add_cycles(n, k.dtype, hw), sizes)[data].sum())
        overhead += task_overhead(0, adds * int(data.sum()), hw)
        if applied is not None:  # (cycles, tasks) of each PE's epilogues
            busy += applied[0]
            overhead += applied[1] * hw.task_start_cycles
        axpys = int(tasks.sum())
        latest = {value: int(ready.max())} if ready.numel() else {}
        start = first if axpys else int(ready.min())
        kt = KernelTime(
            k.name,
            k.op,
            start,
            self._end(flow),
            busy,
            overhead,
            blocks,
            messages=messages,
            skipped=vectors - messages,
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
        features]`` when each output message reaches the region's east edge (``_to_end``: or the column
        where its sum ends, for a result that stays there). ``finish[i, q]``: when
        PE ``active[i]`` is done with block ``q``; every other PE is done with each block at ``t0``."""
        hw, r = self.hw, k.region
        blocks, h = finish.shape[1], r.height
        lanes = kernel_lanes(k, s.out_features)  # a convolution reduces its channels, not its features
        south, north, held_x, held_o, travel, segments, seg_of = self._kept(
            k, ("column_load", lanes), lambda: self._segments(k, s, lanes)
        )
        vload = torch.maximum(south.amax(1), north.amax(1))
        # A column's bus carries one block's partial sums after another, in output order: block q's
        # start once the column is done with q and the bus with q - 1, and its busiest link passes
        # one output per message time.
        per_block = vload[:, None] * wave_out[None, :]
        occupy = torch.cumsum(per_block, dim=1)  # [width, blocks]
        ahead_all = occupy - per_block  # what the bus carries of the blocks before
        columns = self._kept(k, ("columns",), lambda: Columns(active, r.width, h))
        moving = travel > 0
        # An output's sum reaches its lane once every row holding a part of it is done and its part
        # has come the rows between (``Holders.reach``: it merges on its way, as the reference plays
        # it). Sums held by one row leave it one message time apart: pairs with the same column and
        # rows share the slowest of those rows, found once per such segment, [blocks, segments].
        slowest = columns.slowest(finish, segments // (h * h), segments // h % h, segments % h, t0).T
        holders = self._kept(k, ("holders",), lambda: Holders(s, r.width, h))
        pair_lane = lane_rank(lane_bounds(s.out_features, lanes), held_o)[0]
        step = max(1, CHUNK // max(len(held_o), 1))  # blocks at a time: bounded scratch memory
        in_column = columns.first(finish, t0)
        users = _users(held_x, moving, r.width)
        before = torch.cumsum(moving.to(torch.int64), 0) - moving.to(torch.int64)
        first = torch.cumsum(users, 0) - users
        rank = (before - first[held_x]) * vload[held_x] // users[held_x].clamp(min=1)  # on the busiest link
        key = ("to end", hw.hop_cycles, stays(self.p, k))
        edge_all = self._kept(k, key, lambda: self._to_end(k, held_x, held_o))
        ready = torch.full((blocks, s.out_features), t0, dtype=torch.int64)
        if compiled.available(finish, ready):  # the same queues, block by block in one compiled pass
            idle = torch.where(users[:, None] > 0, NEVER, in_column)
            lead_all = travel * hw.hop_cycles + edge_all
            pairs = (held_x, held_o, seg_of, pair_lane, moving, rank, lead_all, edge_all)
            latest = torch.full((r.width,), -NEVER, dtype=torch.int64)
            for q0, q1 in ((q, min(q + step, blocks)) for q in range(0, blocks, step)):
                arrive = holders.reach(finish[:, q0:q1], active, t0, pair_lane, hw.hop_cycles, r.width)
                here = slowest[q0:q1].contiguous()
                compiled.column_sums(arrive, here, pairs, (ahead_all, idle), wave_out, h, latest, ready, q0)
            return south, north, self._per_feature(k, s, ready)
        still, any_moving = ~moving, bool(moving.any())
        group_seg = slowest % h + (segments // (h * h) * h)[None, :]
        edge, o_s = edge_all[still][None, :], held_o[still][None, :]
        if any_moving:
            seg_m, x_m, o_m = seg_of[moving], held_x[moving], held_o[moving]
            edge_m = edge_all[moving]
            lead = travel[moving] * hw.hop_cycles + edge_m
            leave = (travel[moving] * hw.hop_cycles)[None, :]
            lane_m, ones = pair_lane[moving][None, :], torch.ones(len(seg_m), dtype=torch.int64)
            idle = torch.where(users[:, None] > 0, NEVER, in_column)  # a column none of whose sums move
            rank_m, o_m = rank[moving], o_m[None, :]
        carry = torch.full((r.width, 1), -NEVER, dtype=torch.int64)
        offsets: dict[int, torch.Tensor] = {}
        for q0, q1, w in wave_runs(wave_out, step):  # blocks in order, those of a chunk the same wavelets
            arrive = holders.reach(finish[:, q0:q1], active, t0, pair_lane, hw.hop_cycles, r.width)
            if bool(still.any()):  # no partial sum travels: the sum leaves from where it is
                at = arrive[:, still] + edge
                ready[q0:q1].scatter_reduce_(1, o_s.expand_as(at), at, "amax")
            if not any_moving:
                continue
            # The bus starts with the first partial sum that can travel: the earliest a moving pair's
            # sum could leave its far row and reach the lane in time (a column with none starts with
            # its first PE done); a block's, once the bus is done with the block before.
            per_pair = (arrive[:, moving] - leave).T  # [moving pairs, blocks]
            first_done = torch.full((r.width, q1 - q0), NEVER, dtype=torch.int64)
            first_done.scatter_reduce_(0, x_m[:, None].expand_as(per_pair), per_pair, "amin")
            ahead = occupy[:, q0:q1] - per_block[:, q0:q1]
            latest = torch.cummax(torch.minimum(first_done, idle[:, q0:q1]) - ahead, 1).values
            latest = torch.maximum(latest, carry)
            carry = latest[:, -1:]
            # The sums that leave one row go down or up its column, one message time apart on each
            # link: pairs queue there by the side of that row their lane is on (2: on the row, no
            # link), [blocks, moving pairs].
            row_m = (slowest[q0:q1] % h)[:, seg_m]
            side = torch.where(lane_m == row_m, 2, (lane_m > row_m).to(torch.int64))
            earlier = cumcount(group_seg[q0:q1, seg_m] * 3 + side, ones).masked_fill_(side == 2, 0)
            if w not in offsets:  # on the bus after the pairs before
                offsets[w] = (rank_m * w).add_(lead)[None, :]
            at = (ahead + latest).T[:, x_m].add_(offsets[w])
            queued = (earlier * w).add_(arrive[:, moving]).add_(edge_m[None, :])
            torch.maximum(at, queued, out=at)
            ready[q0:q1].scatter_reduce_(1, o_m.expand_as(at), at, "amax")
        return south, north, self._per_feature(k, s, ready)

    def _to_end(self, k: Kernel, held_x: torch.Tensor, held_o: torch.Tensor) -> torch.Tensor:
        """Cycles from each (column, output) pair's column to where the output stays: east to the
        region's east edge, or, for a result that stays on the mesh, east to the last column holding
        a part of it, then along its lane to its own column (``homes.sums``). The lane's links are not
        queued here (the reference queues them)."""
        if not stays(self.p, k):
            return (k.region.width - 1 - held_x) * self.hw.hop_cycles
        last, _ = self._kept(k, ("sums",), lambda: self._on_host(sums, k))
        return (last[held_o] - held_x) * self.hw.hop_cycles

    def _moved(self, k: Kernel, ready: torch.Tensor, wave: torch.Tensor) -> torch.Tensor:
        """``ready`` (``[blocks, outputs]``, each sum whole on the last column holding a part of it)
        once each output of a result that stays on the mesh is on its own column (``homes.sums``):
        the sums that move the same way along one row take that row's links one after another (one
        wavelet a cycle, in the order they are whole; their paths mostly overlap, as a lane's
        features leave a few columns for columns spread over the region), then one hop a column.
        ``wave[q]``: wavelets of block ``q``'s messages (0 where none is sent)."""
        last, home = self._kept(k, ("sums",), lambda: self._on_host(sums, k))
        moving = (home != last).nonzero().squeeze(1)
        if not len(moving) or not ready.numel():
            return ready
        out_f = len(home)
        lane = feature_lanes(k, out_f)
        link = (lane * 2 + (home > last).to(torch.int64))[moving]
        blocks = ready.shape[0]
        cost = wave[:, None].expand(blocks, len(moving))
        at = ready[:, moving]
        done = fifo(link[None, :].expand(blocks, -1).reshape(-1), at.reshape(-1), cost.reshape(-1))
        out = ready.clone()
        hops = (home - last).abs()[moving] * self.hw.hop_cycles
        out[:, moving] = done.view(blocks, -1) - cost + hops[None, :]
        return out

    def _epilogue(
        self, k: Kernel, ready: torch.Tensor, sizes: torch.Tensor, data: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``ready`` once each output's epilogue (``cost.epilogue_cycles``) has run on the PE holding its
        whole sum (its own column when the result stays, else the region's east edge; its lane's row),
        one task at a time on each PE in the order the sums get there; and each PE's busy cycles and
        tasks for them. A block in which no PE ran a task (``data`` False) has only zero sums: none runs."""
        r, (blocks, out_f) = k.region, ready.shape
        pe = self._kept(k, ("final pes",), lambda: self._on_host(final_pes, k))
        each = torch.tensor([epilogue_cycles(k, int(n), self.hw) for n in sizes.tolist()], dtype=torch.int64)
        cost = torch.where(data, each, 0)[:, None].expand(blocks, out_f).reshape(-1)
        keys = pe[None, :].expand(blocks, out_f).reshape(-1)
        done = fifo(keys, ready.reshape(-1), cost).view(blocks, out_f)
        busy = torch.zeros(r.pes, dtype=torch.int64).index_add_(0, keys, cost)
        tasks = torch.zeros(r.pes, dtype=torch.int64).index_add_(0, keys, (cost > 0).to(torch.int64))
        return done, (busy, tasks)

    @staticmethod
    def _per_feature(k: Kernel, s: Layout, ready: torch.Tensor) -> torch.Tensor:
        """``ready`` per output feature: a convolution's outputs are its channels, each ready once all are."""
        if s.out_features != features_of(k.shape):
            return ready.amax(1, keepdim=True).expand(-1, features_of(k.shape)).contiguous()
        return ready

    def _merges(self, k: Kernel, s: Layout) -> torch.Tensor:
        """``[region pes]``: the partial-sum adds each PE does per block (``intervals.merges``)."""
        r = k.region
        holders = self._kept(k, ("holders",), lambda: Holders(s, r.width, r.height))
        return lane_merges(s, r.width, r.height, kernel_lanes(k, s.out_features), holders)

    def _segments(self, k: Kernel, s: Layout, lanes: int) -> tuple[torch.Tensor, ...]:
        """``_column_load``, with the rows of each pair as one segment id ``(column * h + first) * h +
        last`` (the distinct ones, and each pair's)."""
        south, north, held_x, held_o, travel, y_lo, y_hi = self._column_load(k, s, lanes)
        h = k.region.height
        segments, seg_of = torch.unique((held_x * h + y_lo) * h + y_hi, return_inverse=True)
        return south, north, held_x, held_o, travel, segments, seg_of

    def _column_load(self, k: Kernel, s: Layout, lanes: int) -> tuple[torch.Tensor, ...]:
        """``intervals.column_load`` of the kernel's region, with its ``Holders`` kept."""
        r = k.region
        held = self._kept(k, ("holders",), lambda: Holders(s, r.width, r.height))
        return column_load(s, r.width, r.height, lanes, held)

    def _dense_geometry(self, k: Kernel) -> tuple[torch.Tensor, ...]:
        """Where a kernel without stored weights works on each feature (``runtime/tiles.py``): the
        features, each one's PE column in each row tile and its row on the mesh, its PE in the region in
        each tile, and its trip to the region's east edge from each tile (``[tiles, features]`` cycles)."""
        r, f = k.region, features_of(k.shape)
        px, py, pe_local = tile_place(k, f)
        to_east = (r.x + r.width - 1 - px) * self.hw.hop_cycles
        return torch.arange(f), px, py, pe_local, to_east

    def _share_sends(self, k: Kernel, rows: torch.Tensor, b: int) -> torch.Tensor:
        """``[tiles, blocks, features]``: the wavelets of each row tile's share of each result (none
        for a result that is all zero: it is filtered)."""
        f = features_of(k.shape)
        share = self.waves(rows.reshape(-1), k.dtype).reshape(rows.shape)[:, :, None].expand(-1, -1, f)
        live = self.live(k.name, b)
        return share if live is None else share * sized(live, rows.shape[1], f)[None]

    def _lane_heads(
        self,
        k: Kernel,
        reads: list[_Read],
        fin: torch.Tensor,
        share: torch.Tensor,
        px: torch.Tensor,
        py: torch.Tensor,
    ) -> torch.Tensor:
        """``[tiles, blocks, features]``: when each row tile's share of each result reaches the region's
        east edge. A lane's eastward links carry both the messages every tile reads and the shares the
        tiles send east, so every tile's shares but the last one's queue on the link into the last tile
        behind the messages crossing it (one wavelet a cycle, in arrival order; the messages go first,
        as they come before the results they make)."""
        r, hop = k.region, self.hw.hop_cycles
        east, link = r.x + r.width - 1, int(px[-1].min())  # the last tile's first column
        lane = py - r.y
        queue, at, cost = [], [], []
        shared = self._shared_departs([value for value, _, _ in reads], k)
        for value, feats, _ in reads:
            flow = self.flows[value]
            depart = self._departs(flow, shared.get(value))
            pairs = torch.unique(lane * flow.features + feats)  # (lane, source feature), each once
            lanes, src = pairs // flow.features, pairs % flow.features
            reach = self._hops(flow, torch.full_like(src, link)) * hop
            queue.append(lanes[None, :].expand(flow.blocks, -1).reshape(-1))
            at.append((depart[:, src] + reach[None, :]).reshape(-1))
            cost.append(flow.sends[:, src].reshape(-1))
        before = fin[:-1] + ((link - px[:-1]) * hop)[:, None, :]  # the shares of every tile but the last
        queue.append(lane[None, None, :].expand_as(before).reshape(-1))
        at.append(before.reshape(-1))
        cost.append(share[:-1].reshape(-1))
        done = fifo(torch.cat(queue), torch.cat(at), torch.cat(cost))[-before.numel() :]
        passed = done.reshape(before.shape) - share[:-1]  # each share's head past the link
        last = fin[-1:] + ((east - px[-1]) * hop)[None, None, :]
        return torch.cat([passed + (east - link) * hop, last])

    @staticmethod
    def _edge_ready(
        heads: torch.Tensor,
        share: torch.Tensor,
        rows: torch.Tensor,
        wave: torch.Tensor,
        live: torch.Tensor | None,
    ) -> torch.Tensor:
        """``[blocks, features]``: when each result is at the region's edge from its row tiles' shares
        (``tiles.edge_ready``)."""
        whole = wave[:, None].expand(heads.shape[1:])
        if live is not None:
            whole = whole * sized(live, heads.shape[1], heads.shape[2])
        return edge_ready(heads, share, whole, (rows[:, :, None] > 0).expand_as(heads))

    def _dense(self, k: Kernel, t0: int) -> tuple[KernelTime, Flow]:
        hw, r = self.hw, k.region
        b, blocks, sizes, wave = self._blocks(k)
        f = features_of(k.shape)
        lanes = kernel_lanes(k, f)
        key = ("dense geometry", self.hw.hop_cycles)
        feats, px, py, pe_local, to_east = self._kept(k, key, lambda: self._dense_geometry(k))
        tiles = px.shape[0]  # each block's rows split over the row tiles (``runtime/tiles.py``)
        arr = torch.full((tiles, blocks, f), t0, dtype=torch.int64)
        latest: dict[str, int] = {}
        heard = torch.zeros((blocks, f), dtype=torch.bool)  # some input message of the task has data
        reads = []
        for value in dict.fromkeys(k.inputs):
            flow = self.flows[value]
            if flow.features == 0:  # an empty value (a cat's empty cache, say) sends no message
                continue
            fin = torch.clamp(feats * flow.features // max(f, 1), max=flow.features - 1)
            reads.append((value, fin, ("dense",)))
            heard |= self._heard(flow, k, value, blocks, b)[:, fin]
        for (value, _, _), a in zip(reads, self.tile_arrivals(reads, k, blocks, b, px, py)):
            latest[value] = int(a.max())
            arr = torch.maximum(arr, a)
        ops = ops_per_element(self.p, k)
        rows = tile_rows(sizes, tiles)  # [tiles, blocks]
        counts, at = torch.unique(rows, return_inverse=True)
        cost = per_block(lambda n: task_cycles(ops, n, k.dtype, hw) if n else 0, counts)[at]
        cost_b = cost[:, :, None].expand(tiles, blocks, f)
        idle = idle_tasks(k.op, heard, sized(self.live(k.name, b), blocks, f))
        if idle is not None:
            cost_b = cost_b.masked_fill(idle[None], 0)
        pes_b = pe_local[:, None, :].expand(tiles, blocks, f)
        fin = fifo(pes_b.reshape(-1), arr.reshape(-1), cost_b.reshape(-1)).reshape(tiles, blocks, f)
        fin = torch.where(cost_b > 0, fin, arr)  # a task left out, or a tile without rows: none runs
        extra = 0
        if op_kind(k.op).allreduces_stats and lanes > 1:
            extra = allreduce_cycles(lanes, hw)
        if extra:  # the all-reduce: a barrier over the block's tasks
            fin = fin.amax(dim=(0, 2), keepdim=True).expand_as(fin) + extra
        if stays(self.p, k):  # made where it stays: the last share of each result (``homes.py``)
            has = (rows > 0)[:, :, None].expand_as(fin)
            ready = torch.where(has, fin, torch.iinfo(torch.int64).min).amax(dim=0)
        elif tiles > 1:
            share = self._share_sends(k, rows, b)
            heads = self._lane_heads(k, reads, fin, share, px, py)
            ready = self._edge_ready(heads, share, rows, wave, self.live(k.name, b))
        else:
            ready = fin[0] + to_east
        flow = self._out_flow(k, ready, b, wave)
        if flow.back is not None and tiles > 1 and r.x == 0:  # tile 0's shares leave from column 0
            flow.home0 = (self.waves(rows[0], k.dtype), px[0] == 0)
        busy = torch.zeros(r.pes, dtype=torch.int64).index_add_(0, pes_b.reshape(-1), cost_b.reshape(-1))
        ran = (cost_b > 0).reshape(-1).to(torch.int64)
        overhead = torch.zeros(r.pes, dtype=torch.int64).index_add_(
            0, pes_b.reshape(-1), task_overhead(ran, ran * ops, hw)
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


def _users(held_x: torch.Tensor, moving: torch.Tensor, width: int) -> torch.Tensor:
    """How many (column, output) pairs of each column send partial sums over its bus."""
    return torch.zeros(width, dtype=torch.int64).index_add_(0, held_x, moving.to(torch.int64))


def simulate(
    program: ProgramData,
    activity: Mapping[str, torch.Tensor] | None = None,
    device: str | torch.device | None = None,
) -> Timeline:
    """Time ``program`` (module docstring); ``activity[value]`` is ``[rows, features]`` bool, which
    elements of a value (a program input or a kernel's result) are nonzero.

    ``device`` runs the clock's tensors there (CPU by default): every tensor it makes is made there,
    and the program's arrays and ``activity`` are moved there once. The timeline comes back on the
    CPU, the same cycle for cycle wherever it ran. ``sparsefx.run`` always times on the host, wherever
    the values were computed: the clock is small-integer, data-dependent scheduling over many tiny
    tensors, so on a GPU each of its ops is a kernel launch and each ``.tolist()``/``int()`` a host
    sync, and it runs slower there than on the CPU."""
    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type == "cpu":
        return _simulate(FastClock(program, activity))
    with dev:  # factory calls (``torch.arange``, ``torch.zeros``...) make their tensors on ``dev``
        return _on_cpu(_simulate(FastClock(program, activity, device=dev)))


def _simulate(clock: FastClock) -> Timeline:
    program = clock.p
    kernels = [clock.time(k) for k in program.kernels]
    hw, mesh = program.hardware, program.mesh
    heads, sends, rows = [], [], []
    for name in program.outputs:  # each message's head reaches the mesh's east edge, then the host
        flow = clock.flows[name]
        hops = mesh.width - flow.east if flow.east >= 0 else mesh.width  # east, off the mesh
        heads.append((flow.depart() + hops * hw.hop_cycles).cpu())
        sends.append(flow.sends.cpu())
        rows.append((clock.row0(name) + flow.lane.cpu())[None, :].expand_as(heads[-1]))
    heads = edge_queued(heads, sends, rows)  # outputs that share a row share its links to the edge
    messages = dict(zip(program.outputs, zip(heads, sends)))
    done = outputs_in_host(messages, hw.host_wavelets_per_cycle)
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
