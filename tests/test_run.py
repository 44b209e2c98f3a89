"""sparsefx.run, fast executor: outputs against PyTorch, the clock's rules, stats, the dense baseline."""

from __future__ import annotations

import copy
import random

import pytest
import torch

import sparsefx
from conftest import HF_VOCAB, LOWER_MESH, compile_builtins, tiny_gpt2_config
from sparsefx.errors import EmulationError
from sparsefx.passes.lower.blocks import ROWWISE, candidates, fits
from sparsefx.runtime import fast, intervals, queues, reuse
from sparsefx.runtime.cost import row_streaming, rows_of
from sparsefx.runtime.layout import Layout
from sparsefx.runtime.memo import kept_for
from sparsefx.runtime.memory import sram_needed
from sparsefx.runtime.mesh import HardwareSpec
from sparsefx.runtime.queues import fifo

MODES = ("pipelined", "streaming")


@pytest.fixture(scope="module")
def builtins():
    return compile_builtins()


@pytest.fixture(scope="module")
def gpt_tiny(builtins) -> sparsefx.DataflowProgram:
    """gpt-tiny lowered pipelined on its mesh, for the tests that only read it."""
    sm, args = builtins["gpt-tiny"]
    return sparsefx.lower(sm, args, mesh=LOWER_MESH["gpt-tiny"])


def _fresh(args: tuple) -> tuple:
    return tuple(
        torch.randint_like(a, 0, 100) if not a.is_floating_point() else torch.randn_like(a) for a in args
    )


def _fifo_by_hand(pe: list[int], arrival: list[int], cost: list[int]) -> list[int]:
    free: dict[int, int] = {}
    finish = [0] * len(pe)
    for i in sorted(range(len(pe)), key=lambda i: (pe[i], arrival[i], i)):
        start = max(arrival[i], free.get(pe[i], -(10**9)))
        finish[i] = free[pe[i]] = start + cost[i]
    return finish


@pytest.mark.parametrize(
    ("first_pe", "lo", "hi"), [(0, 0, 60), (0, -50, 60), (0, 0, 2**40), (2**22, 0, 60)]
)  # int32 keys, arrivals before 0, int64 keys, PE ids past one sort key
def test_fifo_runs_each_pes_tasks_in_arrival_order(first_pe, lo, hi):
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(1, 40)
        pe = [first_pe + rng.randint(0, 4) for _ in range(n)]
        arrival = [rng.randint(lo, hi) for _ in range(n)]
        cost = [rng.randint(0, 9) for _ in range(n)]
        got = fifo(torch.tensor(pe), torch.tensor(arrival), torch.tensor(cost)).tolist()
        assert got == _fifo_by_hand(pe, arrival, cost)


@pytest.mark.parametrize(("lo", "hi"), [(0, 60), (-50, 2**40)])  # int32 and int64 keys
def test_queues_give_each_pes_last_finish_of_each_block(lo, hi):
    rng = random.Random(1)
    for _ in range(30):
        pes, blocks, pairs = rng.randint(1, 5), rng.randint(1, 4), rng.randint(1, 12)
        pe = sorted(rng.randrange(pes) for _ in range(pairs))
        arr = [[rng.randint(lo, hi) for _ in range(pairs)] for _ in range(blocks)]
        cost = [[rng.choice([0, rng.randint(1, 9)]) for _ in range(pairs)] for _ in range(blocks)]
        tasks = [(q, n) for q in range(blocks) for n in range(pairs) if cost[q][n]]
        finish = _fifo_by_hand(
            [pe[n] for q, n in tasks], [arr[q][n] for q, n in tasks], [cost[q][n] for q, n in tasks]
        )
        want = [[0] * blocks for _ in range(pes)]
        for (q, n), t in zip(tasks, finish):
            want[pe[n]][q] = max(want[pe[n]][q], t)
        best, busy = queues.queues(torch.tensor(pe), torch.tensor(arr), torch.tensor(cost), pes)
        assert best.tolist() == want
        assert busy.tolist() == [sum(cost[q][n] for q, n in tasks if pe[n] == p) for p in range(pes)]


