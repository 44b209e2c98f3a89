"""Tuning the balanced placement: each kernel keeps the row-cut limit its own clock finds fastest."""

from __future__ import annotations

import copy
import dataclasses

import torch

import sparsefx
from sparsefx.passes.lower.blocks import BUSY_SLACK, TIMED_BLOCKS, _timed, best_sparse, candidates, fits
from sparsefx.passes.lower.install import install
from sparsefx.passes.lower.place_sparse import place_sparse
from sparsefx.passes.lower.tune import DRIFTS, hidden_behind
from sparsefx.runtime.alone import kernel_alone, time_alone
from sparsefx.runtime.cost import load_cycles
from sparsefx.runtime.layout import layout, weight_bytes
from sparsefx.runtime.program import Region


def _lowered(width: int, height: int) -> tuple[sparsefx.SparseModel, torch.Tensor, sparsefx.DataflowProgram]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(768, 768), torch.nn.Linear(768, 768))
    x = torch.randn(128, 768)
    sm = sparsefx.compile(model, 0.9, (x,))
    return sm, x, sparsefx.lower(sm, (x,), mesh=(width, height), mode="streaming", placement="balanced")


def _alone(program: sparsefx.DataflowProgram, name: str, arrays: dict | None = None) -> int:
    k = program.kernel(name)
    if arrays is not None:
        install(program, k, arrays)
    return time_alone(program, k, layout(program, k))


def test_each_kernel_keeps_the_fastest_limit_and_its_outputs() -> None:
    """Each sparse matmul keeps, of every limit in ``DRIFTS``, the one the clock finds fastest at its
    width (each at its best block size of those ``best_sparse`` times, which it keeps too, plus the part
    of its weight load the kernel before does not hide; the earlier limit on a tie), and records it in
    ``attrs["drift"]``, absent only for no limit: ranking the mappings and timing only the best few
    (``tune.search``) finds it here. The outputs are unchanged and the limit survives the text form."""
    sm, x, program = _lowered(64, 64)
    trial = copy.deepcopy(program)  # each limit is laid out here; ``program`` stays as lowered
    ran: dict[str, int] = {}  # the cycles alone of each kernel's kept mapping, as the tuner records them
    limits = []
    for i, k in enumerate(trial.kernels):
        if k.op != "sparse_matmul":
            continue
        hidden = hidden_behind(trial, i, ran)
        weight, mask = sm.get_parameter(k.attrs["param"]).detach(), sm.masks[k.attrs["param"]]
        width, height, kept = k.region.width, k.region.height, k.attrs["rows_in_flight"]
        cycles, best = {}, {}
        for drift in DRIFTS:
            install(trial, k, place_sparse(weight, mask, width, height, "balanced", drift))
            best[drift] = best_sparse(trial, k)
            assert best[drift] is not None
            load = load_cycles(weight_bytes(trial, k), trial.hardware)
            cycles[drift] = best[drift][0] + max(0, load - hidden)
        fastest = min(DRIFTS, key=cycles.__getitem__)  # the first of the fastest
        assert ("drift" in k.attrs) == (fastest is not None), (k.name, cycles)  # set wherever it limits
        assert k.attrs.get("drift") == fastest, (k.name, cycles)
        assert kept == best[fastest][1], (k.name, kept, best[fastest])
        ran[k.name] = best[fastest][2]
        limits.append(fastest)
    assert len(limits) == 2 and any(limit is not None for limit in limits)  # unlimited forks cost more
    fresh = torch.randn_like(x)
    out = sparsefx.run(program, (fresh,)).outputs
    assert torch.allclose(out, sm.eval()(fresh), rtol=1e-4, atol=1e-5)
    assert str(sparsefx.parse_program(str(program))) == str(program)  # the limit survives the text form


def test_block_placement_is_not_tuned() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    x = torch.randn(16, 64)
    sm = sparsefx.compile(model, 0.9, (x,))
    program = sparsefx.lower(sm, (x,), mesh=(8, 8), mode="streaming", placement="block")
    assert all("drift" not in k.attrs for k in program.kernels)


def test_pipelined_blocks_keep_the_busiest_pe_near_its_least() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    x = torch.randn(128, 64)
    sm = sparsefx.compile(model, 0.9, (x,))
    program = sparsefx.lower(sm, (x,), mesh=(16, 16), mode="pipelined")
    for k in (k for k in program.kernels if k.op == "sparse_matmul"):
        chosen = k.attrs["rows_in_flight"]
        busy = {}
        for b in candidates(128):
            k.attrs["rows_in_flight"] = b
            if fits(program, k):
                busy[b] = int(kernel_alone(program, k, layout(program, k)).busy.max())
        k.attrs["rows_in_flight"] = chosen
        least = busy[max(busy)]  # the longest block that fits starts the fewest tasks
        assert busy[chosen] <= least * (1 + BUSY_SLACK)
        assert any(busy[b] > least * (1 + BUSY_SLACK) for b in busy)  # the rule rules something out


