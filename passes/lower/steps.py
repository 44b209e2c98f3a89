"""The lowering steps, each a small pass over one ``LoweringState``, run by the ``PassManager``.

``walk-graph`` turns nodes into pending kernels, ``size-regions`` gives each a region, ``place-data``
writes every kernel's per-PE arrays (the sparse matmuls' CSC slices, growing a region whose PEs
would overflow their SRAM), ``connect`` adds routes, colors and tasks, and ``verify-program``
checks the result. The manager's text callback prints the program as far as it is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import fx

from sparsefx.errors import LoweringError
from sparsefx.runtime.csc import imbalance
from sparsefx.runtime.dataflow import DataflowProgram
from sparsefx.runtime.fast import simulate
from sparsefx.runtime.held import crowded, held_overflow
from sparsefx.runtime.memory import pe_bytes, sram_needed
from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
from sparsefx.runtime.program import Kernel, Region
from sparsefx.runtime.stats import steady_interval

from ..manager import PassResult
from .blocks import plan_blocks
from .builder import Pending
from .connect import assign, internal_routes, tasks_for, value_routes
from .dense_plan import dense_pending, plan_dense
from .flops import counted_flops
from .fuse_epilogues import fuse_epilogues
from .fuse_layouts import fuse_layouts
from .host_join import join_on_host
from .install import install
from .interpret import walk_graph
from .place import lanes_for, min_width, regions, work
from .place_sparse import place_sparse
from .split_streamed import plan_passes
from .spread import caps as spread_caps
from .stages import Stages, measured, rebalance
from .tiles import with_tiles
from .tune import tune_sparse

__all__ = [
    "LoweringState",
    "WalkGraph",
    "SizeRegions",
    "PlaceData",
    "PlanBlocks",
    "Connect",
    "VerifyProgram",
    "STEPS",
]


@dataclass
class LoweringState:
    """What the lowering steps share: the graph and example call, the target, and the program so far."""

    graph: fx.GraphModule
    args: tuple
    kwargs: dict
    mesh: MeshSpec
    hardware: HardwareSpec
    mode: str
    placement: str
    meta: dict[str, Any] = field(default_factory=dict)
    pending: list[Pending] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    program: DataflowProgram | None = None


def text(state: LoweringState) -> str:
    """The program as far as it is built (the PassManager's history text)."""
    if state.program is not None:
        return str(state.program)
    return "\n".join(
        f"{p.name} = {p.op}({', '.join(p.inputs)}) : {p.dtype}{list(p.shape)}" for p in state.pending
    )


@dataclass(frozen=True)
class WalkGraph:
    """Graph nodes -> pending kernels, program inputs and outputs."""

    name: ClassVar[str] = "walk-graph"

    def __call__(self, state: LoweringState) -> PassResult:
        walk = walk_graph(state.graph, state.args, state.kwargs, state.meta.get("skip"))
        state.pending = fuse_epilogues(fuse_layouts(walk.builder.pending, walk.outputs), walk.outputs)
        if state.mode == "streaming":  # the host sends the table rows the ids pick (``layout.py``)
            for p in state.pending:
                if p.op == "embedding":
                    p.attrs["gather"] = "host"
        state.meta["flops"] = counted_flops(state.graph, state.args, state.kwargs)
        state.program = None
        state.meta["walk"] = walk
        state.meta["outputs"] = [walk.outputs, walk.output_tree]  # size-regions may join some on the host
        return PassResult(state, True)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SizeRegions:
    """Each kernel's width: what its data needs, plus a share of the rest by work (``place.py``)."""

    name: ClassVar[str] = "size-regions"

    def __call__(self, state: LoweringState) -> PassResult:
        walk = state.meta["walk"]
        lanes = lanes_for(state.pending, [s.shape for s in walk.builder.inputs], state.mesh)
        sram = state.hardware.sram_bytes
        state.meta["lanes"] = lanes
        state.widths = [min_width(p, lanes, sram) for p in state.pending]
        if state.mode == "streaming":
            self._split_streamed(state, lanes, sram)
        return PassResult(state, True)  # type: ignore[arg-type]

    @staticmethod
    def _split_streamed(state: LoweringState, lanes: int, sram: int) -> None:
        """Streaming: a matmul wider than the mesh runs in passes over slices of its outputs; the parts
        of one the model returns go to the host, which puts them together (``host_join.py``)."""
        pending, widths = [], []
        for p, w in zip(state.pending, state.widths):
            if p.sparse is None:
                pending.append(p)
                widths.append(w)
                continue
            pieces, need = plan_passes(p, state.mesh.width, lambda q, rows: min_width(q, lanes, sram, rows))
            if len(pieces) == 1:
                need = [w]
            pending += pieces
            widths += need
        walk = state.meta["walk"]
        kept, outputs, tree = join_on_host(pending, walk.outputs, walk.output_tree)
        state.meta["outputs"] = [outputs, tree]
        width = {p.name: w for p, w in zip(pending, widths)}
        state.pending, state.widths = kept, [width[p.name] for p in kept]


def _kernel(p: Pending, region: Region) -> Kernel:
    attrs = dict(p.attrs)
    attrs["lanes"] = region.height
    k = Kernel(p.name, p.op, region, p.inputs, p.shape, p.dtype, attrs, source=p.source)
    return with_tiles(k)


@dataclass(frozen=True)
class PlaceData:
    """Regions and per-PE arrays; a kernel whose PEs would overflow SRAM (with the values a streaming
    program keeps on them, ``runtime/held.py``) gets more columns.

    Pipelined, the spare columns are shared by work, and a sparse matmul's work shrinks with its
    nonzeros while its outputs still have to leave it: at 99% a one-column layer can be slower than
    the same layer at 90% on five. So two shares are candidates, by the kernels' sparse work and by
    the work their dense weights would have (the dense baseline's share); with every mask all ones the
    two are the same. Both are placed here (``state.meta["candidates"]``, the first also as
    ``state.program``), and ``plan-blocks`` keeps the one that is faster with its own block plan."""

    name: ClassVar[str] = "place-data"
    attempts: int = 10

    def __call__(self, state: LoweringState) -> PassResult:
        lanes = state.meta["lanes"]
        candidates = [[work(p) for p in state.pending]]
        if state.mode == "pipelined":
            dense = [work(dense_pending(p)) for p in state.pending]
            if dense != candidates[0]:
                candidates.append(dense)
        fitted = [self._fit(state, lanes, works, list(state.widths)) for works in candidates]
        state.meta["candidates"] = fitted
        state.program, state.widths = fitted[0]
        return PassResult(state, True)  # type: ignore[arg-type]

    def _fit(
        self, state: LoweringState, lanes: int, works: list[float], widths: list[int]
    ) -> tuple[DataflowProgram, list[int]]:
        """The program placed with ``works``' share, each kernel grown until its data fits its SRAM."""
        caps = spread_caps(state.pending, widths, lanes, state.mesh, state.hardware, state.mode)
        for _ in range(self.attempts):
            names = [p.name for p in state.pending]
            regs = regions(widths, works, state.mesh, lanes, state.mode, caps, names)
            program, grow = self._build(state, regs)
            if not grow:
                return program, widths
            for i in grow:
                widths[i] = min(state.mesh.width, math.ceil(regs[i].width * 1.5) + 1)
                caps[i] = max(caps[i], widths[i])
        raise LoweringError(
            f"kernels {[state.pending[i].name for i in grow]} do not fit their SRAM after growing"
        )

    def _build(self, state: LoweringState, regs: list[Region]) -> tuple[DataflowProgram, list[int]]:
        walk = state.meta["walk"]
        p = DataflowProgram(state.mesh, state.hardware, state.mode, state.placement)
        p.inputs = list(walk.builder.inputs)
        outputs, p.output_tree = state.meta["outputs"]
        p.outputs = list(outputs)
        p.output_spec = walk.output_spec
        grow = []
        needs = {}  # each kernel's SRAM a PE, for the values-kept check below too
        cache = state.meta.setdefault("placed", {})  # (kernel, width, height) -> arrays, across attempts
        for i, (pend, region) in enumerate(zip(state.pending, regs)):
            k = _kernel(pend, region)
            p.kernels.append(k)
            placed = cache.setdefault((i, region.width, region.height), {})
            _arrays(p, k, pend, state.placement, placed, state.meta["flops"])
            need = pe_bytes(p, k) if k.region.pes else torch.zeros(1)
            needs[k.name] = need
            k.stats["sram_max"] = int(need.max())
            if k.stats["sram_max"] > state.hardware.sram_bytes:
                if region.width >= state.mesh.width:
                    raise LoweringError(
                        f"kernel {k.name!r} needs {k.stats['sram_max']} bytes on its busiest PE with all "
                        f"{state.mesh.width} columns; a PE has {state.hardware.sram_bytes} bytes "
                        f"({pend.source})"
                    )
                grow.append(i)
        if not grow and state.mode == "streaming":  # values kept between steps share their PEs
            grow = [i for i in crowded(p, needs) if regs[i].width < state.mesh.width]
        return p, grow


def _balanced_stages(state: LoweringState, report: Any) -> DataflowProgram:
    """The pipelined program with its columns shared again by what each kernel measures (``stages.py``),
    each share placed, planned and timed as the first was."""
    lanes, mesh, mins = state.meta["lanes"], state.mesh, list(state.widths)
    caps = spread_caps(state.pending, mins, lanes, mesh, state.hardware, state.mode)
    label = None if report is None else _labelled(report, "stages balanced")

    def build(widths: list[int]) -> Stages[DataflowProgram] | None:
        try:
            program, _ = PlaceData()._fit(state, lanes, [0.0] * len(widths), list(widths))
        except LoweringError:
            return None
        narrowest = {p.name: w for p, w in zip(state.pending, mins)}
        plan_blocks(program, tune_sparse(program, state.pending, narrowest, state.placement, label))
        return measured(program)

    assert state.program is not None
    return rebalance(measured(state.program), build, mins, caps, mesh.width).program


def _labelled(report: Any, label: str) -> Any:
    """``report`` with ``label`` after each kernel's name."""
    return lambda name, done, total: report(f"{name} ({label})", done, total)


def _finish(program: DataflowProgram) -> tuple[int, int]:
    """(cycles, interval) of ``program`` on the fast clock, every activation taken as nonzero."""
    timeline = simulate(program)
    return timeline.cycles, steady_interval(program, timeline)


def _arrays(p: DataflowProgram, k: Kernel, pend: Pending, placement: str, placed: dict, flops: dict) -> None:
    for role, tensor in pend.payload.items():
        k.arrays[role] = p.add_array(f"{k.name}.{role}", tensor.reshape(-1) if tensor.dim() != 1 else tensor)
        k.attrs.setdefault("shapes", {})[role] = list(tensor.shape)
    k.stats["flops"] = pend.flops
    if pend.sparse is None:
        return
    counted = flops.get(pend.node)  # count-flops' figure for the graph node (a streamed part keeps its share)
    if counted is not None and "out_offset" not in pend.attrs:
        k.stats["flops"] = counted
    sw = pend.sparse
    if not placed:
        placed.update(place_sparse(sw.weight, sw.mask, k.region.width, k.region.height, placement))
    arrays = placed
    if sw.bias is not None:
        k.arrays["bias"] = p.add_array(f"{k.name}.bias", sw.bias.detach().reshape(-1))
    install(p, k, arrays)
    nnz = int(arrays["nz_ptr"][-1])
    k.stats |= {
        "nnz": nnz,
        "dense": int(sw.weight.numel()),
        "imbalance": round(imbalance(arrays["nz_ptr"]), 4),
    }


@dataclass(frozen=True)
class PlanBlocks:
    """Each sparse matmul's mapping (``tune.py``: streaming, its width; balanced, its row cuts' limit),
    every kernel's rows in flight (``blocks.py``), and the dense baseline's plan (``dense_plan.py``).

    With two placements to choose from (``place-data``'s shares of the columns), each gets its own
    mapping and block plan, and the fast clock keeps the one with the shorter latency, then the shorter
    steady-state interval: a share is judged with the blocks it will run in, on the figure a run
    reports first. (Judged before its blocks were planned, in blocks of ``ROWS_IN_FLIGHT`` rows, and
    by interval first, gpt-tiny pipelined on 160x8 under an earlier cost model kept the share by sparse
    work at 99%: 640 cycles an input against 704, but 7,154 cycles of latency against 5,388, and it
    ran slower than at 90%.)"""

    name: ClassVar[str] = "plan-blocks"

    def __call__(self, state: LoweringState) -> PassResult:
        report = state.meta.get("on_kernel")
        candidates = state.meta.pop("candidates", None) or [(state.program, state.widths)]
        for i, (program, widths) in enumerate(candidates):
            narrowest = {p.name: w for p, w in zip(state.pending, widths)}
            label = report if i == 0 or report is None else _labelled(report, "share by dense work")
            plan_blocks(program, tune_sparse(program, state.pending, narrowest, state.placement, label))
        if len(candidates) > 1:
            candidates = sorted(candidates, key=lambda pw: _finish(pw[0]))
        state.program, state.widths = candidates[0]
        if state.mode == "pipelined":
            state.program = _balanced_stages(state, report)
        program = state.program
        assert program is not None
        plan_dense(program, state.pending, state.meta["lanes"], report)
        for k in program.kernels:  # measured when placed; the rows in flight chosen here add buffers
            if "sram_max" in k.stats:
                k.stats["sram_max"] = sram_needed(program, k)
        return PassResult(state, True)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Connect:
    """Routes for every value and inside reducing kernels, their colors, and each kernel's tasks."""

    name: ClassVar[str] = "connect"

    def __call__(self, state: LoweringState) -> PassResult:
        p = state.program
        assert p is not None
        inputs = {s.name: s.shape for s in p.inputs}
        drafts = value_routes(p.kernels, inputs, p.outputs, p.mesh, state.meta["lanes"], p.mode)
        drafts += internal_routes(p.kernels, p.mode)
        p.routes, runs = assign(drafts, p.hardware.colors)
        p.add_array("routes.runs", runs)
        for k in p.kernels:
            k.tasks = tasks_for(k, [r for r in p.routes if r.src == k.name or k.name in r.dsts])
        return PassResult(state, True)  # type: ignore[arg-type]


@dataclass(frozen=True)
class CheckKeptValues:
    """Where a streaming program's values kept between steps and a step's own data overflow a PE's
    SRAM (``runtime/held.py``), say so in ``state.meta["kept_overflow"]``: ``sparsefx.lower`` warns
    with it, naming the step, the PE and the values."""

    name: ClassVar[str] = "check-kept-values"

    def __call__(self, state: LoweringState) -> PassResult:
        assert state.program is not None
        state.meta["kept_overflow"] = held_overflow(state.program)
        return PassResult(state, False)  # type: ignore[arg-type]


@dataclass(frozen=True)
class VerifyProgram:
    """``program.verify()``: a lowering bug surfaces here, naming the kernel and PE."""

    name: ClassVar[str] = "verify-program"

    def __call__(self, state: LoweringState) -> PassResult:
        assert state.program is not None
        state.program.verify()
        return PassResult(state, False)  # type: ignore[arg-type]


STEPS = (WalkGraph(), SizeRegions(), PlaceData(), PlanBlocks(), Connect(), CheckKeptValues(), VerifyProgram())
