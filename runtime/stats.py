"""What a run reports: cycles and time, per-kernel and per-PE figures, traffic, SRAM, and the dense baseline.

``collect(program, timeline)`` turns a clock's ``Timeline`` into ``RunStats``. The critical path runs
back from the last output through the input each kernel waited on last. Its time splits into parts
that sum to the run's cycles: **MAC work** (mean SIMD cycles of a matmul's PEs), **imbalance** (the
busiest PE over the mean), **task overhead** (task starts), **communication** (the rest of a matmul's
time: arrivals, partial sums, results leaving, output to the host), **weight loading** (streaming
waits on weights) and **dense ops** (every other kernel). ``compare`` sets two runs side by side: the
realized speedup, the ideal ``1 / (1 - s)``, and for each part how much more the sparse run spends
than ``(1 - s)`` times the dense run's: the gap, part by part. The parts add up to the whole gap.

Each figure has its own ideal (the pinned benchmark settings): the **sparse layers** (the matmul
kernels whose masks prune something) against ``1 / (1 - s)`` of their weights, and the **whole model**
against its FLOP ratio, dense forward FLOPs over sparse ones of every matmul kernel (activation
products and matmuls kept dense count the same on both sides), never ``1 / (1 - s)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .layout import sparse_bytes
from .layout import weight_bytes as weight_bytes_of
from .memo import kept_for
from .memory import sram_needed
from .op_kinds import op_kind
from .program import Kernel, ProgramData
from .timeline import Flow, KernelTime, Timeline

__all__ = [
    "KernelStats",
    "RunStats",
    "Comparison",
    "collect",
    "compare",
    "flop_ratio",
    "steady_interval",
    "PARTS",
]

PARTS = ("mac", "imbalance", "task_overhead", "communication", "weight_load", "dense_ops")
"""The parts of the critical path, in report order."""


@dataclass
class KernelStats:
    """One kernel's figures."""

    name: str
    op: str
    start: int
    end: int
    cycles: int
    busy_max: int
    busy_mean: float
    imbalance: float
    messages: int
    skipped_messages: int
    axpys: int
    skipped_axpys: int
    sram_max: int
    critical: bool = False
    waits_on: str | None = None  # the input (or "load", "previous") whose arrival came last
    load: tuple[int, int] | None = None  # streaming: when its weights were loaded (start, end)


@dataclass
class Comparison:
    """The sparse run beside the dense baseline."""

    dense_cycles: int
    sparse_cycles: int
    sparsity: float
    ideal: float
    realized: float
    linear_dense_cycles: int
    linear_sparse_cycles: int
    linear_realized: float
    parts: dict[str, dict[str, float]]  # part -> {"sparse", "dense", "ideal", "excess"}
    dense_interval: int = 0  # steady-state cycles between inputs (pipelined: the busiest PE of any kernel)
    sparse_interval: int = 0
    throughput_realized: float = 0.0  # dense interval over sparse: the speedup of inputs per second
    flop_ratio: float = 1.0  # the whole model's ideal: dense over sparse forward FLOPs of its matmuls
    layers: list[str] = field(default_factory=list)  # the sparse layers: matmuls whose masks prune
    layers_sparsity: float = 0.0
    layers_ideal: float = 1.0  # 1 / (1 - layers_sparsity)
    layers_dense_cycles: int = 0
    layers_sparse_cycles: int = 0
    layers_realized: float = 1.0
    dense_matmuls: list[str] = field(default_factory=list)  # matmuls that keep every weight (an LM head)
    # the mesh's PEs busy with task work: over the run (latency), and per interval (steady state)
    dense_utilization: float = 0.0
    sparse_utilization: float = 0.0
    dense_steady_utilization: float = 0.0
    sparse_steady_utilization: float = 0.0
    beyond_flop_ratio: str = ""  # why a figure exceeds the FLOP ratio ("" when none does)

    @property
    def efficiency(self) -> float:
        """The whole model's realized speedup over its ideal, the FLOP ratio."""
        return self.realized / self.flop_ratio if self.flop_ratio else 0.0

    @property
    def layers_efficiency(self) -> float:
        """The sparse layers' realized speedup over their ideal ``1 / (1 - s)``."""
        return self.layers_realized / self.layers_ideal if self.layers_ideal else 0.0