@pytest.mark.parametrize(("height", "width", "blocks", "chunk"), [(7, 5, 3, None), (33, 9, 300, 64)])
def test_range_max_is_the_largest_of_each_range(monkeypatch, height, width, blocks, chunk):
    if chunk is not None:  # blocks a few at a time
        monkeypatch.setattr(intervals, "CHUNK", chunk)
    torch.manual_seed(0)
    grid = torch.randint(0, 1000, (height, width, blocks))
    x = torch.randint(0, width, (300,))
    lo = torch.randint(0, height, (300,))
    hi = torch.minimum(lo + torch.randint(0, height, (300,)), torch.tensor(height - 1))
    lo[:20], hi[:20] = 0, height - 1  # whole columns
    encoded = grid * height + torch.arange(height)[:, None, None]
    ranges = zip(lo.tolist(), hi.tolist(), x.tolist())
    want = torch.stack([encoded[a : b + 1, c].amax(0) for a, b, c in ranges])
    assert torch.equal(intervals.range_max(grid, x, lo, hi), want)


def test_cover_finds_each_held_output_and_its_first_and_last_row():
    rng = random.Random(2)
    for _ in range(400):
        width, height, out_f = rng.randint(1, 5), rng.randint(1, 8), rng.randint(1, 30)
        pes = width * height
        lo = [rng.randrange(out_f) for _ in range(pes)]  # cyclic ranges: some wrap, some hold every output
        span = [rng.choice([0, 1, rng.randint(0, out_f), rng.randint(out_f, 2 * out_f)]) for _ in range(pes)]
        rows: dict[int, list[int]] = {}
        for p in range(pes):
            for i in range(min(span[p], out_f)):
                rows.setdefault(p % width * out_f + (lo[p] + i) % out_f, []).append(p // width)
        s = Layout(1, out_f, None, None, torch.tensor(lo), torch.tensor(span), None)
        keys, ymin, ymax = intervals.cover(s, width, height)
        assert keys.tolist() == sorted(rows)
        assert ymin.tolist() == [min(rows[k]) for k in sorted(rows)]
        assert ymax.tolist() == [max(rows[k]) for k in sorted(rows)]


def test_stab_takes_the_least_and_largest_value_over_the_ranges_holding_each_index():
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 70)
        ranges = [sorted(rng.sample(range(n + 1), 2)) for _ in range(rng.randint(1, 12))]
        value = [rng.randint(0, 50) for _ in ranges]
        a, b = (torch.tensor([r[i] for r in ranges]) for i in (0, 1))
        for how, empty, pick in (("amin", 99, min), ("amax", -1, max)):
            got = intervals.stab(a, b, torch.tensor(value), n, empty, how).tolist()
            held = [[v for (x, y), v in zip(ranges, value) if x <= i < y] for i in range(n)]
            assert got == [pick(h) if h else empty for h in held]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(LOWER_MESH))
def test_run_matches_pytorch_and_accounts_for_every_cycle(builtins, name, mode):
    sm, args = builtins[name]
    program = sparsefx.lower(sm, args, mesh=LOWER_MESH[name], mode=mode)
    fresh = _fresh(args)
    result = sparsefx.run(program, fresh)
    torch.testing.assert_close(result.outputs, sm.eval()(*fresh), rtol=1e-4, atol=1e-5)
    s = result.stats
    assert s.cycles > 0 and s.seconds == s.cycles / program.hardware.clock_hz
    assert sum(s.parts.values()) == s.cycles  # the critical path's parts add up to the run
    assert s.critical_path and s.critical_path[-1] in {k.name for k in program.kernels}
    assert int(s.pe_busy.sum()) == sum(
        int(round(k.busy_mean * program.kernel(k.name).region.pes)) for k in s.kernels
    )
    assert all(0 <= k.start <= k.end <= s.cycles for k in s.kernels)
    assert 0 < s.utilization <= 1 and s.imbalance >= 1
    assert s.sram_max <= program.hardware.sram_bytes
    assert s.dense is not None and s.dense.ideal == pytest.approx(1 / (1 - s.dense.sparsity))
    excess = sum(p["excess"] for p in s.dense.parts.values())
    assert excess == pytest.approx(s.cycles - s.dense.dense_cycles * (1 - s.dense.sparsity))


