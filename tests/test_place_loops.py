"""The compiled balanced placement (``passes/lower/place_loops.py``) gives the tensor form's arrays, bit
for bit."""

from __future__ import annotations

import pytest
import torch

from sparsefx.passes.lower import place_balanced as pb
from sparsefx.passes.lower import place_loops
from sparsefx.runtime.layout import _balanced_ones, row_cuts

pytest.importorskip("numba")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for role in a:
        assert a[role].dtype == b[role].dtype, role
        assert torch.equal(a[role], b[role]), role


@pytest.mark.parametrize("seed", range(30))
def test_random_masks_place_as_the_tensor_form(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    out, inp = (int(torch.randint(1, 90, (1,), generator=g)) for _ in range(2))
    width, height = (int(torch.randint(1, 20, (1,), generator=g)) for _ in range(2))
    keep = [0.0, 0.01, 0.1, 0.5, 1.0][seed % 5]
    mask = torch.rand(out, inp, generator=g) < keep
    if seed % 7 == 3:  # empty rows and columns, and a single nonzero
        mask[:, : inp // 2] = False
        mask[out // 3 :] = False
    if seed % 11 == 4:
        mask = torch.zeros(out, inp, dtype=torch.bool)
        mask[out // 2, inp // 2] = True
    dtype = [torch.float32, torch.float16, torch.bfloat16, torch.float64][seed % 4]
    weight = torch.randn(out, inp, generator=g).to(dtype)
    drift = [None, 0, 3, 16][seed % 4]
    got = place_loops.place(weight, mask, width, height, drift)
    assert got is not None
    _same(got, pb._tensor_form(weight, mask, width, height, drift))


def test_long_spans_and_a_non_contiguous_weight() -> None:
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(70000, 6, generator=g) < 0.9  # one PE spans past 2**15 outputs: int32 row indices
    weight = torch.randn(6, 70000, generator=g).t()
    got = place_loops.place(weight, mask, 1, 2, None)
    assert got is not None and got["row_idx"].dtype == torch.int32
    _same(got, pb._tensor_form(weight, mask, 1, 2, None))


def test_the_tensor_form_answers_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARSEFX_NUMBA", "0")
    w = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    assert place_loops.place(w, w != 0, 1, 1) is None
    assert pb.place_balanced(w, w != 0, 1, 1)["values"].tolist() == [1.0, 3.0, 2.0]


@pytest.mark.parametrize("drift", [0, 1, 5, 40])
def test_row_cuts_with_a_limit_match_the_tensor_form(drift: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(drift)
    width, in_f, height = 13, 50, 9
    counts = torch.randint(0, 6, (width, in_f), generator=g) * (torch.rand(width, in_f, generator=g) > 0.3)
    ptr = torch.zeros((width, in_f + 1), dtype=torch.int64)
    torch.cumsum(counts, 1, out=ptr[:, 1:])
    got = row_cuts(ptr, ptr[:, -1], in_f, height, drift)
    with monkeypatch.context() as m:
        m.setenv("SPARSEFX_NUMBA", "0")
        want = row_cuts(ptr, ptr[:, -1], in_f, height, drift)
    assert torch.equal(got, want)


@pytest.mark.parametrize("seed", range(12))
def test_balanced_ones_compiled_match_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(seed)
    in_f, out_f, width, height = (int(torch.randint(1, n, (1,), generator=g)) for n in (60, 90, 30, 25))
    drift = [None, 0, 2, 16][seed % 4]
    got = _balanced_ones(in_f, out_f, width, height, drift)
    with monkeypatch.context() as m:
        m.setenv("SPARSEFX_NUMBA", "0")
        want = _balanced_ones(in_f, out_f, width, height, drift)
    for field in ("in_lo", "in_hi", "out_lo", "span", "counts"):
        a, b = getattr(got, field), getattr(want, field)
        assert a.dtype == b.dtype and torch.equal(a, b), field


@pytest.mark.parametrize(("mesh", "mode"), [("16x16", "streaming"), ("64x8", "pipelined")])
def test_a_model_lowers_to_the_same_program_with_and_without_the_loops(
    mesh: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled placement, geometry, route expansion and checks change how long lowering takes,
    never what it makes: gpt-tiny at 90% lowers to the same program text and arrays either way."""
    import sparsefx
    from sparsefx.models import build_model

    spec = build_model("gpt-tiny")
    sm = sparsefx.compile(spec.model, {"sparsity": 0.9}, spec.args)
    programs = []
    for flag in ("1", "0"):
        monkeypatch.setenv("SPARSEFX_NUMBA", flag)
        programs.append(sparsefx.lower(sm, spec.args, mesh=mesh, mode=mode, placement="balanced"))
    a, b = programs
    assert str(a) == str(b)
    assert sorted(a.arrays) == sorted(b.arrays)
    for name, array in a.arrays.items():
        assert array.dtype == b.arrays[name].dtype and torch.equal(array, b.arrays[name]), name


@pytest.mark.parametrize(
    ("out", "inp", "width", "height", "drift"), [(7, 5, 3, 4, None), (50, 9, 8, 3, 0), (3, 40, 9, 6, 2)]
)
def test_an_all_ones_mask_places_from_its_runs_as_the_tensor_form(out, inp, width, height, drift) -> None:
    """A kept-dense weight (every entry kept) is laid out from its runs without a scan of the mask."""
    weight = torch.randn(out, inp)
    mask = torch.ones(out, inp, dtype=torch.bool)
    got = place_loops.place(weight, mask, width, height, drift)
    assert got is not None
    _same(got, pb._tensor_form(weight, mask, width, height, drift))
