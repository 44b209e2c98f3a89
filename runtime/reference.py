"""The reference executor: a discrete-event simulation of the mesh, and the definition of its timing.

``ReferenceMachine`` plays a whole program on one queue of events in time order (``runtime/events.py``):

- **Values are what the PEs compute.** Each PE of a sparse matmul does one AXPY per stored nonzero of
  the input columns it receives; the partial sums of an output add up along its reduction route, in
  the route's order (``runtime/pe_values.py``). Other kernels apply their op's rule
  (``runtime.semantics``) to the values their inputs' PEs computed. The values do not depend on when a
  task runs, so they are computed first; the events then time the same work, and a message is
  filtered when the value it carries, as the PEs hold it, is all zero.
- **Messages travel hop by hop** (``runtime/journeys.py``): every link a message crosses is a request
  to the fabric, which serves one wavelet per cycle per direction and arbitrates round-robin by color
  among the messages whose heads have arrived. Who goes first is decided by time, across kernels.
- **Tasks are triggered by data.** A PE runs a task when the messages it needs have arrived, one task
  at a time, first arrived first run (``Cores``): a sparse matmul's task is one input column (the
  AXPYs of its local nonzeros) for one block of rows; a message the sender filtered triggers none. A
  PE's block is done when every message of its columns has come (or is known filtered), its tasks
  have run and its previous block is done.
- **Partial sums** go down and up each column to their output's lane, merging on each PE that holds
  the same output (it sends on when its own block is done and the sum from above has arrived), then
  east along the lane across the columns holding it, then to the region's east edge (in a streaming
  program, unless it is a program output, the sum stays where it ends: ``runtime/homes.py``). Each
  merge is a vector add on the PE where the parts meet (``partial_add_cycles``, part of that PE's
  work).
- **Kernels** all start at cycle 0 in a pipelined program. In a streaming one each starts when the
  kernel before has ended and its own weights are loaded (``load_cycles``, loaded while the kernel
  before runs), and reads stored values sent again in its own step.
- **Outputs** leave the mesh past its east edge; the run ends when the last has reached the host.

    >>> import sparsefx
    >>> torch.manual_seed(0) and None
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()), 0.9)
    >>> x = torch.randn(4, 32)
    >>> program = sparsefx.lower(sm, x, mesh=(8, 8))
    >>> outputs, timeline = execute(program, x)
    >>> torch.allclose(outputs, sm.eval()(x), rtol=1e-4, atol=1e-5), timeline.cycles > 0
    (True, True)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from sparsefx.errors import EmulationError

from .blocking import kernel_lanes
from .cost import (
    allreduce_cycles,
    block_rows,
    epilogue_cycles,
    features_of,
    idle_tasks,
    load_cycles,
    ops_per_element,
    partial_add_cycles,
    row_streaming,
    rows_of,
    sparse_task_cycles,
    task_cycles,
    task_overhead,
    wavelets,
)
from .encoding import sparse_arrays
from .evaluate import bind_inputs, rebuild_outputs
from .events import Cores, Events, Fabric
from .homes import back, stays
from .homes import shares as kept_shares
from .host import outputs_in_host
from .journeys import Journeys, Sent
from .layout import layout, weight_bytes
from .op_kinds import op_kind
from .pe_values import route_product
from .program import DTYPES, Kernel, ProgramData, lane_bounds
from .semantics import apply
from .sparse_eval import sparse_matmul
from .tiles import tile_place, tile_rows
from .timeline import Flow, KernelTime, Timeline

__all__ = ["ReferenceMachine", "execute", "time_patterns", "MAX_PES"]

MAX_PES = 64 * 64
"""The largest mesh the reference executor takes (it is meant for meshes up to about 32x32)."""


class _When:
    """A cycle not known yet: callbacks wait for it."""

    __slots__ = ("t", "_waiting")

    def __init__(self) -> None:
        self.t: int | None = None
        self._waiting: list[Callable[[int], None]] = []

    def set(self, t: int) -> None:
        self.t = t
        waiting, self._waiting = self._waiting, []
        for fn in waiting:
            fn(t)

    def then(self, fn: Callable[[int], None]) -> None:
        if self.t is None:
            self._waiting.append(fn)
        else:
            fn(self.t)


class _Join:
    """The latest of ``count`` cycles (no earlier than ``floor``); ``then(latest)`` once all have come."""

    __slots__ = ("left", "t", "then")

    def __init__(self, count: int, floor: int, then: Callable[[int], None]) -> None:
        self.left, self.t, self.then = count, floor, then

    def note(self, t: int) -> None:
        self.t = max(self.t, t)
        self.left -= 1
        if self.left == 0:
            self.then(self.t)


class _Edge:
    """A result's shares (one a row tile) reaching its region's east edge. Their wavelets pass the
    edge in turn, as the whole message's would: the result is there, for its lane's departures, when
    its last wavelet is less the whole message's, and no earlier than its first share's head
    (``tiles.edge_ready``, the fast clock's rule)."""

    __slots__ = ("left", "head", "tail", "full", "then")

    def __init__(self, count: int, full: int, then: Callable[[int], None]) -> None:
        self.left, self.head, self.tail, self.full, self.then = count, None, 0, full, then

    def note(self, head: int, sends: int) -> None:
        self.head = head if self.head is None else min(self.head, head)
        self.tail = max(self.tail, head + sends)
        self.left -= 1
        if self.left == 0:
            self.then(max(self.head, self.tail - self.full))


def _sizes(rows: int, b: int) -> list[int]:
    rows = max(rows, 1)
    n = math.ceil(rows / b)
    return [b] * (n - 1) + [rows - b * (n - 1)]


class _Run:
    """One kernel's run: when it started, what it waits for, and its outgoing messages."""

    def __init__(self, k: Kernel, t0: int, load: tuple[int, int] | None, out: Sent) -> None:
        self.k, self.t0, self.load, self.out = k, t0, load, out
        self.left = 0  # outgoing messages not yet at the region's edge
        self.first: int | None = None  # the first task's arrival
        self.latest: dict[str, int] = {}  # per input: its last message's arrival
        self.fields: dict[str, Any] = {}  # the rest of the KernelTime
        self.epilogue: list[int] | None = None  # a sparse matmul's epilogue cycles in each block


class ReferenceMachine:
    """The mesh played event by event (module docstring): one ``Events`` queue for the whole program,
    the ``Fabric``'s links, the PEs' ``Cores``, and each kernel's tasks, joins and messages. It is the
    definition that ``FastClock`` (``runtime/fast.py``), which evaluates the same rules vectorized over
    PEs and messages, is checked against.

    With ``patterns`` (``time_patterns``) it only times: each value stands in as its zero pattern (1
    where the value is nonzero), so the same rules filter the same zeros without computing."""

    def __init__(
        self,
        program: ProgramData,
        inputs: dict[str, torch.Tensor],
        patterns: dict[str, torch.Tensor] | None = None,
        listener: Callable[[Kernel, list[torch.Tensor], torch.Tensor], None] | None = None,
    ) -> None:
        self.p = program
        self.listener = listener
        self.patterns = patterns
        self.hw = program.hardware
        self.hop = self.hw.hop_cycles
        self.streaming = program.mode == "streaming"
        self.ev = Events()
        self.fabric = Fabric(self.ev)
        self.cores = Cores(self.ev)
        self.tensors: dict[str, torch.Tensor] = {}
        self.values: dict[str, Sent] = {}
        self.times: dict[str, KernelTime] = {}
        self.at_edge: dict[str, list[tuple[int, int]]] = {}  # output -> (head at the east edge, wavelets)
        self.loader_free = 0
        self.outputs = set(program.outputs)
        row0: dict[str, int] = {}
        self.journeys = Journeys(self.ev, self.fabric, self.hop, self.streaming, row0)
        self._compute(inputs)
        color = 0
        for s in program.inputs:
            if s.name in self.tensors:
                self._host_value(s.name, s.shape, s.dtype, color)
                row0[s.name] = 0
                color += 1
        for k in program.kernels:
            self.values[k.name] = self._sent(k, color)
            row0[k.name] = k.region.y
            color += 1
        self.reduce_color = {k.name: color + i for i, k in enumerate(program.kernels)}

    # -- values: what the PEs compute (they do not depend on timing) ---------------------------------

    def _compute(self, inputs: dict[str, torch.Tensor]) -> None:
        for s in self.p.inputs:
            if s.name in inputs:
                self.tensors[s.name] = (
                    inputs[s.name] if self.patterns is None else self._stand_in(s.name, s.shape)
                )
        with torch.no_grad():
            for k in self.p.kernels:
                if self.patterns is not None:
                    self.tensors[k.name] = self._stand_in(k.name, k.shape)
                    continue
                args = [self.tensors[n] for n in k.inputs]
                out = self._sparse_value(k, args) if k.op == "sparse_matmul" else apply(self.p, k, args)
                self.tensors[k.name] = out
                if self.listener is not None:
                    self.listener(k, args, out)

    def _sparse_value(self, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
        arrays = sparse_arrays(self.p, k)
        r = k.region
        lanes = kernel_lanes(k, int(k.attrs["out_features"]))

        def product(s: Any, x: torch.Tensor) -> torch.Tensor:
            return route_product(s, x, r.width, r.height, lanes)

        where = f"kernel {k.name!r} ({k.op})"
        out = sparse_matmul(arrays, k.attrs, (r.width, r.height), inputs[0], k.shape, where, product)
        return out.to(DTYPES[k.dtype])

    def _stand_in(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """Timing only: 1.0 where value ``name`` is nonzero (every element, when its pattern is unknown)."""
        assert self.patterns is not None
        seen = self.patterns.get(name)
        if seen is None or seen.numel() != math.prod(shape):
            return torch.ones(shape)
        return seen.reshape(shape).to(torch.float32)

    def _host_value(self, name: str, shape: tuple[int, ...], dtype: str, color: int) -> None:
        f, rows = features_of(shape), rows_of(shape)
        lanes = max(1, min(self.p.mesh.height, f))
        stretch = max(1.0, lanes / self.hw.host_wavelets_per_cycle)
        wave = math.ceil(wavelets(rows, dtype, self.hw) * stretch)
        tensor = self.tensors[name]
        self.values[name] = Sent(
            name, dtype, f, lanes, rows, max(rows, 1), [wave], -1, color, tensor, [[0] * f]
        )

    def _sent(self, k: Kernel, color: int) -> Sent:
        f = features_of(k.shape)
        b = block_rows(k)
        wave = [wavelets(n, k.dtype, self.hw) for n in _sizes(rows_of(k.shape), b)]
        east = k.region.x + k.region.width - 1
        lanes = kernel_lanes(k, f)
        sent = Sent(k.name, k.dtype, f, lanes, rows_of(k.shape), b, wave, east, color, self.tensors[k.name])
        if stays(self.p, k):  # kept where its row tiles make it (``homes.py``)
            px, _, rows = kept_shares(self.p, k)
            sent.homes, sent.back = (px.tolist(), rows.tolist()), back(self.p, k)
        return sent

    # -- the play ------------------------------------------------------------------------------------

    def play(self) -> Timeline:
        """Every kernel and message of the program on one event queue; the ``Timeline``."""
        kernels = self.p.kernels
        for name in self.p.outputs:
            self._to_host(self.values[name])
        if self.streaming:
            if kernels:
                self._begin(0, 0, 0)
        else:
            for k in kernels:
                self._start(k, 0, None)
        for s in self.p.inputs:  # program inputs leave the host at once (pipelined; and to the host)
            v = self.values.get(s.name)
            if v is not None:
                for q in range(v.blocks):
                    for f in range(v.features):
                        self._ready(v, q, f, 0)
        self.ev.run()
        missing = [k.name for k in kernels if k.name not in self.times]
        if missing:
            raise EmulationError(f"the reference machine stalled: kernel {missing[0]!r} never finished")
        times = [self.times[k.name] for k in kernels]
        edge = {n: torch.tensor(self.at_edge.get(n, []), dtype=torch.int64) for n in self.p.outputs}
        edge = {n: (m.view(-1, 2)[:, 0], m.view(-1, 2)[:, 1]) for n, m in edge.items()}
        done = outputs_in_host(edge, self.hw.host_wavelets_per_cycle)
        cycles = max([kt.end for kt in times] + list(done.values()) + [0])
        flows = {name: self._flow(v) for name, v in self.values.items()}
        return Timeline(times, flows, cycles, done)

    def _flow(self, v: Sent) -> Flow:
        ready = torch.tensor(v.ready, dtype=torch.int64).reshape(v.blocks, v.features).clamp(min=0)
        wave = torch.tensor(v.wave, dtype=torch.int64)
        flow = Flow(v.name, v.dtype, v.features, v.lanes, v.rows, v.block, wave, v.east, ready, v.flags)
        flow.back = v.back
        return flow

    def _to_host(self, v: Sent) -> None:
        """Every message of output ``v`` goes on past the mesh's east edge to the host, which takes it
        by ``host.outputs_in_host``."""
        key = "" if not self.streaming else "host"
        width = self.p.mesh.width

        heads = self.at_edge.setdefault(v.name, [])

        def arrived(s: int) -> Callable[[int], None]:
            return lambda t: heads.append((t - s, s))  # the tail at the edge: its head came ``s`` before

        for q in range(v.blocks):
            for f in range(v.features):
                self.journeys.need(v, key, q, f, width, self.journeys.row(v, f), arrived(v.sends[q][f]))

    def _ready(self, v: Sent, q: int, f: int, t: int) -> None:
        """Message ``(q, f)`` of ``v`` can leave its producer's edge at ``t``."""
        v.ready[q][f] = t
        if not self.streaming:
            self.journeys.launch(v, "", q, f, t)
        elif v.name in self.outputs:  # streaming: an output goes to the host as soon as it is ready
            self.journeys.launch(v, "host", q, f, t)

    def _begin(self, i: int, prev_start: int, prev_end: int) -> None:
        """Streaming: kernel ``i`` loads its weights from when the kernel before started (the loader
        permitting) and starts when both that kernel has ended and its weights are in."""
        k = self.p.kernels[i]
        begin = max(self.loader_free, prev_start)
        done = begin + load_cycles(weight_bytes(self.p, k), self.hw)
        self.loader_free = done
        t0 = max(prev_end, done)
        self.ev.at(t0, self._start, k, t0, (begin, done))

    def _start(self, k: Kernel, t0: int, load: tuple[int, int] | None) -> None:
        run = _Run(k, t0, load, self.values[k.name])
        if k.op == "sparse_matmul":
            self._sparse(run)
        elif k.op == "constant":
            self._constant(run)
        else:
            self._dense(run)
        if self.streaming:  # stored values go again, from their producers, in this kernel's step
            for name in dict.fromkeys(k.inputs):
                v = self.values[name]
                # kept where made: on its lanes' schedule, as the fast clock sends it (``homes.py``)
                slots = self._flow(v).depart(t0).tolist() if v.homes is not None else None
                for q in range(v.blocks):  # the whole value again, each lane block by block
                    for f in range(v.features):
                        start = max(v.ready[q][f], t0) if slots is None else slots[q][f]
                        self.journeys.launch(v, k.name, q, f, start)
        if run.left == 0:
            self.ev.at(t0, self._end, run)

    def _key(self, k: Kernel) -> str:
        return k.name if self.streaming else ""

    def _leave(
        self,
        run: _Run,
        q: int,
        f: int,
        t: int,
        x: int,
        rows: int | None = None,
        then: Callable[[int, int], None] | None = None,
    ) -> None:
        """Result ``(q, f)`` of ``run``'s kernel is at column ``x`` at ``t``: east along its lane to the
        region's edge (nothing on the links when it is all zero), then off to its readers. ``rows``:
        only that many of the block's rows leave from ``x`` (a row tile's share), and ``then(cycle,
        wavelets)`` when their head reaches the edge (``_Edge``: the result is there when every share is)."""
        v, k = run.out, run.k
        row = k.region.y + v.lane(f)
        live = v.live is None or v.live[q][f]
        if v.homes is not None:  # it stays on the mesh (``homes.py``)
            home = v.homes[0][-1][f]
            if k.op == "sparse_matmul" and home != x:  # a sum, along its lane to its own column
                self._move(run, q, f, t, x, home, row, v.wave[q] if live else 0)
            elif then is None:
                self._settled(run, q, f, t, x, row)
            else:
                then(t, 0)
            return
        east = k.region.x + k.region.width - 1
        sends = (v.wave[q] if rows is None else wavelets(rows, v.dtype, self.hw)) if live else 0

        def step(c: int, t: int) -> None:
            if c >= east:
                if then is None:
                    self._settled(run, q, f, t, east, row)
                else:
                    then(t, sends)
                return
            self.fabric.request((c, row, "E"), t, sends, v.color, lambda g: step(c + 1, g + self.hop))

        step(x, t)

    def _move(self, run: _Run, q: int, f: int, t: int, x: int, home: int, row: int, sends: int) -> None:
        """Result ``(q, f)``, whole at column ``x`` at ``t``, moves along its lane's row to column
        ``home`` (``sums.spread_columns``), one link at a time; there it is ready for its readers."""
        way, by = ("E", 1) if home > x else ("W", -1)

        def step(c: int, t: int) -> None:
            if c == home:
                self._settled(run, q, f, t, home, row)
                return
            self.fabric.request((c, row, way), t, sends, run.out.color, lambda g: step(c + by, g + self.hop))

        step(x, t)

    def _settled(self, run: _Run, q: int, f: int, t: int, x: int, row: int) -> None:
        """Result ``(q, f)`` is where it stays, or at the region's edge, at ``t`` on PE ``(x, row)``: a
        sparse matmul's epilogue (``cost.epilogue_cycles``) runs there as a task first."""
        cost = run.epilogue[q] if run.epilogue is not None else 0
        if not cost:
            self._at_edge(run, q, f, t)
            return
        r = run.k.region
        pe = (row - r.y) * r.width + (x - r.x)
        run.fields["busy"][pe] += cost
        run.fields["overhead"][pe] += self.hw.task_start_cycles
        self.cores.submit((x, row), t, q * run.out.features + f, cost, lambda e: self._at_edge(run, q, f, e))

    def _at_edge(self, run: _Run, q: int, f: int, t: int) -> None:
        """Result ``(q, f)`` is at the region's east edge at ``t``: ready for its readers."""
        self._ready(run.out, q, f, t)
        run.left -= 1
        if run.left == 0:
            self._end(run)

    def _end(self, run: _Run) -> None:
        k = run.k
        if k.name in self.times:
            return
        end = max(self._flow(run.out).end(self.streaming, run.t0), run.t0)  # the rule both executors share
        kt = KernelTime(k.name, k.op, run.first if run.first is not None else run.t0, end, **run.fields)
        kt.load = run.load
        latest = run.latest
        if latest:
            name, when = max(latest.items(), key=lambda kv: kv[1])
            kt.waits_on = "previous" if self.streaming and run.t0 >= when else name
        else:
            kt.waits_on = "previous" if self.streaming and run.t0 > 0 else None
        if (
            self.streaming
            and run.load is not None
            and run.load[1] >= max(kt.start, 1)
            and kt.waits_on != "previous"
        ):
            kt.waits_on = "load"
        self.times[k.name] = kt
        if self.streaming:
            i = next(i for i, kk in enumerate(self.p.kernels) if kk.name == k.name)
            if i + 1 < len(self.p.kernels):
                self._begin(i + 1, kt.start, kt.end)

    def _arrive(self, run: _Run, name: str, t: int) -> None:
        run.latest[name] = max(run.latest.get(name, t), t)

    # -- kernels -------------------------------------------------------------------------------------

    def _constant(self, run: _Run) -> None:
        k, v = run.k, run.out
        zeros = torch.zeros(k.region.pes, dtype=torch.int64)
        run.fields = {"busy": zeros, "overhead": zeros.clone(), "blocks": v.blocks}
        for q in range(v.blocks):
            for f in range(v.features):
                self.ev.at(run.t0, self._ready, v, q, f, run.t0)  # after every reader has said what it needs

    def _dense(self, run: _Run) -> None:
        k, v, hw, r = run.k, run.out, self.hw, run.k.region
        f_all, blocks = v.features, v.blocks
        sizes = _sizes(v.rows, v.block)
        px, py, pe = (t.tolist() for t in tile_place(k, f_all))
        tiles = len(px)  # each block's rows split over the row tiles (``runtime/tiles.py``)
        shares = tile_rows(torch.tensor(sizes), tiles).tolist()  # [tile][block] rows
        rows = rows_of(k.shape)
        sources = []  # (value, streams, src feature of each feature)
        for name in dict.fromkeys(k.inputs):
            src = self.values[name]
            if src.features == 0:  # an empty value (a cat's empty cache, say) sends no message
                continue
            picks = [min(f * src.features // max(f_all, 1), src.features - 1) for f in range(f_all)]
            sources.append((src, row_streaming(self.p, k, name), picks))
        heard = torch.zeros((blocks, f_all), dtype=torch.bool)
        for src, streams, picks in sources:
            for q in range(blocks):
                for f in range(f_all):
                    heard[q, f] |= any(
                        src.live is None or src.live[qs][picks[f]]
                        for qs in src.cover(q, v.block, rows, streams)
                    )
        idle = idle_tasks(k.op, heard, v.flags)
        ops = ops_per_element(self.p, k)
        busy = torch.zeros(r.pes, dtype=torch.int64)
        overhead = torch.zeros(r.pes, dtype=torch.int64)
        extra = 0
        if op_kind(k.op).allreduces_stats and v.lanes > 1:  # the statistics' all-reduce across the lanes
            extra = allreduce_cycles(v.lanes, hw)
        run.fields = {"busy": busy, "overhead": overhead, "blocks": blocks, "messages": blocks * f_all}
        run.left = blocks * f_all
        for q in range(blocks):
            parts = [tt for tt in range(tiles) if shares[tt][q]]  # the tiles with rows of this block
            edges = [
                _Edge(
                    len(parts),
                    v.wave[q] if v.homes is None and (v.live is None or v.live[q][f]) else 0,
                    partial(self._at_edge, run, q, f),
                )
                for f in range(f_all)
            ]
            shared = [(px[tt][f], shares[tt][q], edges[f].note) for tt in parts for f in range(f_all)]
            barrier = _Join(
                len(shared),
                0,
                lambda t, q=q, shared=shared: [
                    self._leave(run, q, i % f_all, t + extra, *s) for i, s in enumerate(shared)
                ],
            )
            for i, (tt, f) in enumerate((tt, f) for tt in parts for f in range(f_all)):
                c = 0 if idle is not None and idle[q, f] else task_cycles(ops, shares[tt][q], k.dtype, hw)
                busy[pe[tt][f]] += c
                overhead[pe[tt][f]] += task_overhead(1, ops, hw) if c else 0
                then = barrier.note if extra else partial(self._leave_at, run, q, f, shared[i])
                self._dense_task(run, q, f, (px[tt][f], py[f]), c, sources, then)

    def _leave_at(self, run: _Run, q: int, f: int, share: tuple, t: int) -> None:
        self._leave(run, q, f, t, *share)

    def _dense_task(
        self,
        run: _Run,
        q: int,
        f: int,
        at: tuple[int, int],
        c: int,
        sources: list,
        then: Callable[[int], None],
    ) -> None:
        """Task ``(q, f)`` of ``c`` cycles on PE ``at`` once its input messages (``sources``) are there;
        ``then(cycle)`` when it is done (a task left out: when it would have started)."""
        k, v = run.k, run.out
        rows = rows_of(k.shape)

        def arrived(a: int) -> None:
            run.first = a if run.first is None else min(run.first, a)
            if c:
                self.cores.submit(at, a, q * v.features + f, c, then)
            else:
                then(a)  # a task left out: none runs

        count = sum(len(src.cover(q, v.block, rows, streams)) for src, streams, _ in sources)
        join = _Join(count, run.t0, arrived)
        if count == 0:
            self.ev.at(run.t0, arrived, run.t0)
        for src, streams, picks in sources:
            for qs in src.cover(q, v.block, rows, streams):
                self.journeys.need(src, self._key(k), qs, picks[f], *at, self._noting(run, src.name, join))

    def _noting(self, run: _Run, name: str, join: _Join) -> Callable[[int], None]:
        def arrived(t: int) -> None:
            self._arrive(run, name, max(t, run.t0))
            join.note(t)

        return arrived

    def _sparse(self, run: _Run) -> None:
        k, out, hw, r, t0 = run.k, run.out, self.hw, run.k.region, run.t0
        conv = k.attrs.get("kind") in ("conv1d", "conv2d")
        s = layout(self.p, k)
        b, blocks = out.block, out.blocks
        sizes = _sizes(out.rows, b)
        v = self.values[k.inputs[0]]
        streams = row_streaming(self.p, k, v.name) and not conv
        rows = rows_of(k.shape)
        if conv:
            sent = [[True] * s.in_features for _ in range(blocks)]
        else:
            x2d = self.tensors[v.name].reshape(-1, s.in_features) != 0
            sent = [x2d[q * b : q * b + n].any(dim=0).tolist() for q, n in enumerate(sizes)]
        widths, in_lo, counts = (s.in_hi - s.in_lo).tolist(), s.in_lo.tolist(), s.counts.tolist()
        columns, at = [], 0  # per PE: [(input feature, nonzeros)]
        for pe in range(r.pes):
            columns.append([(in_lo[pe] + c, counts[at + c]) for c in range(widths[pe])])
            at += widths[pe]
        busy = torch.zeros(r.pes, dtype=torch.int64)
        overhead = torch.zeros(r.pes, dtype=torch.int64)
        axpys = skipped_axpys = 0
        ran = set()
        for pe in range(r.pes):
            for q in range(blocks):
                for j, n in columns[pe]:
                    if not sent[q][j]:
                        skipped_axpys += n
                    elif n:
                        busy[pe] += sparse_task_cycles(n, sizes[q], k.dtype, hw)
                        overhead[pe] += task_overhead(1, n, hw)
                        axpys += n
                        ran.add(q)
        run.fields = {
            "busy": busy,
            "overhead": overhead,
            "blocks": blocks,
            "messages": sum(1 for q in range(blocks) for j in range(s.in_features) if sent[q][j]),
            "skipped": sum(1 for q in range(blocks) for j in range(s.in_features) if not sent[q][j]),
            "axpys": axpys,
            "skipped_axpys": skipped_axpys,
        }
        if "epilogue" in k.attrs:  # none runs in a block whose sums are all zero
            run.epilogue = [epilogue_cycles(k, n, hw) if q in ran else 0 for q, n in enumerate(sizes)]
        done = [[_When() for _ in range(blocks)] for _ in range(r.pes)]
        self._reduce(run, s, done, [w if q in ran else 0 for q, w in enumerate(out.wave)], conv)
        for pe in range(r.pes):
            x, y = r.coords(pe)
            for q in range(blocks):
                tasks = sum(1 for j, n in columns[pe] if sent[q][j] and n)
                barrier = _Join(len(columns[pe]) + tasks + (q > 0), t0, done[pe][q].set)
                if q > 0:
                    done[pe][q - 1].then(barrier.note)
                if barrier.left == 0:
                    self.ev.at(t0, done[pe][q].set, t0)
                for j, n in columns[pe]:
                    f = v.features - 1 if conv else j
                    cover = v.cover(q, b, rows, streams)
                    cost = sparse_task_cycles(n, sizes[q], k.dtype, hw) if sent[q][j] else 0

                    def arrived(
                        a: int, pe: int = pe, q: int = q, j: int = j, cost: int = cost, bar: _Join = barrier
                    ) -> None:
                        bar.note(a)
                        if cost:
                            run.first = a if run.first is None else min(run.first, a)
                            self.cores.submit(r.coords(pe), a, q * s.in_features + j, cost, bar.note)

                    join = _Join(len(cover), t0, arrived)
                    for qs in cover:
                        self.journeys.need(v, self._key(k), qs, f, x, y, self._noting(run, v.name, join))

    def _reduce(self, run: _Run, s: Any, done: list[list[_When]], wave: list[int], conv: bool) -> None:
        """Partial sums down and up each column to their output's lane, merging where a PE holds the same
        output, then east across the columns that hold it; each sum then leaves for the region's edge."""
        k, r, out = run.k, run.k.region, run.out
        color = self.reduce_color[k.name]
        out_f = s.out_features
        lanes = kernel_lanes(k, out_f)
        bounds = lane_bounds(out_f, lanes).tolist()
        lane_of = [bisect.bisect_right(bounds, o) - 1 for o in range(out_f)]
        holders: dict[tuple[int, int], list[int]] = {}  # (column, output) -> rows holding it
        out_lo, span = s.out_lo.tolist(), s.span.clamp(max=out_f).tolist()
        for pe in range(r.pes):
            cx, cy = pe % r.width, pe // r.width
            for i in range(span[pe]):
                holders.setdefault((cx, (out_lo[pe] + i) % max(out_f, 1)), []).append(cy)
        self._adds(run, holders, lane_of, wave)
        south = torch.zeros((r.width, r.height), dtype=torch.int64)
        north = torch.zeros((r.width, r.height), dtype=torch.int64)
        run.fields["bus"] = (south, north)
        blocks = out.blocks
        east = r.x + r.width - 1
        features = features_of(k.shape)
        if conv:  # a convolution's channels are not its features: a block leaves when all its sums are in
            run.left = blocks * features
            gates = [
                _Join(0, run.t0, lambda t, q=q: [self._leave(run, q, f, t, east) for f in range(features)])
                for q in range(blocks)
            ]
        else:
            run.left = blocks * out_f
        by_output: dict[int, list[int]] = {}
        for cx, o in holders:
            by_output.setdefault(o, []).append(cx)
        for q in range(blocks):
            at_lane: dict[tuple[int, int], _When] = {}
            for (cx, o), ys in holders.items():
                at_lane[(cx, o)] = self._column_sum(
                    run, color, wave[q], done, cx, sorted(ys), lane_of[o], q, south, north
                )
            for o in range(out_f):
                cols = sorted(by_output.get(o, ()))
                row = r.y + lane_of[o]
                then = self._gate(gates[q]) if conv else self._leaving(run, q, o)
                if not cols:
                    self.ev.at(run.t0, then, run.t0, east)
                    continue
                self._lane_sum(
                    color,
                    wave[q],
                    [at_lane[(c, o)] for c in cols],
                    cols,
                    r.x,
                    row,
                    then,
                )
        if conv:
            for g in gates:
                if g.left == 0:
                    self.ev.at(run.t0, g.then, run.t0)

    def _adds(
        self, run: _Run, holders: dict[tuple[int, int], list[int]], lane_of: list[int], wave: list[int]
    ) -> None:
        """Each PE where two parts of an output meet adds one into the other (``partial_add_cycles``):
        a holding row that a side's sum passes, the lane's PE (every part that meets there but one),
        and each column east of the output's first. A block whose sums are all zero sends none and adds
        nothing. The adds are the PE's work, not the sum's way: an add keeps pace with the wavelets it
        reads (``runtime/cost.py``); the fast clock counts the same (``intervals.merges``)."""
        k, r = run.k, run.k.region
        sizes = _sizes(run.out.rows, run.out.block)
        cycles = sum(partial_add_cycles(n, k.dtype, self.hw) for n, w in zip(sizes, wave) if w)
        count = torch.zeros(r.pes, dtype=torch.int64)  # adds per block
        west: dict[int, int] = {}
        for (cx, o), ys in holders.items():
            lane = lane_of[o]
            above, below = sorted(y for y in ys if y < lane), sorted(y for y in ys if y > lane)
            for y in above[1:] + below[:-1]:  # each side's sum starts at its farthest holder
                count[y * r.width + cx] += 1
            count[lane * r.width + cx] += max((lane in ys) + bool(above) + bool(below) - 1, 0)
            west[o] = min(west.get(o, cx), cx)
        for cx, o in holders:
            if cx > west[o]:  # the sum from the west adds in
                count[lane_of[o] * r.width + cx] += 1
        run.fields["busy"] += count * cycles
        run.fields["overhead"] += task_overhead(0, count * sum(1 for w in wave if w), self.hw)

    def _gate(self, gate: _Join) -> Callable[[int, int], None]:
        gate.left += 1
        return lambda t, x: gate.note(t)

    def _leaving(self, run: _Run, q: int, o: int) -> Callable[[int, int], None]:
        return lambda t, x: self._leave(run, q, o, t, x)

    def _column_sum(
        self,
        run: _Run,
        color: int,
        wave: int,
        done: list[list[_When]],
        cx: int,
        ys: list[int],
        lane: int,
        q: int,
        south: torch.Tensor,
        north: torch.Tensor,
    ) -> _When:
        """When the sum of an output held at rows ``ys`` of column ``cx`` is whole on its lane's PE."""
        r = run.k.region
        result = _When()
        sides = [
            side
            for side in (
                ("S", [y for y in ys if y < lane], 1, south),
                ("N", [y for y in ys if y > lane][::-1], -1, north),
            )
            if side[1]
        ]
        join = _Join(len(sides) + (lane in ys), 0, result.set)
        if lane in ys:
            done[lane * r.width + cx][q].then(join.note)
        for name, rows, step, bus in sides:
            for y in range(rows[0], lane, step):
                bus[cx, y] += wave
            self._vertical_sum(color, wave, done, r, cx, set(rows), rows[0], lane, q, name, step, join)
        return result

    def _vertical_sum(
        self,
        color: int,
        wave: int,
        done: list[list[_When]],
        r: Any,
        cx: int,
        held: set[int],
        first: int,
        lane: int,
        q: int,
        name: str,
        step: int,
        join: _Join,
    ) -> None:
        """One side's chain: from the farthest holder toward the lane, each holder adding its own sum when
        its block is done and the sum from beyond it has arrived."""
        x = r.x + cx

        def hop(y: int, t: int) -> None:
            if y == lane:
                join.note(t)
                return

            def granted(g: int) -> None:
                nxt = y + step
                if nxt in held:
                    done[nxt * r.width + cx][q].then(lambda d: hop(nxt, max(g + self.hop, d)))
                else:
                    hop(nxt, g + self.hop)

            self.fabric.request((x, r.y + y, name), t, wave, color, granted)

        done[first * r.width + cx][q].then(lambda d: hop(first, d))

    def _lane_sum(
        self,
        color: int,
        wave: int,
        sums: list[_When],
        cols: list[int],
        x0: int,
        row: int,
        then: Callable[[int, int], None],
    ) -> None:
        """An output's column sums east along its lane from its first column to its last, merging."""
        at = dict(zip(cols, sums))

        def hop(c: int, t: int) -> None:
            if c == cols[-1]:
                then(t, x0 + c)
                return

            def granted(g: int) -> None:
                if c + 1 in at:
                    at[c + 1].then(lambda d: hop(c + 1, max(g + self.hop, d)))
                else:
                    hop(c + 1, g + self.hop)

            self.fabric.request((x0 + c, row, "E"), t, wave, color, granted)

        at[cols[0]].then(lambda d: hop(cols[0], d))


def execute(
    program: ProgramData,
    inputs: Any,
    device: torch.device | None = None,
    listener: Callable[[Kernel, list[torch.Tensor], torch.Tensor], None] | None = None,
) -> tuple[Any, Timeline]:
    """Run ``program`` on ``inputs`` event by event: the outputs (the model's structure, their tensors
    moved to ``device`` when given) and the ``Timeline`` (module docstring). It runs on the CPU.
    ``listener(kernel, inputs, result)`` sees each kernel's values as the PEs computed them, as
    ``evaluate``'s does. Meshes over ``MAX_PES`` PEs are an ``EmulationError``."""
    if not program.has_payloads:
        raise EmulationError("the program has no payloads (parsed from text?); load it from a program file")
    _check_size(program)
    bound = bind_inputs(program, inputs)
    machine = ReferenceMachine(program, {n: t.cpu() for n, t in bound.items()}, listener=listener)
    timeline = machine.play()
    values = [machine.tensors[n] for n in program.outputs]
    if device is not None:
        values = [v.to(device) for v in values]
    return rebuild_outputs(program.output_tree, values, program.output_spec), timeline


def time_patterns(program: ProgramData, patterns: dict[str, torch.Tensor]) -> Timeline:
    """The ``Timeline`` of ``program`` on values with the zero patterns ``patterns`` (``[rows, features]``
    bool per value, as ``sparsefx.run`` records them), without computing them: how the reference times a
    dense baseline, whose all-ones weights a program does not hold."""
    _check_size(program)
    return ReferenceMachine(program, {s.name: torch.empty(0) for s in program.inputs}, dict(patterns)).play()


def _check_size(program: ProgramData) -> None:
    pes = program.mesh.width * program.mesh.height
    if pes > MAX_PES:
        raise EmulationError(
            f"the reference executor runs meshes of up to {MAX_PES} PEs; this one is "
            f"{program.mesh.width}x{program.mesh.height}: use executor='fast'"
        )