def test_a_streaming_runs_critical_path_is_every_step_and_each_part_is_its_steps(builtins):
    """A streaming step starts when the one before it ends and sends its stored inputs again from
    then, so every step up to the last output's is on the critical path, in program order, and the
    dense ops' part is exactly the steps of the kernels that are not sparse matmuls (a walk back
    through the input each step waited on last skipped steps and charged them to the next kernel)."""
    sm, args = builtins["gpt-tiny"]
    program = sparsefx.lower(sm, args, mesh=(16, 16), mode="streaming")
    s = sparsefx.run(program, _fresh(args)).stats
    assert s.critical_path == [k.name for k in s.kernels][: len(s.critical_path)]
    assert s.critical_path[-1] == max(s.kernels, key=lambda k: k.end).name
    ends = [0] + [k.end for k in s.kernels]
    steps = {k.name: k.end - ends[i] for i, k in enumerate(s.kernels)}
    dense_steps = sum(steps[k.name] for k in s.kernels if k.op != "sparse_matmul")
    assert s.parts["dense_ops"] == dense_steps and sum(s.parts.values()) == s.cycles


@pytest.mark.parametrize("mode", MODES)
def test_dense_baseline_is_the_all_ones_model_lowered_for_real(mode):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32))
    x = torch.randn(16, 64)
    sparse = sparsefx.compile(copy.deepcopy(model), 0.9)
    dense = sparsefx.compile(copy.deepcopy(model), 0.0)
    program = sparsefx.lower(sparse, x, mesh=(16, 16), mode=mode, placement="block")
    real = sparsefx.run(sparsefx.lower(dense, x, mesh=(16, 16), mode=mode, placement="block"), x)
    stats = sparsefx.run(program, x).stats
    assert stats.dense.dense_cycles == real.stats.cycles
    assert (stats.dense.dense_interval, stats.dense.sparse_interval) == (real.stats.interval, stats.interval)
    assert stats.dense.throughput_realized == real.stats.interval / stats.interval


def test_zero_inputs_are_filtered_at_the_sender():
    torch.manual_seed(0)
    sm = sparsefx.compile(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)), 0.5
    )
    x = torch.randn(4, 32)
    program = sparsefx.lower(sm, x, mesh=(8, 8))
    busy = sparsefx.run(program, x).stats
    x_half = x.clone()
    x_half[:, ::2] = 0  # half the input features are zero in every row
    half = sparsefx.run(program, x_half).stats
    first = program.kernels[0].name
    k_busy = next(k for k in busy.kernels if k.name == first)
    k_half = next(k for k in half.kernels if k.name == first)
    assert k_busy.skipped_messages == 0 and k_half.skipped_messages > 0 and k_half.skipped_axpys > 0
    assert k_half.axpys + k_half.skipped_axpys == k_busy.axpys
    assert k_half.busy_max < k_busy.busy_max
    assert busy.skipped_messages > 0  # the ReLU zeroes some of the second matmul's inputs


def test_a_loaded_program_gives_identical_outputs_and_stats(builtins, gpt_tiny, tmp_path):
    args, program = builtins["gpt-tiny"][1], gpt_tiny
    path = tmp_path / "gpt.sfxp"
    program.save(str(path))
    loaded = sparsefx.load_program(str(path))
    a, b = sparsefx.run(program, args), sparsefx.run(loaded, args)
    assert torch.equal(a.outputs, b.outputs)
    assert a.stats.to_json() == b.stats.to_json()


