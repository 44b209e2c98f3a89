"""Values a streaming program keeps between steps take SRAM where they wait (their producer's PEs, or its
east column); where they outgrow it, lowering warns and says what would fit (``runtime/held.py``)."""

from __future__ import annotations

import dataclasses
import re
import warnings

import pytest
import torch

import sparsefx
from sparsefx.models.gpt import GPT, GPTConfig
from sparsefx.passes.lower.blocks import fits
from sparsefx.runtime.held import crowded, held_peak, kept_beside, lane_bytes
from sparsefx.runtime.homes import kept_where, stays
from sparsefx.runtime.mesh import hardware

SMALL = dataclasses.replace(hardware(), sram_bytes=8192)  # a machine with 8 KB a PE


def _model() -> sparsefx.SparseModel:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    return sparsefx.compile(model, 0.9, (torch.randn(4, 32),))


def test_kept_bytes_are_every_row_of_each_lanes_features() -> None:
    x = torch.randn(64, 32)
    p = sparsefx.lower(_model(), (x,), mesh=(8, 8), mode="streaming")
    first = p.kernels[0]  # the first linear, its ReLU its epilogue
    assert "epilogue" in first.attrs and [k.op for k in p.kernels] == ["sparse_matmul"] * 2
    assert lane_bytes(first).tolist() == [64 * 8 * 4] * 8  # 64 features on 8 lanes, fp32
    # kept spread: a lane's 8 features on 8 columns, every row
    x_, y_, nbytes = kept_where(p, first)
    assert nbytes.tolist() == [64 * 4] * 64 and len(set(zip(x_.tolist(), y_.tolist()))) == 64
    peak = held_peak(p)
    assert peak is not None and peak.total <= p.hardware.sram_bytes
    assert held_peak(sparsefx.lower(_model(), (x,), mesh=(16, 8), mode="pipelined")) is None


def test_a_value_that_outgrows_sram_is_a_warning_at_lowering_that_says_what_fits() -> None:
    sm = _model()
    with pytest.warns(UserWarning, match="keeps .* bytes of .* for later steps") as caught:
        p = sparsefx.lower(sm, (torch.randn(2048, 32),), mesh=(8, 8), mode="streaming", hardware=SMALL)
    message = str(caught[0].message)
    assert "8,192 bytes of SRAM" in message and "does not spill" in message
    assert held_peak(p).total > SMALL.sram_bytes
    fits = int(re.search(r"About ([\d,]+) of its 2,048 rows would fit", message).group(1).replace(",", ""))
    assert 0 < fits < 2048
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the advice holds: no warning
        p = sparsefx.lower(sm, (torch.randn(fits, 32),), mesh=(8, 8), mode="streaming", hardware=SMALL)
    assert held_peak(p).total <= SMALL.sram_bytes
    x = torch.randn(512, 32)  # pipelined keeps nothing between steps
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program = sparsefx.lower(sm, (x,), mesh=(16, 8), mode="pipelined", hardware=SMALL)
    torch.testing.assert_close(sparsefx.run(program, x).outputs, sm.eval()(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("tokens", "mesh", "sram"), [(16, (8, 8), 4096), (32, (8, 8), 8192), (48, (16, 8), 8192)]
)
def test_each_step_sizes_its_blocks_to_leave_room_for_the_values_kept_on_its_pes(tokens, mesh, sram) -> None:
    """A GPT block keeps the residual and q, k and v on column 0 while the head split, attention and
    MLP steps run there. Sized for their own data alone, those steps filled the PE (each of these
    cases warned); they now take fewer rows in flight, and every step fits beside what is kept."""
    torch.manual_seed(tokens)
    model = GPT(GPTConfig(n_layer=1, n_head=4, d_model=64, vocab_size=256, max_seq_len=64)).eval()
    ids = torch.randint(0, 256, (1, tokens))
    sm = sparsefx.compile(model, 0.9, (ids,))
    machine = dataclasses.replace(hardware(), sram_bytes=sram)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = sparsefx.lower(sm, (ids,), mesh=mesh, mode="streaming", hardware=machine)
    beside = kept_beside(p)
    assert beside and any(k.name in beside and k.op == "layout" for k in p.kernels)
    assert all(fits(p, k, beside) for k in p.kernels)
    assert held_peak(p).total <= sram
    ids = torch.randint(0, 256, (1, tokens))
    torch.testing.assert_close(sparsefx.run(p, (ids,)).outputs, sm.eval()(ids), rtol=1e-4, atol=1e-5)


def test_the_program_summary_shows_the_busiest_pe_with_kept_values() -> None:
    """``sparsefx inspect`` and ``lower``'s report read it from ``summary``."""
    from sparsefx.runtime.summary import summary, totals_table

    x = torch.randn(64, 32)
    p = sparsefx.lower(_model(), (x,), mesh=(8, 8), mode="streaming")
    kept, peak = summary(p)["totals"]["kept"], held_peak(p)
    assert kept == {"step": peak.step, "pe": [peak.x, peak.y], "bytes": peak.total, "kept_bytes": peak.held}
    labels = [c for c in totals_table(p).columns[0].cells]
    assert "SRAM of the busiest PE with the values kept between steps" in labels
    pipelined = sparsefx.lower(_model(), (x,), mesh=(16, 8), mode="pipelined")
    assert summary(pipelined)["totals"]["kept"] is None


def test_a_crowded_pe_widens_the_one_column_layout_whose_result_it_keeps() -> None:
    """A head split on one column keeps its result there; more columns give it row tiles, which spread
    that result, so where it crowds a step's PE the lowering widens it too (``held.crowded``)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=4, d_model=64, vocab_size=256, max_seq_len=64)).eval()
    ids = torch.randint(0, 256, (1, 64))  # the heads wait beside the attention scores
    p = sparsefx.lower(sparsefx.compile(model, 0.9, (ids,)), (ids,), mesh=(8, 8), mode="streaming")
    peak = held_peak(p)
    index = {k.name: i for i, k in enumerate(p.kernels)}
    kept = [p.kernels[index[v]] for v in peak.values]
    split = next(k for k in kept if k.op == "layout")
    assert split.region.width == 1 and not stays(p, split)  # its result waits on its one column
    p.hardware = dataclasses.replace(p.hardware, sram_bytes=peak.total - 1)
    assert index[split.name] in crowded(p)
