"""Placing a masked weight on a region: the exact per-PE CSC layout, and back to the weight bit for bit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsefx.passes.lower.place_sparse as place_module
from sparsefx.errors import LoweringError, ProgramFormatError
from sparsefx.passes.lower.place_sparse import place_sparse
from sparsefx.runtime.csc import assemble, imbalance, pe_nnz
from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
from sparsefx.runtime.program import PLACEMENTS, Kernel, ProgramData, Region, lane_bounds
from sparsefx.runtime.verify import _check_csc

ROLES = ("out_lo", "out_hi", "in_lo", "in_hi", "nz_ptr", "col_ptr_off", "col_ptr", "row_idx", "values")


def masked(out: int, inp: int, keep: float, seed: int = 0, dtype=torch.float32):
    """A random weight with a random mask keeping about ``keep`` of it; pruned entries are 0."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(out, inp, generator=gen) < keep
    weight = (torch.randn(out, inp, generator=gen) * mask).to(dtype)
    return weight, mask


def _runs(items: list, parts: int) -> list[list]:
    """``parts`` consecutive runs of ``items`` whose sizes differ by at most one (starts at k*n//parts)."""
    n = len(items)
    return [items[k * n // parts : (k + 1) * n // parts] for k in range(parts)]


def reference(weight: torch.Tensor, mask: torch.Tensor, width: int, height: int, placement: str) -> dict:
    """The layout as the mapping describes it, one PE and one nonzero at a time (small shapes only)."""
    out, inp = weight.shape
    b = lane_bounds(inp, height).tolist()
    got: dict[str, list] = {role: [] for role in ROLES}
    got["nz_ptr"], got["col_ptr_off"] = [0], [0]
    by_output = [(i, j) for i in range(out) for j in range(inp) if mask[i, j]]
    columns = [sorted(run, key=lambda ij: (ij[1], ij[0])) for run in _runs(by_output, width)]
    cells = [_runs(column, height) for column in columns]  # cells[c][r]: PE (c, r), by input then output
    for r in range(height):
        if placement == "block":
            lo_in, hi_in = b[r], b[r + 1]
            nonzeros = [(i, j) for i in range(out) for j in range(lo_in, hi_in) if mask[i, j]]
            ranges = [(c * out // width, (c + 1) * out // width) for c in range(width)]
            chunks = [[(i, j) for i, j in nonzeros if lo <= i < hi] for lo, hi in ranges]
            inputs = [(lo_in, hi_in)] * width
        else:
            chunks = [cells[c][r] for c in range(width)]
            ranges = [(min(i for i, _ in ch), max(i for i, _ in ch) + 1) if ch else (0, 0) for ch in chunks]
            inputs = [(min(j for _, j in ch), max(j for _, j in ch) + 1) if ch else (0, 0) for ch in chunks]
        for (lo, hi), (lo_in, hi_in), chunk in zip(ranges, inputs, chunks):
            chunk = sorted(chunk, key=lambda ij: (ij[1], ij[0]))
            got["out_lo"].append(lo)
            got["out_hi"].append(hi)
            got["in_lo"].append(lo_in)
            got["in_hi"].append(hi_in)
            got["col_ptr"] += [sum(1 for _, j in chunk if j < col) for col in range(lo_in, hi_in + 1)]
            got["col_ptr_off"].append(got["col_ptr_off"][-1] + hi_in - lo_in + 1)
            got["row_idx"] += [i - lo for i, _ in chunk]
            got["values"] += [weight[i, j].item() for i, j in chunk]
            got["nz_ptr"].append(got["nz_ptr"][-1] + len(chunk))
    return got


def check_csc(a: dict[str, torch.Tensor], inp: int, width: int, height: int) -> None:
    """The CSC invariants, PE by PE."""
    assert a["out_lo"].dtype == a["out_hi"].dtype == a["col_ptr"].dtype == torch.int32
    assert a["nz_ptr"].dtype == a["col_ptr_off"].dtype == torch.int64
    span = a["out_hi"] - a["out_lo"]
    assert bool((span >= 0).all())
    want_index = torch.int16 if int(span.max()) < 2**15 else torch.int32
    assert a["row_idx"].dtype == want_index
    for p in range(width * height):
        cp = a["col_ptr"][a["col_ptr_off"][p] : a["col_ptr_off"][p + 1]]
        nnz = int(a["nz_ptr"][p + 1] - a["nz_ptr"][p])
        assert 0 <= int(a["in_lo"][p]) <= int(a["in_hi"][p]) <= inp
        assert len(cp) == int(a["in_hi"][p] - a["in_lo"][p]) + 1
        assert int(cp[0]) == 0 and int(cp[-1]) == nnz and bool((cp[1:] >= cp[:-1]).all())
        rows = a["row_idx"][a["nz_ptr"][p] : a["nz_ptr"][p + 1]].to(torch.int64)
        assert bool(((rows >= 0) & (rows < span[p])).all())
        for k in range(len(cp) - 1):
            col = rows[cp[k] : cp[k + 1]]
            assert bool((col[1:] > col[:-1]).all()), f"PE {p} column {k} not strictly increasing"


def check_verify(a: dict[str, torch.Tensor], out: int, inp: int, width: int, height: int) -> None:
    """``runtime.verify``'s own CSC check agrees."""
    p = ProgramData(MeshSpec(width, height), HardwareSpec(), "pipelined", "block")
    k = Kernel("k", "sparse_matmul", Region(0, 0, width, height), (), (1, out), "float32")
    k.arrays = {role: p.add_array(f"k.{role}", a[role]) for role in ROLES}
    k.attrs = {"in_features": inp, "out_features": out}
    _check_csc(p, k)


def check_all(
    weight: torch.Tensor,
    mask: torch.Tensor,
    width: int,
    height: int,
    placement: str,
    drift: int | None = None,
) -> dict:
    out, inp = weight.shape
    a = place_sparse(weight, mask, width, height, placement, drift)
    assert list(a) == list(ROLES)
    assert a["values"].dtype == weight.dtype
    got_w, got_m = assemble(a, inp, out, width, height)
    assert torch.equal(got_m, mask)
    assert torch.equal(got_w, torch.where(mask, weight, torch.zeros((), dtype=weight.dtype)))
    check_csc(a, inp, width, height)
    check_verify(a, out, inp, width, height)
    return a


SHAPES = [(1, 1), (7, 5), (13, 29), (31, 17), (64, 48), (3, 40), (40, 3)]
REGIONS = [(1, 1), (2, 3), (5, 7), (8, 8), (11, 2)]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("keep", [1.0, 0.5, 0.1, 0.01, 0.0])  # sparsity 0, 0.5, 0.9, 0.99, 1
@pytest.mark.parametrize("shape", SHAPES)
def test_reassembles_exactly_and_matches_the_mapping(shape, keep: float, placement: str) -> None:
    weight, mask = masked(*shape, keep, seed=shape[0] * 100 + shape[1])
    for width, height in REGIONS:
        a = check_all(weight, mask, width, height, placement)
        want = reference(weight, mask, width, height, placement)
        for role in ROLES:
            assert a[role].tolist() == want[role], (role, width, height)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_half_and_double_values_keep_their_dtype_and_bits(dtype: torch.dtype, placement: str) -> None:
    weight, mask = masked(37, 23, 0.3, seed=1, dtype=dtype)
    check_all(weight, mask, 4, 5, placement)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_kept_weight_of_zero_is_stored(placement: str) -> None:
    weight, mask = masked(9, 6, 0.5, seed=2)
    i, j = (int(v) for v in mask.nonzero()[0])
    weight[i, j] = 0.0
    a = check_all(weight, mask, 3, 2, placement)
    assert int(a["nz_ptr"][-1]) == int(mask.sum())
    assert torch.equal(assemble(a, 6, 9, 3, 2)[1], mask)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_the_mask_not_the_value_decides(placement: str) -> None:
    weight = torch.randn(12, 10)  # not zeroed off the mask: pruned values are never read
    mask = torch.rand(12, 10) < 0.4
    check_all(weight, mask, 3, 4, placement)


def test_balanced_pes_hold_the_same_nnz_to_within_one() -> None:
    weight, mask = masked(300, 97, 0.2, seed=3)
    mask[:40] = True  # dense top rows: block would pile them onto column 0
    mask[:, :5] = True  # dense first inputs: block would pile them onto row 0
    for width, height in [(7, 5), (16, 16), (1, 3), (64, 2), (3, 200)]:  # 200 rows > 97 inputs
        per_pe = pe_nnz(place_sparse(weight, mask, width, height, "balanced")["nz_ptr"])
        assert int(per_pe.max() - per_pe.min()) <= 1, (width, height)


def test_balanced_neighbours_may_share_a_boundary_row_and_input() -> None:
    weight = torch.arange(1.0, 7.0).view(1, 6)  # one output row, six nonzeros, three columns
    a = check_all(weight, weight != 0, 3, 1, "balanced")
    assert a["out_lo"].tolist() == [0, 0, 0] and a["out_hi"].tolist() == [1, 1, 1]
    assert a["in_lo"].tolist() == [0, 2, 4] and pe_nnz(a["nz_ptr"]).tolist() == [2, 2, 2]
    column = torch.arange(1.0, 7.0).view(6, 1)  # one input, six nonzeros, three region rows
    a = check_all(column, column != 0, 1, 3, "balanced")
    assert a["in_lo"].tolist() == [0, 0, 0] and a["in_hi"].tolist() == [1, 1, 1]
    assert a["out_lo"].tolist() == [0, 2, 4] and pe_nnz(a["nz_ptr"]).tolist() == [2, 2, 2]


def test_empty_pes_get_empty_ranges_at_zero() -> None:
    weight = torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    a = check_all(weight, weight != 0, 4, 1, "balanced")
    # two nonzeros cut four ways (runs start at k * 2 // 4, so columns 0 and 2 are empty), by output
    assert a["out_lo"].tolist() == [0, 0, 0, 1] and a["out_hi"].tolist() == [0, 1, 0, 2]
    assert a["in_lo"].tolist() == [0, 1, 0, 0] and a["in_hi"].tolist() == [0, 2, 0, 1]
    a = check_all(weight, torch.zeros(4, 2, dtype=torch.bool), 3, 2, "balanced")
    assert a["out_lo"].tolist() == a["out_hi"].tolist() == [0] * 6


def test_balanced_keeps_each_output_in_one_column_or_two() -> None:
    """The columns cut the outputs, so an output's partial sums reduce down one column (two at a cut)."""
    weight, mask = masked(200, 90, 0.15, seed=6)
    mask[:30] = True  # skewed rows and inputs: the cuts still fall by count
    mask[:, :4] = True
    width, height = 8, 6
    a = check_all(weight, mask, width, height, "balanced")
    lo = a["out_lo"].view(height, width).to(torch.int64)
    hi = a["out_hi"].view(height, width).to(torch.int64)
    for o in range(200):
        columns = {c for r in range(height) for c in range(width) if lo[r, c] <= o < hi[r, c]}
        assert columns and max(columns) - min(columns) <= 1, (o, columns)


@pytest.mark.parametrize("drift", [0, 1, 4])
def test_balanced_row_cuts_stay_within_drift_of_the_lanes(drift: int) -> None:
    weight, mask = masked(120, 96, 0.15, seed=7)
    mask[:, :6] = True  # dense first inputs: unlimited cuts would pull row 0's range far off its lane
    width, height = 6, 8
    free = check_all(weight, mask, width, height, "balanced")
    a = check_all(weight, mask, width, height, "balanced", drift)
    lanes = lane_bounds(96, height)
    full = pe_nnz(a["nz_ptr"]) > 0
    lo, hi = a["in_lo"].to(torch.int64), a["in_hi"].to(torch.int64)
    row = torch.arange(width * height) // width
    assert bool((lo[full] >= lanes[row][full] - drift).all())
    assert bool((hi[full] <= lanes[row + 1][full] + drift).all())
    assert int((free["in_lo"].to(torch.int64)[full] - lanes[row][full]).abs().max()) > drift  # it did bind
    if drift == 0:  # each row holds exactly its lane's features, like block, with columns cut by count
        block = place_sparse(weight, mask, width, height, "block")
        per_row = pe_nnz(a["nz_ptr"]).view(height, width).sum(1)
        assert torch.equal(per_row, pe_nnz(block["nz_ptr"]).view(height, width).sum(1))


def test_regions_wider_or_taller_than_the_weight() -> None:
    weight, mask = masked(3, 2, 0.7, seed=4)
    for placement in PLACEMENTS:
        a = check_all(weight, mask, 9, 5, placement)  # more columns than outputs, more rows than inputs
        assert len(a["out_lo"]) == 45
        assert len(a["col_ptr"]) == int((a["in_hi"] - a["in_lo"] + 1).sum())
        if placement == "block":  # every row has its lane band (0 or 1 input) + 1 offsets
            assert len(a["col_ptr"]) == 9 * (2 + 5)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_groups_of_rows_give_the_same_arrays(monkeypatch, placement: str) -> None:
    weight, mask = masked(61, 53, 0.3, seed=5)
    whole = place_sparse(weight, mask, 6, 9, placement)
    for entries in (1, 61 * 6, 61 * 20):
        monkeypatch.setattr(place_module, "GROUP_ENTRIES", entries)
        split = place_sparse(weight, mask, 6, 9, placement)
        for role in ROLES:
            assert torch.equal(split[role], whole[role]), (role, entries)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_row_indices_widen_to_int32_for_long_spans(monkeypatch, placement: str) -> None:
    out = 2**15 + 5
    weight = torch.zeros(out, 2)
    weight[0, 0], weight[0, 1], weight[out - 1, 1] = 1.0, 2.0, 3.0
    mask = weight != 0
    monkeypatch.setattr(place_module, "GROUP_ENTRIES", out)  # one group per region row: widened late
    a = check_all(weight, mask, 1, 2, placement)
    assert a["row_idx"].dtype == torch.int32
    assert a["row_idx"].tolist() == [0, 0, out - 1]
    assert place_sparse(weight, mask, 2, 2, placement)["row_idx"].dtype == torch.int16


def test_imbalance_of_a_gpt2_fc_layer() -> None:
    weight, mask = masked(3072, 768, 0.1, seed=0)
    block = imbalance(place_sparse(weight, mask, 64, 64, "block")["nz_ptr"])
    balanced = imbalance(place_sparse(weight, mask, 64, 64, "balanced")["nz_ptr"])
    assert block > 1.25 and balanced < 1.10, (block, balanced)


def test_pe_nnz_and_imbalance() -> None:
    assert pe_nnz(torch.tensor([0, 2, 2, 5])).tolist() == [2, 0, 3]
    assert imbalance(torch.tensor([0, 2, 2, 5])) == pytest.approx(1.8)  # max 3, mean 5 / 3
    assert imbalance(torch.zeros(5, dtype=torch.int64)) == 1.0
    assert imbalance(torch.tensor([0, 4, 8])) == 1.0


@pytest.mark.parametrize(
    ("width", "height", "shape", "match"),
    [
        (0, 2, (4, 4), "width 0"),
        (2, 0, (4, 4), "height 0"),
        (2, -1, (4, 4), "height -1"),
        (2, 2, (4, 5), r"mask of shape \(4, 5\) does not match weight of shape \(4, 4\)"),
    ],
)
def test_bad_regions_and_masks_are_lowering_errors(width, height, shape, match) -> None:
    with pytest.raises(LoweringError, match=match):
        place_sparse(torch.ones(4, 4), torch.ones(shape, dtype=torch.bool), width, height, "block")


def test_other_bad_inputs_are_lowering_errors() -> None:
    w = torch.ones(4, 4)
    with pytest.raises(LoweringError, match="placement 'diagonal'"):
        place_sparse(w, w != 0, 2, 2, "diagonal")
    with pytest.raises(LoweringError, match="torch.bool"):
        place_sparse(w, w, 2, 2, "block")
    with pytest.raises(LoweringError, match="2-D"):
        place_sparse(w.view(-1), w.view(-1) != 0, 2, 2, "block")


def test_assemble_rejects_arrays_that_disagree() -> None:
    a = place_sparse(*masked(8, 8, 0.5), 2, 2, "block")
    with pytest.raises(ProgramFormatError, match="region needs"):
        assemble(a, 8, 8, 3, 2)
    short = dict(a, values=a["values"][:-1])
    with pytest.raises(ProgramFormatError, match="nz_ptr ends"):
        assemble(short, 8, 8, 2, 2)
    shifted = dict(a, col_ptr=a["col_ptr"] + 1)
    with pytest.raises(ProgramFormatError, match="from 0 to each PE's nnz"):
        assemble(shifted, 8, 8, 2, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_weight_on_the_gpu_places_like_on_the_cpu() -> None:
    weight, mask = masked(50, 30, 0.3, seed=6)
    for placement in PLACEMENTS:
        cpu = place_sparse(weight, mask, 4, 3, placement)
        gpu = place_sparse(weight.cuda(), mask.cuda(), 4, 3, placement)
        for role in ROLES:
            assert gpu[role].device.type == "cpu" and torch.equal(gpu[role], cpu[role])


@settings(max_examples=150, deadline=None)
@given(
    out=st.integers(1, 24),
    inp=st.integers(1, 24),
    width=st.integers(1, 9),
    height=st.integers(1, 9),
    keep=st.sampled_from([0.0, 0.05, 0.3, 0.7, 1.0]),
    seed=st.integers(0, 2**16),
    placement=st.sampled_from(PLACEMENTS),
)
def test_property_layout_matches_the_mapping(out, inp, width, height, keep, seed, placement) -> None:
    weight, mask = masked(out, inp, keep, seed)
    a = check_all(weight, mask, width, height, placement)
    want = reference(weight, mask, width, height, placement)
    for role in ROLES:
        assert a[role].tolist() == want[role], role
    if placement == "balanced":
        per_pe = pe_nnz(a["nz_ptr"])
        assert int(per_pe.max() - per_pe.min()) <= 1