@pytest.mark.parametrize(("name", "mode"), [("gpt-tiny", "pipelined"), ("mlp", "streaming")])
def test_a_second_run_reuses_what_it_derived_and_sees_weights_changed_in_place(builtins, name, mode):
    sm, args = builtins[name]
    program = sparsefx.lower(sm, args, mesh=LOWER_MESH[name], mode=mode)
    first = sparsefx.run(program, args)  # derives the merged matrices, layouts and routes' queues
    again, fresh = sparsefx.run(program, args), sparsefx.run(copy.deepcopy(program), args)
    for other in (again, fresh):
        assert torch.equal(other.outputs, first.outputs)
        assert other.stats.to_json() == first.stats.to_json()
    k = next(k for k in program.kernels if k.op == "sparse_matmul")
    program.arrays[k.arrays["values"]].mul_(2)  # a weight edited in place after a run
    changed, copied = sparsefx.run(program, args), sparsefx.run(copy.deepcopy(program), args)
    assert not torch.allclose(changed.outputs, first.outputs)
    assert torch.equal(changed.outputs, copied.outputs)
    assert changed.stats.to_json() == copied.stats.to_json()
    gaps = program.arrays[k.arrays["index"]]  # another array swapped in: each PE's first slots
    program.arrays[k.arrays["index"]] = torch.zeros(len(program.array(k, "values")), dtype=gaps.dtype)
    swapped, copied = sparsefx.run(program, args), sparsefx.run(copy.deepcopy(program), args)
    assert not torch.allclose(swapped.outputs, changed.outputs)
    assert torch.equal(swapped.outputs, copied.outputs)


def _fits_at(program: sparsefx.DataflowProgram, k, rows: int) -> bool:
    """Whether ``k``'s busiest PE would fit a PE's SRAM with ``rows`` rows in flight."""
    had = k.attrs["rows_in_flight"]
    k.attrs["rows_in_flight"] = rows
    try:
        return fits(program, k)
    finally:
        k.attrs["rows_in_flight"] = had


def _longest(program: sparsefx.DataflowProgram, k, sram: int) -> int:
    """The longest block size ``plan_blocks`` tries for ``k`` at which its busiest PE, laid out as it is
    in ``program``, fits ``sram`` bytes (0: none)."""
    had = k.attrs["rows_in_flight"]
    try:
        for b in candidates(rows_of(k.shape)):
            k.attrs["rows_in_flight"] = b
            if sram_needed(program, k) <= sram:
                return b
        return 0
    finally:
        k.attrs["rows_in_flight"] = had


