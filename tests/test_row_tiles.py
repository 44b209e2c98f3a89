"""Row tiles (``runtime/tiles.py``): kernels without stored weights split each block's rows over the
column groups their region holds. Both executors run the same tasks on the same PEs and agree on the
cycles, outputs stay PyTorch's, a tile count that does not fit is refused, and tiles never slow a
kernel down."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_reference import _agree

import sparsefx
from sparsefx.errors import ProgramFormatError
from sparsefx.models.gpt import GPT, GPTConfig
from sparsefx.runtime.fast import simulate
from sparsefx.runtime.text import parse_program, print_program
from sparsefx.runtime.tiles import row_tiles


@pytest.fixture(scope="module")
def gpt() -> tuple:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, vocab_size=64, max_seq_len=64)).eval()
    ids = torch.randint(0, 64, (2, 16))
    return sparsefx.compile(model, 0.8, (ids,)), ids


@pytest.fixture(scope="module")
def program(gpt) -> sparsefx.DataflowProgram:
    sm, ids = gpt
    return sparsefx.lower(sm, (ids,), mesh=(16, 16), mode="streaming")


def _tiled(program: sparsefx.DataflowProgram) -> list:
    return [k for k in program.kernels if k.attrs.get("row_tiles", 1) > 1]


def test_attention_matmuls_run_in_row_tiles_and_both_executors_agree(gpt, program):
    sm, _ = gpt
    tiled = _tiled(program)
    assert {k.op for k in tiled} >= {"matmul"}
    for k in tiled:  # 8 key positions a lane of 16 columns: 2 groups; 16 / 8 a head dim: 2 ...
        assert row_tiles(k, k.shape[-1]) == k.attrs["row_tiles"] > 1
    fresh = torch.randint(0, 64, (2, 16))
    fast, ref = _agree(program, (fresh,))
    spans = {k.name: k.end - k.start for k in ref.stats.kernels}
    for k in fast.stats.kernels:  # the tiled kernels themselves, not only the whole run
        if k.name in {t.name for t in tiled}:
            assert abs(k.end - k.start - spans[k.name]) <= 0.05 * spans[k.name], k.name
    expected = sm.eval()(fresh)
    assert torch.allclose(fast.outputs, expected, rtol=1e-4, atol=1e-5)
    assert torch.allclose(ref.outputs, expected, rtol=1e-4, atol=1e-5)
    text = print_program(program)  # the mapping is readable, and round-trips
    assert f'"row_tiles": {tiled[0].attrs["row_tiles"]}' in text
    assert parse_program(text).kernel(tiled[0].name).attrs["row_tiles"] == tiled[0].attrs["row_tiles"]


def test_tiles_spread_the_work_and_never_slow_the_program(program):
    untiled = dataclasses.replace(
        program, kernels=[dataclasses.replace(k, attrs=dict(k.attrs)) for k in program.kernels]
    )
    for k in untiled.kernels:
        k.attrs.pop("row_tiles", None)
    with_tiles, without = simulate(program, None), simulate(untiled, None)
    assert with_tiles.cycles <= without.cycles
    for k in _tiled(program):
        a = next(t for t in with_tiles.kernels if t.name == k.name)
        b = next(t for t in without.kernels if t.name == k.name)
        assert int(a.busy.sum()) == int(b.busy.sum()) or a.busy.max() < b.busy.max()
        assert int((a.busy > 0).sum()) > int((b.busy > 0).sum())  # more PEs work
        assert a.end - a.start < b.end - b.start


def test_a_tile_count_that_does_not_fit_is_refused(program, gpt):
    _, ids = gpt
    bad = dataclasses.replace(
        program, kernels=[dataclasses.replace(k, attrs=dict(k.attrs)) for k in program.kernels]
    )
    k = _tiled(bad)[0]
    k.attrs["row_tiles"] = k.region.width + 1
    with pytest.raises(ProgramFormatError, match=f"row_tiles={k.region.width + 1}"):
        sparsefx.run(bad, (ids,))