def test_long_kernels_are_timed_from_a_few_blocks_within_three_percent() -> None:
    """A block size with more than ``TIMED_BLOCKS`` blocks is timed on its first 8 and 16 and extrapolated:
    the busiest PE's cycles exactly (every block adds the same work), the kernel's within 3%, whatever
    the cut: each kernel at its width is laid out at every limit in ``DRIFTS`` (most are exact; one-row
    blocks of the unlimited cut at 99% come out 2.3% short)."""
    assert TIMED_BLOCKS == 16
    for outputs, sparsity, mode in ((1024, 0.99, "streaming"), (256, 0.9, "pipelined")):
        torch.manual_seed(0)
        # a sigmoid, not an epilogue (``fuse_epilogues``): the first layer's blocks stay alike
        layers = (torch.nn.Linear(256, outputs), torch.nn.Sigmoid(), torch.nn.Linear(outputs, 256))
        model = torch.nn.Sequential(*layers)
        x = torch.randn(256, 256)
        sm = sparsefx.compile(model, sparsity, (x,))
        program = sparsefx.lower(sm, (x,), mesh=(32, 32), mode=mode)
        exact_seen = 0
        for k in (k for k in program.kernels if k.op == "sparse_matmul"):
            weight, mask = sm.get_parameter(k.attrs["param"]).detach(), sm.masks[k.attrs["param"]]
            for drift in DRIFTS:
                cut = dataclasses.replace(k, arrays={}, attrs=dict(k.attrs))
                cut.attrs.pop("drift", None)
                if drift is not None:
                    cut.attrs["drift"] = drift
                r = k.region
                for role, tensor in place_sparse(weight, mask, r.width, r.height, "balanced", drift).items():
                    cut.arrays[role] = program.add_array(f"cut.{k.name}.{role}", tensor)
                known = layout(program, cut)
                for b in (1, 2, 4, 8):  # 256 to 32 blocks
                    cut.attrs["rows_in_flight"] = b
                    exact = kernel_alone(program, cut, known)
                    cycles, busy = _timed(program, cut, known, b)
                    assert abs(cycles / exact.end - 1) <= 0.03, (k.name, drift, b, cycles, exact.end)
                    assert busy == int(exact.busy.max()), (k.name, drift, b)
                    exact_seen += cycles == exact.end
                cut.attrs["rows_in_flight"] = 256  # whole: as the full timing
                whole = kernel_alone(program, cut, known)
                assert kernel_alone(program, cut, known, rows=256).end == whole.end
        assert exact_seen >= 20  # of 24: the steady state is usually exact


def _at_width(
    program: sparsefx.DataflowProgram, k, weight, mask, width: int, hidden: int, drift: int | None = None
) -> int:
    """Cycles of ``k`` alone laid out on ``width`` columns (balanced, under row-cut limit ``drift``, at its
    best block size alone), with the part of its load that ``hidden`` cycles do not hide."""
    region = Region(0, 0, width, k.region.height)
    wide = dataclasses.replace(k, name=f"wide.{k.name}", region=region, arrays={}, attrs=dict(k.attrs))
    wide.attrs.pop("drift", None)
    placed = place_sparse(weight, mask, width, k.region.height, "balanced", drift)
    install(program, wide, placed)  # packed, as lowered
    timed = best_sparse(program, wide)
    assert timed is not None
    return timed[0] + max(0, load_cycles(weight_bytes(program, wide), program.hardware) - hidden)


def _hidden(program: sparsefx.DataflowProgram, k) -> int:
    """What the kernel before ``k`` hid of its load when the lowering searched: timed alone, its rows
    in one block (its block size was not planned yet)."""
    i = program.kernels.index(k)
    before = program.kernels[i - 1] if i else None
    rows = before.attrs.pop("rows_in_flight", None) if before is not None else None
    try:
        return hidden_behind(program, i, {})
    finally:
        if rows is not None:
            before.attrs["rows_in_flight"] = rows