def test_rows_in_flight_are_chosen_within_sram(builtins, gpt_tiny):
    """With a PE's SRAM one byte short of what the busiest PE of gpt-tiny's roomy program needs, every
    kernel's rows in flight keep its busiest PE within it, and the SRAM is what cut them. A sparse matmul
    whose block shrank on the same region lost its longest blocks to the SRAM, in the layout it has or
    in the one it had with room: the block search keeps a shorter, busier block only within
    ``BUSY_SLACK`` of the longest that fits, and the row-cut limit is chosen with the blocks, so a layout
    that loses its longest block can give way to another or to a shorter block even where the roomy
    size would still fit. Any other kernel takes the rows its inputs stream (or all its rows), halved
    only while they do not fit (``plan_blocks``)."""
    sm, args = builtins["gpt-tiny"]
    roomy = gpt_tiny
    room = roomy.hardware.sram_bytes
    short = max(sram_needed(roomy, k) for k in roomy.kernels) - 1
    program = sparsefx.lower(sm, args, mesh=LOWER_MESH["gpt-tiny"], hardware=HardwareSpec(sram_bytes=short))
    assert all(isinstance(k.attrs["dense"]["region"], list) for k in program.kernels)
    chosen = {k.name: k.attrs.get("rows_in_flight") for k in program.kernels}
    assert all(isinstance(b, int) for b in chosen.values()), chosen
    cut = 0
    for k in program.kernels:
        b = chosen[k.name]
        assert sram_needed(program, k) <= short, (k.name, b)
        if k.op == "sparse_matmul" and k.attrs.get("kind") in ROWWISE:
            assert b in candidates(rows_of(k.shape)), (k.name, b)
            was = roomy.kernel(k.name)
            if b < was.attrs["rows_in_flight"] and k.region == was.region:
                cut += 1
                here = _longest(program, k, short) < _longest(program, k, room)
                there = _longest(roomy, was, short) < _longest(roomy, was, room)
                assert here or there, (k.name, b, was.attrs["rows_in_flight"], k.attrs.get("drift"))
            continue
        aligned = [chosen[v] for v in k.inputs if v in chosen and row_streaming(program, k, v)]
        sizes = [min(aligned) if aligned else max(rows_of(k.shape), 1)]
        while sizes[-1] > 1:
            sizes.append(sizes[-1] // 2)
        at = sizes.index(b)
        assert at == 0 or not _fits_at(program, k, sizes[at - 1]), (k.name, sizes, b)
    assert cut  # the SRAM bound bit


def test_bad_executor_is_an_emulation_error(builtins):
    sm, args = builtins["mlp"]
    program = sparsefx.lower(sm, args, mesh=LOWER_MESH["mlp"])
    with pytest.raises(EmulationError, match="executor 'warp' is not one of fast, reference"):
        sparsefx.run(program, args, executor="warp")


def test_hf_gpt2_runs_with_its_integer_kernels():
    """Position ids are int64, which has no SIMD width: its kernels cost one value per cycle."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(tiny_gpt2_config()).eval()
    ids = torch.randint(0, HF_VOCAB, (2, 16))
    sm = sparsefx.compile(model, 0.9, (ids,))
    program = sparsefx.lower(sm, (ids,), mesh=(64, 64), mode="streaming")
    assert any(k.dtype == "int64" for k in program.kernels)
    fresh = torch.randint(0, HF_VOCAB, (2, 16))
    result = sparsefx.run(program, (fresh,))
    torch.testing.assert_close(result.outputs.logits, sm.eval()(fresh).logits, rtol=1e-4, atol=1e-5)
    assert sum(result.stats.parts.values()) == result.stats.cycles and result.stats.dense is not None


@pytest.mark.parametrize(
    ("name", "mode"), [("mlp", "streaming"), ("mlp", "pipelined"), ("gpt-tiny", "streaming")]
)
def test_reused_timings_are_the_ones_the_clock_computes(builtins, monkeypatch, name, mode):
    """A kernel met again in the same situation (its inputs' departures from its start, its zero pattern)
    takes its earlier timing, moved to its start: in one run (a stack's layer norms, at later cycles)
    and on a later run. Every run equals the clock's own count with reuse switched off."""
    sm, args = builtins[name]
    program = sparsefx.lower(sm, args, mesh=LOWER_MESH[name], mode=mode)
    inputs = [args, _fresh(args)]
    if name == "mlp":  # another zero pattern: the first matmul skips half its inputs
        half = args[0].clone()
        half[:, ::2] = 0
        inputs.append((half,))
    timed: list[str] = []
    computed = fast.FastClock._time
    monkeypatch.setattr(fast.FastClock, "_time", lambda self, k, t0: timed.append(k) or computed(self, k, t0))
    reused = []
    for x in inputs + [args]:
        timed.clear()
        reused.append(sparsefx.run(program, x).stats.to_json())
        if len(reused) == 1 and name == "gpt-tiny":  # the baseline's kernels are timed too
            assert len(timed) < 2 * len(program.kernels)
    assert timed == []  # the first inputs again: every kernel reused
    monkeypatch.setattr(reuse, "REUSE", False)
    assert [sparsefx.run(program, x).stats.to_json() for x in inputs + [args]] == reused


def test_each_kernel_keeps_the_timings_of_its_latest_situations_only(builtins):
    """A ReLU model meets a new zero pattern on every run: the kept timings stay bounded."""
    sm, args = builtins["mlp"]
    program = sparsefx.lower(sm, args, mesh=LOWER_MESH["mlp"], mode="streaming")
    k = next(k for k in program.kernels if k.op == "sparse_matmul")
    for i in range(reuse.SITUATIONS + 3):
        x = args[0].clone()
        x[:, i :: reuse.SITUATIONS + 3] = 0  # another zero pattern each run
        sparsefx.run(program, (x,))
    timings = kept_for(program, k, ("timings", *fast.FastClock(program, None).setting(k)), dict)
    assert len(timings) == reuse.SITUATIONS