@dataclass
class RunStats:
    """Everything a run measured (``docs/architecture.md``, "Executing a program")."""

    executor: str
    mode: str
    mesh: tuple[int, int]
    clock_hz: float
    cycles: int
    interval: int  # cycles between successive inputs in steady state
    kernels: list[KernelStats]
    critical_path: list[str]
    parts: dict[str, int]
    pe_busy: torch.Tensor  # [height, width] cycles of task work
    wavelets: int
    link_hops: int
    hottest_links: list[tuple[int, int, str, int]]  # (x, y, direction, wavelets)
    weight_bytes: int
    skipped_messages: int
    skipped_axpys: int
    axpys: int
    sram_max: int  # memory.sram_needed: SRAM the busiest PE needs (its data + its rows in flight)
    busy_cycles: int = 0  # every PE's cycles of task work, summed
    wavelets_filtered: int = 0  # wavelets the senders did not send: all-zero messages (``Flow.live``)
    link_hops_filtered: int = 0  # the link hops (wavelets x links) those would have taken along the lanes
    bytes_per_nonzero: float | None = None  # sparse layouts' stored bytes over their nonzeros (None: none)
    dense: Comparison | None = None
    dense_unavailable: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """Latency: the run's cycles at the clock."""
        return self.cycles / self.clock_hz

    @property
    def throughput(self) -> float:
        """Inputs per second in steady state (a pipelined program overlaps successive inputs)."""
        return self.clock_hz / max(self.interval, 1)

    @property
    def utilization(self) -> float:
        """Mean busy fraction of the PEs that did any work."""
        used = self.pe_busy[self.pe_busy > 0]
        return float(used.float().mean() / max(self.cycles, 1)) if used.numel() else 0.0

    @property
    def imbalance(self) -> float:
        """Busiest PE over the mean of the PEs that did any work."""
        used = self.pe_busy[self.pe_busy > 0].float()
        return float(used.max() / used.mean()) if used.numel() else 1.0

    def to_json(self) -> dict[str, Any]:
        """Plain data (the per-PE grid as nested lists)."""
        out = asdict(self)
        out["pe_busy"] = self.pe_busy.tolist()
        out |= {
            "seconds": self.seconds,
            "throughput_per_s": self.throughput,
            "utilization": self.utilization,
            "imbalance": self.imbalance,
        }
        if self.dense is not None:
            out["dense"]["efficiency"] = self.dense.efficiency
            out["dense"]["layers_efficiency"] = self.dense.layers_efficiency
        return out


def _critical(program: ProgramData, timeline: Timeline) -> list[KernelTime]:
    by_name = {kt.name: kt for kt in timeline.kernels}
    index = {kt.name: i for i, kt in enumerate(timeline.kernels)}
    if timeline.output_done:
        last = max(timeline.output_done, key=lambda n: timeline.output_done[n])
    else:
        last = max(by_name, key=lambda n: by_name[n].end) if by_name else None
    if program.mode == "streaming" and last in index:
        # a step starts when the one before it ends, and its stored inputs are sent again from then:
        # every step up to the last output's is on the path, whichever input it waited on
        return timeline.kernels[: index[last] + 1]
    path = []
    while last is not None and last in by_name:
        kt = by_name[last]
        path.append(kt)
        wait = kt.waits_on
        if wait == "previous" and index[last] > 0:
            last = timeline.kernels[index[last] - 1].name
        else:
            last = wait if wait in by_name else None
    return path[::-1]


def _parts(path: list[KernelTime], cycles: int) -> dict[str, int]:
    parts = dict.fromkeys(PARTS, 0)
    before = 0
    for kt in path:
        segment = max(kt.end - before, 0)
        before = max(before, kt.end)
        if kt.op != "sparse_matmul":
            parts["dense_ops"] += segment
            continue
        n = max(kt.busy.numel(), 1)
        most, total, start = kt.busy_sums()
        mean, top, over = total / n, float(most), start / n
        shares = {"mac": mean - over, "imbalance": top - mean, "task_overhead": over}
        inside = sum(shares.values())
        scale = min(1.0, segment / inside) if inside > 0 else 0.0  # overlapped with the segment before
        given = 0
        for key, value in shares.items():
            n = int(round(value * scale))
            parts[key] += n
            given += n
        rest = segment - given
        parts["weight_load" if kt.waits_on == "load" else "communication"] += rest
    parts["communication"] += max(cycles - before, 0)  # results on their way to the host
    return parts


