"""The reference executor: the machine of ``runtime/cost.py`` played message by message and task by task.

It is the definition the fast executor (``runtime/fast.py``) is checked against, written plainly, for
meshes up to about 32x32:

- **Values are what the PEs compute.** Each PE of a sparse matmul multiplies the input columns it
  receives by the nonzeros of its own CSC slice (one AXPY per nonzero) into its partial sums; the
  partial sums of an output add up on their way to the output's lane. Other kernels apply their op's
  rule (``runtime.semantics``) to the values their inputs' PEs computed.
- **Every message books the links it crosses** (``runtime/links.py``): a link carries one wavelet per
  cycle in each direction, so messages of different colors that share a link take turns. A message's
  head moves one hop per ``hop_cycles``; it is delivered when its last wavelet has arrived. A value
  fans out along its lane row (east in a pipelined program; west to column 0 and back east in a
  streaming one, where a stored value is sent again in the step of the kernel that reads it) and
  forks up or down a column to the rows that hold its features.
- **Tasks are triggered by data.** A PE runs a task when a message it needs arrives, one task at a
  time in arrival order: a sparse matmul's task is one input column (the AXPYs of its local
  nonzeros); an all-zero column is not sent to the task (the sender filters it) and counts as
  skipped. A PE's block is done when every message of its columns has come and its tasks have run.
- **Partial sums** go down and up each column to their output's lane (merging where a PE holds the
  same output), then east along the lane to the region's edge, merging column by column.

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
from dataclasses import dataclass
from typing import Any

import torch

from sparsefx.errors import EmulationError

from .blocking import blocked, sized
from .cost import (
    axpy_cycles,
    block_rows,
    features_of,
    idle_tasks,
    load_cycles,
    ops_per_element,
    row_streaming,
    rows_of,
    task_cycles,
    wavelets,
)
from .evaluate import bind_inputs, rebuild_outputs
from .layout import layout, weight_bytes
from .links import Links
from .program import DTYPES, Kernel, ProgramData, lane_bounds
from .semantics import apply
from .sparse_eval import Slices, sparse_matmul
from .timeline import REDUCING_STATS, Flow, KernelTime, Timeline, lane_sends

__all__ = ["ReferenceMachine", "execute", "time_patterns", "MAX_PES"]

MAX_PES = 64 * 64
"""The largest mesh the reference executor takes (it is meant for about 32x32)."""


@dataclass
class _Value:
    """A value as its producer's PEs hold it: when each message can leave, and the data."""

    name: str
    features: int
    lanes: int
    rows: int
    block: int
    wave: list[int]  # wavelets per message, per block
    east: int  # the column messages leave from (-1: the host)
    ready: list[list[int]]  # [block][feature]: when the message's head can leave the edge
    tensor: torch.Tensor

    def __post_init__(self) -> None:
        bounds = lane_bounds(self.features, self.lanes)
        self.bounds = bounds.tolist()
        # zeros filtered at the sender, from the PEs' own data, by the rule both executors send by
        self.flags = _live(self.tensor, self.block, len(self.wave), self.features)
        self.live = None if self.flags is None else self.flags.tolist()
        self.sends = lane_sends(torch.tensor(self.wave, dtype=torch.int64), self.flags, bounds).tolist()

    def last(self, f: int) -> int:
        """The last feature of ``f``'s lane: its message carries the lane's end-of-block mark."""
        return self.bounds[self.lane(f) + 1] - 1

    def lane(self, f: int) -> int:
        """The lane (mesh row) feature ``f`` travels on."""
        return bisect.bisect_right(self.bounds, f) - 1

    def cover(self, q: int, b: int, rows: int, streams: bool) -> range:
        """The blocks of this value that a reader's block ``q`` of ``b`` rows (of ``rows``) needs."""
        if not streams or rows != self.rows:
            return range(len(self.wave))
        lo, hi = q * b, min((q + 1) * b, rows) - 1
        return range(lo // self.block, hi // self.block + 1)


def _live(tensor: torch.Tensor, block: int, blocks: int, features: int) -> torch.Tensor | None:
    """``[blocks, features]``: whether message ``(q, f)`` of a value holds a nonzero (None: empty value)."""
    if tensor.numel() == 0 or features == 0:
        return None
    return sized(blocked((tensor != 0).reshape(-1, features), block), blocks, features)


def _sizes(rows: int, b: int) -> list[int]:
    rows = max(rows, 1)
    n = math.ceil(rows / b)
    return [b] * (n - 1) + [rows - b * (n - 1)]


def _fifo(tasks: list[tuple[int, int, int, int]]) -> list[int]:
    """Finish of each ``(arrival, order, pe, cost)`` task, each PE running its tasks in arrival order."""
    finish = [0] * len(tasks)
    free: dict[int, int] = {}
    for i in sorted(range(len(tasks)), key=lambda i: (tasks[i][0], tasks[i][1])):
        arrival, _, pe, cost = tasks[i]
        start = max(arrival, free.get(pe, arrival))
        free[pe] = finish[i] = start + cost
    return finish


class ReferenceMachine:
    """The mesh of ``runtime/cost.py`` played message by message (module docstring): kernel by kernel in
    program order (``run``), each PE computing its values from its own data, each message booked on
    every link it crosses (``runtime/links.py``), each PE's tasks run one at a time in arrival order, in
    plain loops over messages and tasks. It is the definition that ``FastClock`` (``runtime/fast.py``),
    which evaluates the same rules vectorized over PEs and messages, is checked against.

    With ``patterns`` (``time_patterns``) it only times: each value stands in as its zero pattern (1
    where the value is nonzero), so the same rules filter the same zeros without computing."""

    def __init__(
        self,
        program: ProgramData,
        inputs: dict[str, torch.Tensor],
        patterns: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.p = program
        self.patterns = patterns
        self.hw = program.hardware
        self.hop = self.hw.hop_cycles
        self.streaming = program.mode == "streaming"
        self.links = Links()
        self.values: dict[str, _Value] = {}
        self.paths: dict[tuple, list[int]] = {}
        self.flows: dict[str, Flow] = {}
        self.t0 = 0
        self.prev_start = self.prev_end = self.loader_free = 0
        for s in program.inputs:
            if s.name in inputs:
                self._host_value(s.name, s.shape, s.dtype, inputs[s.name])

    # -- values and messages ------------------------------------------------------------------------

    def _host_value(self, name: str, shape: tuple[int, ...], dtype: str, tensor: torch.Tensor) -> None:
        f, rows = features_of(shape), rows_of(shape)
        lanes = max(1, min(self.p.mesh.height, f))
        stretch = max(1.0, lanes / self.hw.host_wavelets_per_cycle)
        wave = math.ceil(wavelets(rows, dtype, self.hw) * stretch)
        self._keep(_Value(name, f, lanes, rows, max(rows, 1), [wave], -1, [[0] * f], tensor), dtype)

    def _keep(self, v: _Value, dtype: str) -> None:
        self.values[v.name] = v
        ready = torch.tensor(v.ready, dtype=torch.int64).reshape(len(v.wave), v.features)
        wave = torch.tensor(v.wave, dtype=torch.int64)
        live = v.flags
        flow = Flow(v.name, dtype, v.features, v.lanes, v.rows, v.block, wave, v.east, ready, live)
        self.flows[v.name] = flow

    def _head(self, v: _Value, reader: str, q: int, f: int, x: int, floor: int) -> int:
        """When the head of message ``(q, f)`` of ``v`` reaches column ``x`` on its lane row.

        Pipelined: east from the producer's edge, one route shared by every reader. Streaming: west
        to column 0, then east, sent again for each reader no earlier than ``floor`` (its step).
        """
        e, row = v.east, v.lane(f)
        if not self.streaming and x <= e:
            return v.ready[q][f] + self.hop  # a reader on the producer's own columns
        key = (v.name, reader if self.streaming else "", q, f)
        times = self.paths.get(key)
        if times is None:
            start = max(v.ready[q][f], floor) if self.streaming else v.ready[q][f]
            # the sender puts one wavelet per cycle on its lane, even to a reader on its own PE
            times = self.paths[key] = [self.links.book((e, row, "R"), start, v.sends[q][f])]
        index = (x + 1 if e < 0 else e + x) if self.streaming else x - e  # hops from the start
        while len(times) <= index:
            i = len(times) - 1
            if self.streaming and e >= 0 and i < e:
                link = (e - i, row, "W")
            else:
                link = ((i - e if self.streaming and e >= 0 else e + i), row, "E")
            times.append(self.links.book(link, times[-1], v.sends[q][f]) + self.hop)
        return times[index]

    def arrival(self, v: _Value, reader: str, q: int, f: int, x: int, y: int, floor: int) -> int:
        """When message ``(q, f)`` of ``v`` has wholly arrived at PE ``(x, y)``; for a message the sender
        filtered (all zero), when the PE learns so: its lane's end-of-block mark, the last wavelet of the
        lane's last message (or a lone control wavelet), reaches it."""
        if not v.sends[q][f]:
            last = v.last(f)
            t = self._head(v, reader, q, last, x, floor) + v.sends[q][last]
            return t + abs(y - v.lane(f)) * self.hop
        t = self._head(v, reader, q, f, x, floor)
        row = v.lane(f)
        if y != row:
            key = (v.name, reader if self.streaming else "", q, f, x, "S" if y > row else "N")
            times = self.paths.get(key)
            if times is None:
                times = self.paths[key] = [t]
            step = 1 if y > row else -1
            while len(times) <= abs(y - row):
                yy = row + step * (len(times) - 1)
                link = (x, yy, "S" if step > 0 else "N")
                times.append(self.links.book(link, times[-1], v.sends[q][f]) + self.hop)
            t = times[abs(y - row)]
        return t + v.sends[q][f]

    # -- kernels ------------------------------------------------------------------------------------

    def run(self, k: Kernel) -> KernelTime:
        t0, load = self._begin(k)
        self.t0 = t0
        inputs = [self.values[n].tensor for n in k.inputs]
        if k.op == "sparse_matmul":
            kt, value = self._sparse(k, t0, inputs)
        elif k.op == "constant":
            kt, value = self._constant(k, t0, inputs)
        else:
            kt, value = self._dense(k, t0, inputs)
        kt.load = load
        self._keep(value, k.dtype)
        if self.patterns is not None:
            value.tensor = self._stand_in(k.name, k.shape)  # the next kernels read the pattern
        if self.streaming:
            self.prev_start, self.prev_end = kt.start, kt.end
            if load is not None and load[1] >= max(kt.start, 1) and kt.waits_on != "previous":
                kt.waits_on = "load"
        return kt

    def _stand_in(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """Timing only: 1.0 where value ``name`` is nonzero (every element, when its pattern is unknown)."""
        assert self.patterns is not None
        seen = self.patterns.get(name)
        if seen is None or seen.numel() != math.prod(shape):
            return torch.ones(shape)
        return seen.reshape(shape).to(torch.float32)

    def _result(self, k: Kernel, compute: Any) -> torch.Tensor:
        """A kernel's result: computed on its PEs, or its stand-in when only timing."""
        return compute() if self.patterns is None else self._stand_in(k.name, k.shape)

    def _begin(self, k: Kernel) -> tuple[int, tuple[int, int] | None]:
        if not self.streaming:
            return 0, None
        begin = max(self.loader_free, self.prev_start)
        done = begin + load_cycles(weight_bytes(self.p, k), self.hw)
        self.loader_free = done
        return max(self.prev_end, done), (begin, done)

    def _waits(self, latest: dict[str, int], t0: int) -> str | None:
        if not latest:
            return "previous" if self.streaming and t0 > 0 else None
        name, when = max(latest.items(), key=lambda kv: kv[1])
        return "previous" if self.streaming and t0 >= when else name

    def _blocks(self, k: Kernel) -> tuple[int, list[int], list[int]]:
        b = block_rows(k)
        sizes = _sizes(rows_of(k.shape), b)
        return b, sizes, [wavelets(n, k.dtype, self.hw) for n in sizes]

    def _gather(
        self, k: Kernel, v: _Value, needs: dict[tuple[int, int], list[tuple[int, int]]], t0: int
    ) -> dict[tuple[int, int, int, int], int]:
        """Arrivals ``(q, f, x, y) -> cycle`` of the messages a kernel needs, booked first come first
        served: ``needs[(q, f)]`` lists the PEs that need message ``(q, f)`` of ``v``."""
        out = {}
        for q, f in sorted(needs, key=lambda m: (v.ready[m[0]][m[1]], m)):
            for x, y in needs[(q, f)]:
                out[(q, f, x, y)] = max(self.arrival(v, k.name, q, f, x, y, t0), t0)
        return out

    def _egress(
        self,
        k: Kernel,
        ready: dict[tuple[int, int], tuple[int, int]],
        sizes: list[int],
        wave: list[int],
        flags: torch.Tensor | None,
    ) -> list[list[int]]:
        """``ready[(q, f)] = (cycle, column)``: each result from its column east along its lane row to
        the region's edge, first come first served (an all-zero one is not sent: ``flags``, ``_live``);
        returns ``[block][feature]`` edge times."""
        live = None if flags is None else flags.tolist()
        f_all = features_of(k.shape)
        lanes = _lanes(k, f_all)
        bounds = lane_bounds(f_all, lanes).tolist()
        east = k.region.x + k.region.width - 1
        edge = [[0] * f_all for _ in sizes]
        for (q, f), (t, x) in sorted(ready.items(), key=lambda kv: (kv[1][0], kv[0])):
            row = k.region.y + bisect.bisect_right(bounds, f) - 1
            sends = wave[q] if live is None or live[q][f] else 0
            for c in range(x, east):
                t = self.links.book((c, row, "E"), t, sends) + self.hop
            edge[q][f] = t
        return edge

    def _value(
        self, k: Kernel, b: int, wave: list[int], edge: list[list[int]], tensor: torch.Tensor
    ) -> _Value:
        f = features_of(k.shape)
        east = k.region.x + k.region.width - 1
        return _Value(k.name, f, _lanes(k, f), rows_of(k.shape), b, wave, east, edge, tensor)

    def _end(self, edge: list[list[int]], wave: list[int], t0: int) -> int:
        return max([max(row) + w for row, w in zip(edge, wave) if row] + [t0])

    def _constant(self, k: Kernel, t0: int, inputs: list[torch.Tensor]) -> tuple[KernelTime, _Value]:
        b, sizes, wave = self._blocks(k)
        f = features_of(k.shape)
        edge = [[t0] * f for _ in sizes]
        zeros = torch.zeros(k.region.pes, dtype=torch.int64)
        end = self._end(edge, wave, t0)
        kt = KernelTime(k.name, k.op, t0, end, zeros, zeros.clone(), len(sizes))
        return kt, self._value(k, b, wave, edge, self._result(k, lambda: apply(self.p, k, inputs)))

    def _dense(self, k: Kernel, t0: int, inputs: list[torch.Tensor]) -> tuple[KernelTime, _Value]:
        hw, r = self.hw, k.region
        b, sizes, wave = self._blocks(k)
        f_all = features_of(k.shape)
        lanes = _lanes(k, f_all)
        bounds = lane_bounds(f_all, lanes).tolist()
        place = []  # (x, y, local pe) of each feature's tasks
        for f in range(f_all):
            lane = bisect.bisect_right(bounds, f) - 1
            rank = f - bounds[lane]
            place.append((r.x + rank % r.width, r.y + lane, lane * r.width + rank % r.width))
        arr = [[t0] * f_all for _ in sizes]
        heard = [[False] * f_all for _ in sizes]  # some input message of the task holds data
        latest: dict[str, int] = {}
        rows = rows_of(k.shape)
        for name in dict.fromkeys(k.inputs):
            v = self.values[name]
            if v.features == 0:  # an empty value (a cat's empty cache, say) sends no message
                continue
            streams = row_streaming(self.p, k, name)
            needs: dict[tuple[int, int], list[tuple[int, int]]] = {}
            src = [min(f * v.features // max(f_all, 1), v.features - 1) for f in range(f_all)]
            for q in range(len(sizes)):
                for f in range(f_all):
                    for qs in v.cover(q, b, rows, streams):
                        needs.setdefault((qs, src[f]), []).append(place[f][:2])
            got = self._gather(k, v, needs, t0)
            for q in range(len(sizes)):
                for f in range(f_all):
                    x, y, _ = place[f]
                    covered = v.cover(q, b, rows, streams)
                    arr[q][f] = max(arr[q][f], max(got[(qs, src[f], x, y)] for qs in covered))
                    heard[q][f] |= any(v.live is None or v.live[qs][src[f]] for qs in covered)
            latest[name] = max(max(row) for row in arr)
        result = self._result(k, lambda: apply(self.p, k, inputs))
        out_live = _live(result, b, len(sizes), f_all)
        idle = idle_tasks(k.op, torch.tensor(heard), out_live)
        ops = ops_per_element(self.p, k)
        cost = [task_cycles(ops, n, k.dtype, hw) for n in sizes]
        tasks = [
            (arr[q][f], q * f_all + f, place[f][2], 0 if idle is not None and idle[q, f] else cost[q])
            for q in range(len(sizes))
            for f in range(f_all)
        ]
        finish = [t if c else a for (a, _, _, c), t in zip(tasks, _fifo(tasks))]  # a task left out: none
        busy = torch.zeros(r.pes, dtype=torch.int64)
        overhead = torch.zeros(r.pes, dtype=torch.int64)
        for _, _, pe, c in tasks:
            busy[pe] += c
            overhead[pe] += hw.task_start_cycles if c else 0
        extra = 0
        if k.op in REDUCING_STATS and lanes > 1:  # the statistics' all-reduce across the lanes
            extra = 2 * ((lanes - 1) * hw.hop_cycles + hw.task_start_cycles)
        ready = {}
        for q in range(len(sizes)):
            fins = finish[q * f_all : (q + 1) * f_all]
            barrier = max(fins) + extra if extra else None
            for f in range(f_all):
                ready[(q, f)] = (barrier if barrier is not None else fins[f], place[f][0])
        edge = self._egress(k, ready, sizes, wave, out_live)
        start = min(min(row) for row in arr) if arr else t0
        kt = KernelTime(
            k.name,
            k.op,
            start,
            self._end(edge, wave, t0),
            busy,
            overhead,
            len(sizes),
            messages=len(sizes) * f_all,
            waits_on=self._waits(latest, t0),
        )
        return kt, self._value(k, b, wave, edge, result)

    def _sparse(self, k: Kernel, t0: int, inputs: list[torch.Tensor]) -> tuple[KernelTime, _Value]:
        hw, r = self.hw, k.region
        kind = k.attrs.get("kind")
        conv = kind in ("conv1d", "conv2d")
        seen: list[torch.Tensor] = []

        def pe_product(s: Slices, x: torch.Tensor) -> torch.Tensor:
            seen.append(x)
            return _pe_product(s, x)

        def compute() -> torch.Tensor:
            arrays = {role: self.p.arrays[name] for role, name in k.arrays.items()}
            where = f"kernel {k.name!r} ({k.op})"
            out = sparse_matmul(arrays, k.attrs, (r.width, r.height), inputs[0], k.shape, where, pe_product)
            return out.to(DTYPES[k.dtype])

        result = self._result(k, compute)
        s = layout(self.p, k)
        if self.patterns is not None and not conv:  # the input columns as the PEs would see them
            seen.append(inputs[0].reshape(-1, s.in_features))
        b, sizes, wave = self._blocks(k)
        blocks = len(sizes)
        v = self.values[k.inputs[0]]
        streams = row_streaming(self.p, k, v.name)
        rows = rows_of(k.shape)
        widths = (s.in_hi - s.in_lo).tolist()
        in_lo = s.in_lo.tolist()
        counts = s.counts.tolist()
        columns = []  # per PE: [(input feature, nonzeros)]
        at = 0
        for pe in range(r.pes):
            columns.append([(in_lo[pe] + c, counts[at + c]) for c in range(widths[pe])])
            at += widths[pe]
        if conv or not seen:
            sent = [[True] * s.in_features for _ in range(blocks)]
        else:
            x2d = torch.cat(seen) != 0
            sent = [x2d[q * b : q * b + n].any(dim=0).tolist() for q, n in enumerate(sizes)]
        # the messages each PE needs, by block: (x, y) per (source block, feature)
        needs: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for pe in range(r.pes):
            x, y = r.coords(pe)
            for j, _ in columns[pe]:
                f = v.features - 1 if conv else j
                for q in range(blocks):
                    for qs in v.cover(q, b, rows, streams and not conv):
                        needs.setdefault((qs, f), []).append((x, y))
        got = self._gather(k, v, needs, t0)
        tasks, where_task = [], []
        barrier = [[t0] * blocks for _ in range(r.pes)]
        skipped = skipped_axpys = axpys = 0
        for pe in range(r.pes):
            x, y = r.coords(pe)
            for q in range(blocks):
                for j, n in columns[pe]:
                    f = v.features - 1 if conv else j
                    a = max(got[(qs, f, x, y)] for qs in v.cover(q, b, rows, streams and not conv))
                    barrier[pe][q] = max(barrier[pe][q], a)
                    if not sent[q][j]:
                        skipped_axpys += n
                        continue
                    if n:
                        tasks.append((a, q * s.in_features + j, pe, n * axpy_cycles(sizes[q], k.dtype, hw)))
                        where_task.append((pe, q, n))
                        axpys += n
        skipped = sum(1 for q in range(blocks) for j in range(s.in_features) if not sent[q][j])
        finish = _fifo(tasks)
        busy = torch.zeros(r.pes, dtype=torch.int64)
        overhead = torch.zeros(r.pes, dtype=torch.int64)
        done = barrier
        for (pe, q, n), (_, _, _, c), t in zip(where_task, tasks, finish):
            busy[pe] += c
            overhead[pe] += n * hw.task_start_cycles
            done[pe][q] = max(done[pe][q], t)
        for pe in range(r.pes):  # a PE finishes its blocks in order
            for q in range(1, blocks):
                done[pe][q] = max(done[pe][q], done[pe][q - 1])
        ran = {q for _, q, _ in where_task}  # a block no task ran in has only zero partial sums: none is sent
        ready, bus = self._reduce(k, s, done, [w if q in ran else 0 for q, w in enumerate(wave)])
        if s.out_features != features_of(k.shape):  # a convolution's channels are not its features
            last = {
                q: max((t for (qq, _), (t, _) in ready.items() if qq == q), default=t0) for q in range(blocks)
            }
            east = r.x + r.width - 1
            ready = {(q, f): (last[q], east) for q in range(blocks) for f in range(features_of(k.shape))}
        edge = self._egress(k, ready, sizes, wave, _live(result, b, blocks, features_of(k.shape)))
        arrived = [t for t, *_ in tasks]
        latest = {v.name: max(got.values())} if got else {}
        kt = KernelTime(
            k.name,
            k.op,
            min(arrived) if arrived else (min(got.values()) if got else t0),
            self._end(edge, wave, t0),
            busy,
            overhead,
            blocks,
            messages=sum(1 for q in range(blocks) for j in range(s.in_features) if sent[q][j]),
            skipped=skipped,
            axpys=axpys,
            skipped_axpys=skipped_axpys,
            waits_on=self._waits(latest, t0),
            bus=bus,
        )
        return kt, self._value(k, b, wave, edge, result)

    def _reduce(
        self, k: Kernel, s: Any, done: list[list[int]], wave: list[int]
    ) -> tuple[dict[tuple[int, int], tuple[int, int]], tuple[torch.Tensor, torch.Tensor]]:
        """Partial sums down and up each column to their lane, then east across the columns that hold
        the output; returns ``(q, output) -> (cycle, column)`` where each sum leaves its last column."""
        hw, r = self.hw, k.region
        out_f = s.out_features
        lanes = _lanes(k, out_f)
        bounds = lane_bounds(out_f, lanes).tolist()
        lane_of = [bisect.bisect_right(bounds, o) - 1 for o in range(out_f)]
        holders: dict[tuple[int, int], list[int]] = {}  # (column, output) -> rows holding it
        out_lo, span = s.out_lo.tolist(), s.span.clamp(max=out_f).tolist()
        for pe in range(r.pes):
            cx, cy = pe % r.width, pe // r.width
            for i in range(span[pe]):
                holders.setdefault((cx, (out_lo[pe] + i) % max(out_f, 1)), []).append(cy)
        south = torch.zeros((r.width, r.height), dtype=torch.int64)
        north = torch.zeros((r.width, r.height), dtype=torch.int64)
        at_lane: dict[tuple[int, int, int], int] = {}
        chains = []
        for (cx, o), ys in holders.items():
            lane = lane_of[o]
            for q in range(len(wave)):
                chains.append((min(done[cy * r.width + cx][q] for cy in ys), cx, o, q, sorted(ys), lane))
        for _, cx, o, q, ys, lane in sorted(chains):
            x = r.x + cx
            t_lane = done[lane * r.width + cx][q] if lane in ys else 0
            for side, rows, step, name in (
                ("S", [y for y in ys if y < lane], 1, south),
                ("N", [y for y in ys if y > lane], -1, north),
            ):
                if not rows:
                    continue
                y = rows[0] if step > 0 else rows[-1]
                t = done[y * r.width + cx][q]
                while y != lane:
                    t = self.links.book((x, r.y + y, side), t, wave[q]) + hw.hop_cycles
                    name[cx, y] += wave[q]
                    y += step
                    if y in ys and y != lane:
                        t = max(t, done[y * r.width + cx][q])
                t_lane = max(t_lane, t)
            at_lane[(cx, o, q)] = t_lane
        ready: dict[tuple[int, int], tuple[int, int]] = {}
        by_output: dict[tuple[int, int], list[int]] = {}
        for cx, o, q in at_lane:
            by_output.setdefault((q, o), []).append(cx)
        for (q, o), cols in sorted(
            by_output.items(), key=lambda kv: (min(at_lane[(c, kv[0][1], kv[0][0])] for c in kv[1]), kv[0])
        ):
            cols.sort()
            row = r.y + lane_of[o]
            t = at_lane[(cols[0], o, q)]
            for c in range(cols[0], cols[-1]):
                t = self.links.book((r.x + c, row, "E"), t, wave[q]) + hw.hop_cycles
                if c + 1 in cols:
                    t = max(t, at_lane[(c + 1, o, q)])
            ready[(q, o)] = (t, r.x + cols[-1])
        return ready, (south, north)

    def outputs_done(self) -> dict[str, int]:
        """When each program output has wholly reached the host past the mesh's east edge."""
        done = {}
        width = self.p.mesh.width
        for name in self.p.outputs:
            v = self.values[name]
            last = 0
            for q, row in enumerate(v.ready):
                for f in range(len(row)):
                    last = max(last, self._head(v, "host", q, f, width, row[f]) + v.wave[q])
            done[name] = last
        return done


def _lanes(kernel: Kernel, features: int) -> int:
    given = kernel.attrs.get("lanes", kernel.region.height)
    return max(1, min(int(given), features, kernel.region.height))


def _pe_product(s: Slices, x: torch.Tensor) -> torch.Tensor:
    """``[rows, in] -> [rows, out]``, PE by PE: each PE's AXPYs into its partial sums, then the sums."""
    dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    dtype = torch.promote_types(dtype, s.values.dtype)
    x = x.to(dtype)
    rows = x.shape[0]
    out = torch.zeros(rows, s.out_features, dtype=dtype, device=x.device)
    for pe in range(s.pes):
        n0, n1 = int(s.nz_ptr[pe]), int(s.nz_ptr[pe + 1])
        span = int(s.span[pe])
        if n1 == n0 or span == 0:
            continue
        c0, c1 = int(s.col_ptr_off[pe]), int(s.col_ptr_off[pe + 1])
        per_column = s.col_ptr[c0:c1].diff()
        feature = torch.repeat_interleave(torch.arange(int(s.in_lo[pe]), int(s.in_hi[pe])), per_column)
        local = s.row_idx[n0:n1].to(torch.int64)
        partial = torch.zeros(rows, span, dtype=dtype, device=x.device)
        partial.index_add_(1, local, x[:, feature] * s.values[n0:n1].to(dtype))  # one AXPY per nonzero
        outputs = (int(s.out_lo[pe]) + torch.arange(span)) % max(s.out_features, 1)
        out.index_add_(1, outputs, partial)
    return out.to(torch.promote_types(x.dtype, s.values.dtype))


def execute(
    program: ProgramData, inputs: Any, device: torch.device | None = None
) -> tuple[Any, Timeline]:
    """Run ``program`` on ``inputs`` message by message: the outputs (the model's structure, their
    tensors moved to ``device`` when given) and the ``Timeline`` (module docstring). It runs on the CPU.
    Meshes over ``MAX_PES`` PEs are an ``EmulationError``."""
    if not program.has_payloads:
        raise EmulationError("the program has no payloads (parsed from text?); load it from a program file")
    _check_size(program)
    bound = bind_inputs(program, inputs)
    machine = ReferenceMachine(program, {n: t.cpu() for n, t in bound.items()})
    timeline = _play(machine)
    values = [machine.values[n].tensor for n in program.outputs]
    if device is not None:
        values = [v.to(device) for v in values]
    return rebuild_outputs(program.output_tree, values, program.output_spec), timeline


def time_patterns(program: ProgramData, patterns: dict[str, torch.Tensor]) -> Timeline:
    """The ``Timeline`` of ``program`` on values with the zero patterns ``patterns`` (``[rows, features]``
    bool per value, as ``sparsefx.run`` records them), without computing them: how the reference times a
    dense baseline, whose all-ones weights a program does not hold."""
    _check_size(program)
    machine = ReferenceMachine(program, {}, dict(patterns))
    for s in program.inputs:
        machine._host_value(s.name, s.shape, s.dtype, machine._stand_in(s.name, s.shape))
    return _play(machine)


def _check_size(program: ProgramData) -> None:
    pes = program.mesh.width * program.mesh.height
    if pes > MAX_PES:
        raise EmulationError(
            f"the reference executor runs meshes of up to {MAX_PES} PEs; this one is "
            f"{program.mesh.width}x{program.mesh.height}: use executor='fast'"
        )


def _play(machine: ReferenceMachine) -> Timeline:
    """Every kernel of the machine's program in order, then the outputs on their way to the host."""
    with torch.no_grad():
        kernels = [machine.run(k) for k in machine.p.kernels]
    done = machine.outputs_done()
    cycles = max([kt.end for kt in kernels] + list(done.values()) + [0])
    return Timeline(kernels, machine.flows, cycles, done)
