"""Packed sparse weights (``runtime/encoding.py``): exact round trips, the fallback to CSC where packing
is not smaller, the figures the stats report, and programs in either form running alike."""

from __future__ import annotations

import pytest
import torch

import sparsefx
from conftest import as_csc
from sparsefx.errors import ProgramFormatError
from sparsefx.models import build_model
from sparsefx.passes.lower.place_sparse import place_sparse
from sparsefx.runtime import compiled, encoding
from sparsefx.runtime.csc import assemble
from sparsefx.runtime.encoding import (
    CSC_ROLES,
    ESCAPE,
    PACKED_ROLES,
    decode,
    encode,
    is_packed,
)
from sparsefx.runtime.layout import dense_layout, weight_bytes
from sparsefx.runtime.summary import summary

# (out, in, width, height, placement, drift, density)
CASES = [
    (64, 48, 4, 3, "balanced", None, 0.1),
    (64, 48, 4, 3, "block", None, 0.1),
    (300, 200, 7, 5, "balanced", 2, 0.02),
    (768, 96, 16, 8, "balanced", None, 0.1),
    (50, 40, 8, 8, "block", None, 0.5),
    (33, 17, 5, 4, "block", None, 1.0),
    (2000, 4, 1, 1, "block", None, 0.05),  # gaps past 255 slots: escape bytes
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_decode_undoes_encode_exactly(case: tuple) -> None:
    out_f, in_f, width, height, placement, drift, density = case
    weight = torch.randn(out_f, in_f)
    mask = torch.rand(out_f, in_f) < density
    placed = place_sparse(weight, mask, width, height, placement, drift)
    packed = encode(placed)
    assert packed is not None and set(packed) == set(PACKED_ROLES) and packed["index"].dtype == torch.uint8
    back = decode(packed)
    assert set(back) == set(CSC_ROLES)
    for role in CSC_ROLES:
        assert back[role].dtype == placed[role].dtype and torch.equal(back[role], placed[role]), role
    w, m = assemble(packed, in_f, out_f, width, height)
    assert torch.equal(m, mask) and torch.equal(w, weight * mask)
    nbytes = {
        form: sum(t.numel() * t.element_size() for t in arrays.values())
        for form, arrays in (("packed", packed), ("csc", placed))
    }
    assert nbytes["packed"] < nbytes["csc"]


@pytest.mark.skipif(not compiled.available(torch.zeros(1)), reason="numba (the fast extra) is not installed")
@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: "-".join(map(str, c)))
def test_the_compiled_gaps_equal_the_tensor_form(case: tuple) -> None:
    out_f, in_f, width, height, placement, drift, density = case
    placed = place_sparse(
        torch.randn(out_f, in_f), torch.rand(out_f, in_f) < density, width, height, placement, drift
    )
    span = (placed["out_hi"] - placed["out_lo"]).to(torch.int64)
    parts = [placed[r].to(torch.int64) for r in ("nz_ptr", "col_ptr_off", "col_ptr", "row_idx")] + [span]
    assert torch.equal(compiled.gaps(*parts), encoding._gaps(*parts))
    for spoil in (span.max() + 7, -1):  # a row past its PE's span, and one before its start
        rows = parts[3].clone()
        rows[len(rows) // 2] = spoil
        bad = parts[:3] + [rows, span]
        assert compiled.gaps(*bad) is None and encoding._gaps(*bad) is None


def test_long_gaps_take_escape_bytes() -> None:
    """One PE, one input column of 1,000 outputs, nonzeros at rows 3 and 700: gaps 3 and 696 (2 x 255 +
    186)."""
    weight = torch.zeros(1000, 1)
    weight[3, 0], weight[700, 0] = 1.0, 2.0
    placed = place_sparse(weight, weight != 0, 1, 1, "block")
    packed = encode(placed)
    assert packed is not None
    assert packed["index"].tolist() == [3, ESCAPE, ESCAPE, 186]
    assert torch.equal(decode(packed)["row_idx"], placed["row_idx"])


def test_packing_that_is_not_smaller_keeps_csc() -> None:
    """At 99.95% the gaps run to thousands of slots: escapes would cost more than 16-bit rows."""
    weight = torch.randn(4000, 40)
    mask = torch.rand(4000, 40) < 0.0005
    placed = place_sparse(weight, mask, 1, 1, "block")
    assert int(placed["nz_ptr"][-1]) > 0 and encode(placed) is None


def test_bad_packed_arrays_are_refused_by_name() -> None:
    weight = torch.randn(16, 8)
    placed = place_sparse(weight, torch.rand(16, 8) < 0.3, 2, 2, "block")
    packed = encode(placed)
    assert packed is not None
    with pytest.raises(ProgramFormatError, match=r"k: index ends \d+ nonzeros .* last byte is an escape"):
        decode(
            packed | {"index": torch.cat([packed["index"], torch.tensor([ESCAPE], dtype=torch.uint8)])}, "k"
        )
    with pytest.raises(ProgramFormatError, match=r"pe_nnz counts"):
        decode(packed | {"pe_nnz": packed["pe_nnz"] + 1}, "k")
    with pytest.raises(ProgramFormatError, match=r"PE 0's gaps pass its last slot \(4 inputs x 8 outputs\)"):
        decode(
            packed | {"index": torch.cat([torch.tensor([200], dtype=torch.uint8), packed["index"][1:]])}, "k"
        )
    with pytest.raises(ProgramFormatError, match=r"\['pe_nnz'\] missing"):
        decode({r: t for r, t in packed.items() if r != "pe_nnz"}, "k")


def test_the_readme_figure_for_gpt2_small_block_layers() -> None:
    """README: 5.2 bytes per nonzero packed, 8.8 as CSC, for GPT-2 small's four block linear shapes at
    90% on a 64x64 mesh (fp32 values, balanced placement)."""
    packed = csc = nonzeros = 0
    for out_f, in_f in ((2304, 768), (768, 768), (3072, 768), (768, 3072)):
        weight = torch.randn(out_f, in_f)
        placed = place_sparse(weight, torch.rand(out_f, in_f) < 0.1, 64, 64, "balanced")
        stored = encode(placed)
        assert stored is not None
        packed += sum(t.numel() * t.element_size() for t in stored.values())
        csc += sum(t.numel() * t.element_size() for t in placed.values())
        nonzeros += len(placed["values"])
    assert round(packed / nonzeros, 1) == 5.2 and round(csc / nonzeros, 1) == 8.8


@pytest.fixture(scope="module")
def gpt_tiny() -> tuple:
    torch.manual_seed(0)
    spec = build_model("gpt-tiny")
    sm = sparsefx.compile(spec.model, 0.9, spec.args)
    return sm, spec.args, sparsefx.lower(sm, spec.args, mesh=(32, 32), mode="streaming")


def test_a_lowered_program_stores_its_weights_packed_and_reports_bytes_per_nonzero(
    gpt_tiny, tmp_path
) -> None:
    sm, args, program = gpt_tiny
    sparse = [k for k in program.kernels if k.op == "sparse_matmul" and not dense_layout(program, k)]
    assert sparse and all(is_packed(k.arrays) for k in sparse)
    stored = sum(weight_bytes(program, k) for k in sparse)
    nonzeros = sum(len(program.array(k, "values")) for k in sparse)
    result = sparsefx.run(program, args)
    assert result.stats.bytes_per_nonzero == stored / nonzeros
    assert summary(program)["totals"]["bytes_per_nonzero"] == stored / nonzeros  # sparsefx inspect's
    index = sum(len(program.array(k, "index")) for k in sparse)
    assert nonzeros <= index < 1.05 * nonzeros  # a byte a nonzero, escapes rare at 90%
    path = tmp_path / "p.sfxp"
    program.save(str(path))
    loaded = sparsefx.load_program(str(path))
    for k in sparse:  # exact: the packed arrays and what they decode to
        for role in PACKED_ROLES + CSC_ROLES:
            assert torch.equal(loaded.array(loaded.kernel(k.name), role), program.array(k, role)), role
    again = sparsefx.run(loaded, args)
    assert torch.equal(again.outputs, result.outputs) and again.stats.to_json() == result.stats.to_json()


@pytest.fixture(scope="module")
def gpt_short() -> tuple:
    """gpt-tiny on 8 tokens and an 8x8 mesh: small enough for the reference executor."""
    torch.manual_seed(0)
    spec = build_model("gpt-tiny", input_shape=(1, 8))
    sm = sparsefx.compile(spec.model, 0.9, spec.args)
    return sm, spec.args, sparsefx.lower(sm, spec.args, mesh=(8, 8), mode="streaming")


@pytest.mark.parametrize("executor, lowered", [("fast", "gpt_tiny"), ("reference", "gpt_short")])
def test_a_program_in_csc_form_runs_alike_and_streams_more_bytes(
    executor, lowered, request, tmp_path
) -> None:
    """Older files hold CSC: the same outputs and compute, a larger weight load (streaming)."""
    sm, args, program = request.getfixturevalue(lowered)
    path = tmp_path / "p.sfxp"
    program.save(str(path))
    csc = as_csc(sparsefx.load_program(str(path)))
    csc.verify()
    packed_run = sparsefx.run(program, args, executor=executor)
    csc_run = sparsefx.run(csc, args, executor=executor)
    assert torch.equal(packed_run.outputs, csc_run.outputs)
    assert csc_run.stats.weight_bytes > packed_run.stats.weight_bytes
    assert csc_run.stats.bytes_per_nonzero > packed_run.stats.bytes_per_nonzero + 2
    assert csc_run.stats.cycles >= packed_run.stats.cycles