def _per_lane(flow: Flow, wavelets: torch.Tensor) -> torch.Tensor:
    """``[lanes]``: ``wavelets`` (``[blocks, features]``) summed over each lane's messages."""
    return torch.zeros(flow.lanes, dtype=torch.int64).index_add_(0, flow.lane, wavelets.sum(0))


def _links(program: ProgramData, timeline: Timeline) -> _Traffic:
    """Wavelets sent, link hops and the hottest links, from value flows (to the kernels that read them,
    and the program's outputs east to the host) and column reductions; and the wavelets the senders
    filtered (all-zero messages) with the link hops they would have taken."""
    planes = torch.zeros((4, program.mesh.width, program.mesh.height), dtype=torch.int64)  # E, W, S, N
    sent = filtered = saved = 0
    east: list[tuple[Flow, int, int]] = []  # each value's messages east along its lanes, columns [a, b)
    for kt in timeline.kernels:
        k = program.kernel(kt.name)
        for value in dict.fromkeys(k.inputs):
            flow = timeline.flows[value]
            a = max(flow.east + 1, 0) if program.mode == "pipelined" else 0
            east.append((flow, a, k.region.x + k.region.width - 1))
        if kt.bus is not None:
            south, north = kt.bus
            r = k.region
            planes[2, r.x : r.x + r.width, r.y : r.y + r.height] += south  # [width, height] as the bus
            planes[3, r.x : r.x + r.width, r.y : r.y + r.height] += north
            sent += int(south.sum() + north.sum())
    for value in dict.fromkeys(program.outputs):  # from the producer to the mesh's edge
        flow = timeline.flows.get(value)
        if flow is not None:
            east.append((flow, max(flow.east + 1, 0), program.mesh.width))
    for flow, a, b in east:
        lanes = _per_lane(flow, flow.sends)  # wavelets per lane
        kept = _per_lane(flow, flow.filtered)
        sent += int(lanes.sum())
        filtered += int(kept.sum())
        if b > a:
            planes[0, a:b, : flow.lanes] += lanes[None, :]
            saved += int(kept.sum()) * (b - a)
    hops = int(planes.sum())
    grid = planes.permute(2, 1, 0)  # [height, width, direction]: links numbered row by row
    names = ("E", "W", "S", "N")
    hottest = []
    if grid.numel():
        for value, i in _top(grid.reshape(grid.shape[0], -1), 5):
            if value <= 0:
                continue
            y, rest = divmod(i, program.mesh.width * 4)
            x, d = divmod(rest, 4)
            hottest.append((x, y, names[d], value))
    return _Traffic(sent, hops, hottest, filtered, saved)


@dataclass
class _Traffic:
    sent: int
    hops: int
    hottest: list[tuple[int, int, str, int]]
    filtered: int
    saved: int


def _sram_max(program: ProgramData, k: Kernel) -> int:
    """``memory.sram_needed`` (the busiest PE's SRAM bytes), once per kernel structure (``memo.kept_for``)."""
    arrays = tuple((role, tuple(program.arrays[n].shape)) for role, n in sorted(k.arrays.items()))
    key = ("sram_max", repr(sorted(k.attrs.items())), repr(program.hardware), arrays)
    return kept_for(program, k, key, lambda: sram_needed(program, k))


def _top(rows: torch.Tensor, n: int) -> list[tuple[int, int]]:
    """The ``n`` largest entries of ``rows`` as ``(value, flat index)``, ties by index: the ``n``-th
    largest value from each row's largest (faster than one ``topk`` over a wse2 mesh's links), then
    every entry at least that large."""
    best = torch.topk(rows, min(n, rows.shape[1]), dim=1).values.reshape(-1)
    floor = torch.topk(best, min(n, best.numel())).values[-1]
    flat = rows.reshape(-1)
    at = (flat >= floor).nonzero().squeeze(1)  # ascending index
    values = flat[at]
    order = torch.sort(values, descending=True, stable=True).indices[:n]
    return list(zip(values[order].tolist(), at[order].tolist()))


