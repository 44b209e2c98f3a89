"""The tuner's ranking: the closed-form estimate of a sparse matmul alone, and a search that times only the
best few mappings on the clock."""

from __future__ import annotations

import random

import pytest
import torch

import sparsefx
from sparsefx.passes.lower import blocks, dense_plan, tune
from sparsefx.passes.lower.blocks import candidates, fits
from sparsefx.runtime.alone import kernel_alone
from sparsefx.runtime.cost import rows_of
from sparsefx.runtime.estimate import busiest_pe, sparse_alone
from sparsefx.runtime.layout import layout

CASES = 6


def _model(rng: random.Random) -> tuple[torch.nn.Module, torch.Tensor, float, tuple[int, int], str, str]:
    """A seeded random MLP, sparsity, mesh, mode and placement."""
    torch.manual_seed(rng.randrange(1 << 30))
    d_in, hidden, d_out = rng.choice((32, 64, 96)), rng.choice((64, 128, 256)), rng.choice((32, 64))
    act = rng.choice((torch.nn.ReLU(), torch.nn.GELU()))
    model = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), act, torch.nn.Linear(hidden, d_out))
    x = torch.randn(rng.choice((16, 48, 64)), d_in)
    mesh = rng.choice(((8, 8), (16, 16), (12, 10)))
    return (
        model,
        x,
        rng.choice((0.5, 0.8, 0.9)),
        mesh,
        rng.choice(("streaming", "pipelined")),
        rng.choice(("balanced", "block")),
    )


def _lowered(seed: int) -> tuple[sparsefx.SparseModel, torch.Tensor, sparsefx.DataflowProgram, tuple]:
    model, x, sparsity, mesh, mode, placement = _model(random.Random(seed))
    sm = sparsefx.compile(model, sparsity, (x,))
    program = sparsefx.lower(sm, (x,), mesh=mesh, mode=mode, placement=placement)
    return sm, x, program, (sparsity, mesh, mode, placement)


@pytest.mark.parametrize("seed", range(CASES))
def test_the_busiest_pe_is_the_clocks_at_every_block_size(seed: int) -> None:
    """``busiest_pe`` is exactly the busiest PE the clock counts for a kernel alone (tasks and partial-sum
    adds), at every block size that fits, on seeded random models, meshes, modes and placements."""
    _, _, program, setting = _lowered(seed)
    checked = 0
    for k in (k for k in program.kernels if k.op == "sparse_matmul"):
        known, chosen = layout(program, k), k.attrs["rows_in_flight"]
        for b in candidates(rows_of(k.shape)):
            k.attrs["rows_in_flight"] = b
            if not fits(program, k):
                continue
            clock = int(kernel_alone(program, k, known).busy.max())
            assert busiest_pe(program, k, known, b) == clock, (setting, k.name, b)
            assert sparse_alone(program, k, known, b) > 0
            checked += 1
        k.attrs["rows_in_flight"] = chosen
    assert checked >= 2


def _exhaustive(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search with every mapping timed on the clock and no width left untried."""
    monkeypatch.setattr(tune, "TIMED_CANDIDATES", 1 << 20)
    monkeypatch.setattr(tune, "WORSE_IN_A_ROW", 1 << 20)
    monkeypatch.setattr(tune, "CUT_WIDTHS", 1 << 20)
    monkeypatch.setattr(blocks, "TIMED_CANDIDATES", 1 << 20)


@pytest.mark.parametrize("seed", range(CASES))
def test_timing_the_best_ranked_loses_little_against_timing_every_mapping(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lowering times only ``TIMED_CANDIDATES`` mappings of each kernel, the best its estimate ranks.
    Its program runs within 3% of the cycles of the one lowered with every mapping timed, on the same
    inputs; both compute the model's outputs."""
    sm, x, program, setting = _lowered(seed)
    _, mesh, mode, placement = setting
    with monkeypatch.context() as m:
        _exhaustive(m)
        every = sparsefx.lower(sm, (x,), mesh=mesh, mode=mode, placement=placement)
    fresh = torch.randn_like(x)
    ranked, timed_all = sparsefx.run(program, (fresh,)), sparsefx.run(every, (fresh,))
    cycles = (ranked.stats.cycles, timed_all.stats.cycles)
    assert cycles[0] <= 1.03 * cycles[1], (setting, cycles)
    expect = sm.eval()(fresh)
    for got in (ranked, timed_all):
        assert torch.allclose(got.outputs, expect, rtol=1e-4, atol=1e-5)


def test_a_search_times_at_most_the_best_ranked_and_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each search times at most ``TIMED_CANDIDATES`` mappings on the clock, however many it ranks, and
    lowering the same model twice gives the same program."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 256), torch.nn.GELU(), torch.nn.Linear(256, 96))
    x = torch.randn(64, 96)
    sm = sparsefx.compile(model, 0.9, (x,))
    counts: list[int] = []
    ranked_sizes: list[int] = []
    search, timed, ranked = tune.search, tune.timed, tune.ranked

    def counting_search(*args, **kwargs):
        counts.append(0)
        ranked_sizes.append(0)
        return search(*args, **kwargs)

    def counting_timed(*args, **kwargs):
        counts[-1] += 1
        return timed(*args, **kwargs)

    def counting_ranked(*args, **kwargs):
        out = ranked(*args, **kwargs)
        ranked_sizes[-1] += len(out)
        return out

    monkeypatch.setattr(tune, "search", counting_search)
    monkeypatch.setattr(dense_plan, "search", counting_search)
    monkeypatch.setattr(tune, "timed", counting_timed)
    monkeypatch.setattr(tune, "ranked", counting_ranked)
    first = sparsefx.lower(sm, (x,), mesh=(16, 16), mode="streaming")
    assert counts and max(counts) <= tune.TIMED_CANDIDATES
    assert max(ranked_sizes) > tune.TIMED_CANDIDATES  # it ranked more than it timed
    second = sparsefx.lower(sm, (x,), mesh=(16, 16), mode="streaming")
    assert str(first) == str(second)


@pytest.mark.xfail(
    strict=True,
    reason="known gap: the fast clock books a sparse matmul's partial-sum adds in its PEs' busy cycles but "
    "does not delay its timeline by them, so where adds dominate (many outputs a column, one-row blocks) "
    "a kernel ends before its busiest PE could have done its work",
)
def test_a_kernel_takes_at_least_its_busiest_pes_cycles() -> None:
    """A 64-to-512 layer at 90% on one column of 32 PEs in one-row blocks: each PE adds the partial sums
    of most of the 512 outputs passing it, every block. No kernel ends before its busiest PE is done."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512))
    x = torch.randn(32, 64)
    sm = sparsefx.compile(model, 0.9, (x,))
    program = sparsefx.lower(sm, (x,), mesh=(1, 32), mode="streaming")
    k = next(k for k in program.kernels if k.op == "sparse_matmul")
    k.attrs["rows_in_flight"] = 1
    kt = kernel_alone(program, k, layout(program, k))
    assert kt.end - kt.start >= int(kt.busy.max()), (kt.end - kt.start, int(kt.busy.max()))
