"""The dense baseline's plan: where each kernel would run if every mask were all ones.

``plan_dense`` sizes the regions again with dense weights (``place.py``: SRAM minimum, a share of
the spare columns by work, the same caps), then picks the dense kernels' block sizes with the same
search as the real program (``blocks.py``), in weight-streaming mode their widths and with the
balanced placement their row-cut limits (``tune.py``): the balanced placement of an all-ones weight
is a geometry too (``runtime/layout.py``), and it evens out outputs that the columns do not divide.
It writes ``attrs["dense"] = {"region", "passes", "rows_in_flight"}`` on every kernel (a head merge's
also ``"result_rows"``, a balanced matmul's ``"placement"`` and, when it has one, ``"drift"``);
``runtime/baseline.py`` builds the
dense program from them. In weight-streaming mode a dense matmul whose data needs more columns than
the mesh has runs in ``passes`` over slices of its outputs, as the real lowering does. A dense model
that cannot be placed layer-pipelined is recorded in ``program.meta["dense_unavailable"]`` with the
reason.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from sparsefx.errors import LoweringError
from sparsefx.runtime.baseline import dense_program
from sparsefx.runtime.layout import Layout, balanced_ones
from sparsefx.runtime.mesh import MeshSpec
from sparsefx.runtime.program import Kernel, ProgramData, Region

from .blocks import plan_blocks
from .builder import Pending
from .place import min_width, regions, work
from .split_streamed import plan_passes
from .spread import caps as spread_caps
from .stages import Stages, measured, rebalance
from .tiles import with_tiles
from .tune import DRIFTS, Choice, Report, hidden_behind, rowwise, search

__all__ = ["dense_pending", "plan_dense"]


def dense_pending(p: Pending) -> Pending:
    """``p`` with an all-ones mask (and its FLOPs scaled to the dense weight)."""
    if p.sparse is None:
        return p
    sw = p.sparse
    nnz = max(sw.nnz, 1)
    mask = torch.ones_like(sw.mask)
    return dataclasses.replace(
        p, sparse=dataclasses.replace(sw, mask=mask), flops=p.flops * mask.numel() // nnz
    )


def _width(p: Pending, lanes: int, sram: int, mesh: MeshSpec, mode: str) -> tuple[int, int]:
    """(columns, passes) of one dense kernel; one that fits nowhere needs more columns than the mesh."""

    try:
        w = min_width(p, lanes, sram)
    except LoweringError:
        w = mesh.width + 1
    if mode != "streaming" or p.sparse is None:
        return w, 1
    pieces, needs = plan_passes(p, mesh.width, lambda q, rows: min_width(q, lanes, sram, rows))
    if len(pieces) == 1:
        return w, 1
    return min(max(needs), mesh.width), len(pieces) - 1


def plan_dense(
    program: ProgramData, pending: list[Pending], lanes: int, report: Report | None = None
) -> None:
    """Write the dense plan onto ``program``'s kernels (module docstring); ``report`` as ``tune_sparse``'s."""
    mesh, sram = program.mesh, program.hardware.sram_bytes
    dense = [dense_pending(p) for p in pending]
    sized = [_width(p, lanes, sram, mesh, program.mode) for p in dense]
    widths = [w for w, _ in sized]
    caps = spread_caps(dense, widths, lanes, mesh, program.hardware, program.mode)
    try:
        regs = regions(
            widths, [work(p) for p in dense], mesh, lanes, program.mode, caps, [p.name for p in dense]
        )
    except LoweringError as e:
        program.meta["dense_unavailable"] = f"the dense model does not fit: {e}"
        for k in program.kernels:
            k.attrs.pop("dense", None)
        return
    _plan(program, regs, sized, widths, report)
    if program.mode == "pipelined":
        _balance(program, sized, widths, caps, lanes, report)


def _plan(
    program: ProgramData,
    regs: list[Region],
    sized: list[tuple[int, int]],
    widths: list[int],
    report: Report | None,
) -> None:
    """Write the dense plan for regions ``regs``: tiles, mappings (``_tune``) and block sizes."""
    for k, r, (_, passes) in zip(program.kernels, regs, sized):
        k.attrs["dense"] = {"region": [r.x, r.y, r.width, r.height], "passes": passes}
        tiles = with_tiles(dataclasses.replace(k, region=r, attrs=dict(k.attrs))).attrs.get("row_tiles")
        if tiles is not None:
            k.attrs["dense"]["row_tiles"] = tiles
        if program.placement == "balanced" and k.op == "sparse_matmul":
            k.attrs["dense"]["placement"] = "balanced"
    found = _tune(program, {k.name: w for k, w in zip(program.kernels, widths)}, report)
    baseline = dense_program(program)
    assert baseline is not None
    plan_blocks(baseline, found)
    for k in baseline.kernels:
        name = k.name.rsplit(".dense", 1)[0]
        for key in ("rows_in_flight", "result_rows"):
            if key in k.attrs:
                program.kernel(name).attrs["dense"][key] = k.attrs[key]


def _balance(
    program: ProgramData,
    sized: list[tuple[int, int]],
    mins: list[int],
    caps: list[int],
    lanes: int,
    report: Report | None,
) -> None:
    """Pipelined: the dense plan's columns shared again by what its kernels measure, as the program's
    own are (``stages.py``): the baseline gets the same effort."""
    names = [k.name for k in program.kernels]

    def measure() -> Stages[dict]:
        baseline = dense_program(program)
        assert baseline is not None
        timed = measured(baseline)
        plans = {k.name: copy.deepcopy(k.attrs["dense"]) for k in program.kernels}
        return Stages(plans, timed.widths, timed.interval, timed.latency, timed.busy)

    def build(widths: list[int]) -> Stages[dict] | None:
        try:
            regs = regions(widths, [0.0] * len(widths), program.mesh, lanes, "pipelined", caps, names)
        except LoweringError:
            return None
        _plan(program, regs, sized, mins, report)
        return measure()

    best = rebalance(measure(), build, mins, caps, program.mesh.width)
    for k in program.kernels:
        k.attrs["dense"] = best.program[k.name]


def _tune(program: ProgramData, narrowest: dict[str, int], report: Report | None) -> dict[str, int]:
    """Each dense matmul at its own best mapping (``tune.py``), written into its plan: in streaming
    mode its width, with the balanced placement its row-cut limit; returns the block sizes found.
    The passes of one matmul, and the layers of a stack, take the first one's."""
    balanced = program.placement == "balanced"
    if program.mode != "streaming" and not balanced:
        return {}  # one mapping: ``plan_blocks`` finds its block size
    baseline = dense_program(program)
    assert baseline is not None  # every kernel has its plan
    plans = {k.name: k for k in program.kernels}
    chosen: dict[tuple, Choice | None] = {}
    found: dict[str, int] = {}
    ran: dict[str, int] = {}
    drifts = DRIFTS if balanced else (None,)
    tuned = [i for i, k in enumerate(baseline.kernels) if rowwise(k)]
    for done, i in enumerate(tuned):
        k = baseline.kernels[i]
        if report is not None:
            report(f"{k.name} (dense baseline)", done, len(tuned))
        b = plans[k.name.rsplit(".dense", 1)[0]]
        hidden = hidden_behind(baseline, i, ran)
        key = (b.attrs["in_features"], b.attrs["out_features"], b.shape, b.dtype, "bias" in b.arrays)
        if (key, k.region, hidden) not in chosen:
            chosen[key, k.region, hidden] = search(baseline, k, narrowest[b.name], drifts, _laid_out, hidden)
        choice = chosen[key, k.region, hidden]
        if choice is not None:
            b.attrs["dense"]["region"][2] = choice.width
            if choice.drift is not None:
                b.attrs["dense"]["drift"] = choice.drift
            _laid_out(k, choice.drift)
            k.region = dataclasses.replace(k.region, width=choice.width)
            found[k.name] = choice.rows
            ran[k.name] = choice.run
    return found


def _laid_out(k: Kernel, drift: int | None) -> Layout | None:
    """An all-ones kernel's layout is its geometry (``runtime/layout.py``): only its row-cut limit to set.
    Returns the balanced geometry (``search`` skips a limit that cuts as an earlier one did)."""
    k.attrs.pop("drift", None)
    if drift is not None:
        k.attrs["drift"] = drift
    if k.attrs.get("all_ones") != "balanced":
        return None
    r = k.region
    return balanced_ones(int(k.attrs["in_features"]), int(k.attrs["out_features"]), r.width, r.height, drift)