def collect(program: ProgramData, timeline: Timeline, executor: str, mesh_detail: bool = True) -> RunStats:
    """``RunStats`` of one timed run (module docstring). Without ``mesh_detail`` (the dense baseline,
    which ``compare`` reads for its cycles, parts and intervals) the per-PE busy grid, SRAM and link
    traffic are left empty."""
    mesh = program.mesh
    busy = torch.zeros((mesh.height, mesh.width), dtype=torch.int64)
    kernels = []
    path = _critical(program, timeline)
    on_path = {kt.name for kt in path}
    sram_max = 0
    weight_bytes = 0
    busy_cycles = 0
    for kt in timeline.kernels:
        k = program.kernel(kt.name)
        r = k.region
        if mesh_detail:
            busy[r.y : r.y + r.height, r.x : r.x + r.width] += kt.busy.reshape(r.height, r.width)
        described = mesh_detail and r.pes and not k.attrs.get("all_ones")  # all-ones: no arrays
        sram = _sram_max(program, k) if described else 0
        sram_max = max(sram_max, sram)
        if kt.load is not None:
            weight_bytes += weight_bytes_of(program, k)
        n = kt.busy.numel()
        top, total, _ = kt.busy_sums()
        busy_cycles += total
        mean = total / n if n else 0.0
        kernels.append(
            KernelStats(
                kt.name,
                kt.op,
                kt.start,
                kt.end,
                kt.end - kt.start,
                top,
                mean,
                top / mean if mean > 0 else 1.0,
                kt.messages,
                kt.skipped,
                kt.axpys,
                kt.skipped_axpys,
                sram,
                kt.name in on_path,
                kt.waits_on,
                kt.load,
            )
        )
    interval = steady_interval(program, timeline)
    stored, nonzeros = sparse_bytes(program)
    traffic = _links(program, timeline) if mesh_detail else _Traffic(0, 0, [], 0, 0)
    return RunStats(
        executor=executor,
        mode=program.mode,
        mesh=(mesh.width, mesh.height),
        clock_hz=program.hardware.clock_hz,
        cycles=timeline.cycles,
        interval=interval,
        kernels=kernels,
        critical_path=[kt.name for kt in path],
        parts=_parts(path, timeline.cycles),
        pe_busy=busy,
        wavelets=traffic.sent,
        link_hops=traffic.hops,
        hottest_links=traffic.hottest,
        wavelets_filtered=traffic.filtered,
        link_hops_filtered=traffic.saved,
        weight_bytes=weight_bytes,
        skipped_messages=sum(kt.skipped for kt in timeline.kernels),
        skipped_axpys=sum(kt.skipped_axpys for kt in timeline.kernels),
        axpys=sum(kt.axpys for kt in timeline.kernels),
        sram_max=sram_max,
        busy_cycles=busy_cycles,
        bytes_per_nonzero=stored / nonzeros if nonzeros else None,
    )


def _weights(k: Kernel) -> int:
    """The weights of a matmul kernel's dense layer (a grouped convolution is stored block-diagonal)."""
    return int(k.stats.get("dense", 0)) // max(int(k.attrs.get("groups", 1)), 1)


def _sparsity(program: ProgramData) -> float:
    nnz = sum(int(k.stats.get("nnz", 0)) for k in program.kernels if k.op == "sparse_matmul")
    dense = sum(_weights(k) for k in program.kernels if k.op == "sparse_matmul")
    return 1.0 - nnz / dense if dense else 0.0


def _linear(stats: RunStats) -> int:
    return sum(k.cycles for k in stats.kernels if k.op == "sparse_matmul")


def _pruned(k: Kernel) -> bool:
    """Whether ``k`` is a sparse layer: a matmul whose mask prunes some of its weights."""
    return k.op == "sparse_matmul" and int(k.stats.get("nnz", 0)) < _weights(k)


def _cycles(stats: RunStats, names: set[str]) -> int:
    """Cycles of the kernels named (a dense baseline's passes ``<name>.dense<i>`` count for ``name``)."""
    return sum(k.cycles for k in stats.kernels if k.name.rsplit(".dense", 1)[0] in names)


def flop_ratio(program: ProgramData) -> float:
    """Dense over sparse forward FLOPs of the program's matmul kernels: the whole model's ideal speedup.

    A sparse matmul costs ``stats["flops"]`` (``2 * nnz * rows``, or count-flops' figure) and, dense,
    ``2 * rows`` per weight of its dense layer (a grouped convolution's blocks only); an activation
    matmul costs the same on both sides."""
    dense = sparse = 0.0
    for k in program.kernels:
        if not op_kind(k.op).matmul:
            continue
        flops = float(k.stats.get("flops", 0))
        sparse += flops
        if k.op == "matmul":
            dense += flops
            continue
        rows = math.prod(k.shape) // max(int(k.attrs.get("out_features", 1)), 1)
        dense += 2 * rows * _weights(k)
    if sparse <= 0:
        return float("inf") if dense > 0 else 1.0
    return dense / sparse