def test_streaming_widths_are_timed_with_their_weight_load() -> None:
    """A streaming matmul on a mesh much wider than its work takes fewer columns: each PE's ranges and
    offsets are loaded from off-mesh memory too. Its chosen width is no slower than the whole mesh,
    counting the load the kernel before does not hide; the dense baseline picks its own width; outputs
    are unchanged."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(32, 64)
    sm = sparsefx.compile(model, 0.9, (x,))
    program = sparsefx.lower(sm, (x,), mesh=(64, 64), mode="streaming")
    sparse = [k for k in program.kernels if k.op == "sparse_matmul"]
    caps = {k.name: min(64, k.attrs["out_features"]) for k in sparse}
    assert any(k.region.width < caps[k.name] for k in sparse)
    assert any(k.attrs["dense"]["region"][2] < caps[k.name] for k in sparse)  # the baseline searches too
    fresh = torch.randn_like(x)
    assert torch.allclose(sparsefx.run(program, (fresh,)).outputs, sm.eval()(fresh), rtol=1e-4, atol=1e-5)
    for k in sparse:
        hidden = _hidden(program, k)
        assert hidden > 0 or program.kernels.index(k) == 0
        weight, mask = sm.get_parameter(k.attrs["param"]).detach(), sm.masks[k.attrs["param"]]
        # alone, each at its best block size: the lowering picks the block size with the kernels after
        chosen = _at_width(program, k, weight, mask, k.region.width, hidden, k.attrs.get("drift"))
        assert chosen <= _at_width(program, k, weight, mask, caps[k.name], hidden), k.name
    pipelined = sparsefx.lower(sm, (x,), mesh=(64, 64), mode="pipelined")  # shares the mesh: not tuned
    assert sum(k.region.width for k in pipelined.kernels) == 64


def test_lowering_reports_each_kernel_it_times() -> None:
    """``on_kernel(name, done, total)`` fires before each sparse matmul is tuned, in order, then before
    each of the dense baseline's (streaming: its widths are searched too)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    x = torch.randn(8, 32)
    sm = sparsefx.compile(model, 0.9, (x,))
    calls: list[tuple[str, int, int]] = []
    steps: list[str] = []
    program = sparsefx.lower(
        sm,
        (x,),
        mesh=(16, 16),
        mode="streaming",
        on_step=steps.append,
        on_kernel=lambda *call: calls.append((*call, steps[-1])),
    )
    sparse = [k.name for k in program.kernels if k.op == "sparse_matmul"]
    assert calls == [(n, i, 2, "plan-blocks") for i, n in enumerate(sparse)] + [
        (f"{n} (dense baseline)", i, 2, "plan-blocks") for i, n in enumerate(sparse)
    ]


def test_a_wider_mesh_leaves_a_streaming_program_that_cannot_use_it_alone() -> None:
    """Cost grows with the work, not with idle PEs: on a mesh 16x as wide every matmul keeps its width
    and every kernel its cycles; the run is longer only by the hops its outputs take to the east edge."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(32, 64)
    sm = sparsefx.compile(model, 0.9, (x,))
    runs = {}
    for width in (64, 1024):
        program = sparsefx.lower(sm, (x,), mesh=(width, 64), mode="streaming")
        stats = sparsefx.run(program, (x,)).stats
        regions = [(k.name, k.region, k.attrs.get("dense")) for k in program.kernels]
        runs[width] = regions, [(k.name, k.cycles) for k in stats.kernels], stats.cycles
    (narrow, narrow_kernels, narrow_cycles), (wide, wide_kernels, wide_cycles) = runs[64], runs[1024]
    assert narrow == wide and narrow_kernels == wide_kernels
    assert wide_cycles - narrow_cycles == (1024 - 64) * program.hardware.hop_cycles


def test_a_placements_own_arrays_read_as_the_installed_layout() -> None:
    """``layout.placed`` reads a placement's arrays as they come (the tuner ranks every candidate so),
    and gives the layout ``layout`` reads, checked, from the installed and packed program."""
    from sparsefx.runtime.layout import placed

    sm, _, program = _lowered(16, 8)
    for k in program.kernels:
        if k.op != "sparse_matmul":
            continue
        weight, mask = sm.get_parameter(k.attrs["param"]).detach(), sm.masks[k.attrs["param"]]
        for placement, drift in (("balanced", None), ("balanced", 0), ("block", None)):
            arrays = place_sparse(weight, mask, k.region.width, k.region.height, placement, drift)
            install(program, k, arrays)
            got, want = placed(arrays, 768, 768), layout(program, k)
            if placement == "block" and got is None:
                continue
            assert got is not None
            for field in ("in_lo", "in_hi", "out_lo", "span", "counts"):
                a, b = getattr(got, field), getattr(want, field)
                assert a.dtype == b.dtype and torch.equal(a, b), (placement, drift, field)