def steady_interval(program: ProgramData, timeline: Timeline) -> int:
    """Cycles between successive inputs in steady state: pipelined, the busiest PE of any kernel;
    streaming, the whole run."""
    if program.mode != "pipelined":
        return timeline.cycles
    return max([kt.busy_sums()[0] for kt in timeline.kernels if kt.busy.numel()] + [1])


def compare(program: ProgramData, sparse: RunStats, dense: RunStats) -> Comparison:
    """The sparse run against the dense baseline's run (module docstring)."""
    s = _sparsity(program)
    keep = 1.0 - s
    parts = {}
    for part in PARTS:
        a, b = sparse.parts.get(part, 0), dense.parts.get(part, 0)
        parts[part] = {"sparse": a, "dense": b, "ideal": b * keep, "excess": a - b * keep}
    lin_s, lin_d = _linear(sparse), _linear(dense)
    pruned = [k for k in program.kernels if _pruned(k)]
    names = {k.name for k in pruned}
    nnz, weights = sum(int(k.stats["nnz"]) for k in pruned), sum(_weights(k) for k in pruned)
    layers_s, layers_d = _cycles(sparse, names), _cycles(dense, names)
    pes = program.mesh.width * program.mesh.height
    used = {
        "dense_utilization": dense.busy_cycles / max(pes * dense.cycles, 1),
        "sparse_utilization": sparse.busy_cycles / max(pes * sparse.cycles, 1),
        "dense_steady_utilization": dense.busy_cycles / max(pes * dense.interval, 1),
        "sparse_steady_utilization": sparse.busy_cycles / max(pes * sparse.interval, 1),
    }
    ratio = flop_ratio(program)
    realized = dense.cycles / max(sparse.cycles, 1)
    throughput = dense.interval / max(sparse.interval, 1)
    return Comparison(
        dense_cycles=dense.cycles,
        sparse_cycles=sparse.cycles,
        sparsity=s,
        ideal=1.0 / keep if keep > 0 else float("inf"),
        realized=realized,
        linear_dense_cycles=lin_d,
        linear_sparse_cycles=lin_s,
        linear_realized=lin_d / max(lin_s, 1),
        parts=parts,
        dense_interval=dense.interval,
        sparse_interval=sparse.interval,
        throughput_realized=throughput,
        flop_ratio=ratio,
        layers=[k.name for k in pruned],
        layers_sparsity=1.0 - nnz / weights if weights else 0.0,
        layers_ideal=weights / nnz if nnz else (float("inf") if weights else 1.0),
        layers_dense_cycles=layers_d,
        layers_sparse_cycles=layers_s,
        layers_realized=layers_d / max(layers_s, 1) if pruned else 1.0,
        dense_matmuls=[k.name for k in program.kernels if k.op == "sparse_matmul" and not _pruned(k)],
        beyond_flop_ratio=_beyond(program, realized, throughput, ratio, used),
        **used,
    )


def _beyond(
    program: ProgramData, realized: float, throughput: float, ratio: float, used: dict[str, float]
) -> str:
    """Why the whole model's speedup exceeds its FLOP ratio, or "" when it does not.

    A speedup is busy work saved times better use of the mesh: ``dense / sparse cycles = (dense busy /
    sparse busy) x (sparse utilization / dense utilization)``. Sparsity saves busy work no faster than
    FLOPs, so a speedup above the FLOP ratio means the sparse program keeps more of the mesh busy than
    the dense baseline does, with the same search for both. Pipelined on a narrow mesh this happens:
    every kernel takes at least one column, so the dense matmuls are cramped into what is left while
    the sparse ones free columns. It is named, with the utilizations, rather than hidden."""
    said = []
    for what, value, key in (("latency", realized, ""), ("throughput", throughput, "steady_")):
        if value > ratio:
            d, s = used[f"dense_{key}utilization"], used[f"sparse_{key}utilization"]
            busy = f"the sparse program keeps {s:.1%} of the PEs busy, the dense {d:.1%}"
            said.append(f"{what} {value:.3f}x: {busy}")
    if not said:
        return ""
    where = f"{program.mode} on {program.mesh}"
    return (
        f"above the FLOP ratio {ratio:.3f}x ({where}): " + "; ".join(said) + ". The dense baseline uses the "
        "mesh less well (the same search for both), so the FLOP ratio is not a ceiling here; a wider mesh "
        "gives the dense matmuls room"
    )
