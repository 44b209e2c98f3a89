"""Exact keep counts: every path keeps floor((1 - s) * n) entries, evaluated exactly (REFERENCE §1).

In float64, int((1 - 0.9) * 100) is 9 and int((1 - 0.9) * 10) is 0; the rule keeps 10 and 1.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sparsefx
from sparsefx.config.distributions import global_magnitude_masks
from sparsefx.passes.count_flops import mask_nnz
from sparsefx.sparse import GMP, SET, RigL
from sparsefx.sparse.drop_grow import drop_and_grow
from sparsefx.sparse.init import keep_count, make_mask, to_groups
from sparsefx.sparse.retarget import retarget_, retarget_mask

# (numel, sparsity, kept): each one where float64 int((1 - s) * n) is one short
FLOAT_SHORT = [(100, 0.9, 10), (10, 0.9, 1), (266200, 0.9, 26620), (2560, 0.9, 256), (1000, 0.9, 100)]


def _exact(numel: int, sparsity: float) -> int:
    return math.floor((1 - Fraction(str(sparsity))) * numel)


@st.composite
def decimal_levels(draw: st.DrawFn) -> float:
    """A level in [0, 1] with 1 to 4 decimals, as the float that prints as that decimal."""
    digits = draw(st.integers(1, 4))
    k = draw(st.integers(0, 10**digits))
    return float(str(Decimal(k) / Decimal(10**digits)))


# ------------------------------------------------------------------------------------------- the rule


@settings(max_examples=400, deadline=None)
@given(numel=st.integers(0, 10**6), sparsity=decimal_levels())
def test_keep_count_is_the_exact_floor(numel: int, sparsity: float) -> None:
    assert keep_count(numel, sparsity) == _exact(numel, sparsity)
    assert 0 <= keep_count(numel, sparsity) <= numel


@pytest.mark.parametrize(
    ("numel", "sparsity", "kept"), [*FLOAT_SHORT, (10, 0.7, 3), (7, 0.0, 7), (9, 1.0, 0)]
)
def test_keep_count_explicit_cases(numel: int, sparsity: float, kept: int) -> None:
    assert keep_count(numel, sparsity) == kept


def test_keep_count_takes_numpy_torch_and_int_levels() -> None:
    assert keep_count(100, np.float64(0.9)) == 10
    assert keep_count(10, np.float32(0.3)) == 7  # float32 0.3 prints as 0.3 (its float64 value is above)
    assert keep_count(100, torch.tensor(0.9)) == 10
    assert keep_count(100, torch.tensor(0.9, dtype=torch.float64)) == 10
    assert keep_count(10, 0) == 10 and keep_count(10, 1) == 0
    assert keep_count(np.int64(100), 0.9) == 10
    assert keep_count(10, Fraction(1, 3)) == 6


# ---------------------------------------------------------------------------------------- every path


@pytest.mark.parametrize("method", ["random", "topk", "checkerboard"])
@pytest.mark.parametrize(("numel", "sparsity", "kept"), [*FLOAT_SHORT[:2], (10, 0.7, 3)])
def test_make_mask_keeps_the_exact_count(method: str, numel: int, sparsity: float, kept: int) -> None:
    weight = torch.randn(numel // 10, 10)
    assert int(make_mask(weight, sparsity, method, seed=1).sum()) == kept


@pytest.mark.parametrize("groups", [(10, None), (None, 10)], ids=["out groups", "in groups"])
@pytest.mark.parametrize("method", ["random", "topk"])
def test_balanced_masks_keep_the_exact_count_in_every_group(groups: tuple, method: str) -> None:
    out_groups, in_groups = groups
    mask = make_mask(
        torch.randn(10, 10), 0.9, method, seed=2, balance_out_groups=out_groups, balance_in_groups=in_groups
    )
    assert to_groups(mask, out_groups, in_groups).sum(dim=1).tolist() == [1] * 10  # float64: 0 per group


def test_gmp_update_reaches_the_exact_count() -> None:
    layer = nn.Linear(10, 10, bias=False)
    schedule = {"type": "polynomial", "init": 0.0, "final": 0.9, "begin": 0, "end": 3}
    gmp = GMP(sparsity=schedule, update={"freq": 1}, param_filter="weight")
    gmp.apply(layer)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    gmp.apply(opt)
    for _ in range(4):
        opt.zero_grad()
        layer(torch.randn(4, 10)).sum().backward()
        opt.step()
        mask = gmp.masks["weight"]
        assert int(mask.sum()) == keep_count(100, gmp.sparsity_at(gmp.params["weight"], gmp.step))
    assert float(gmp.group.sparsity(gmp.step)) == 0.9 and int(gmp.masks["weight"].sum()) == 10


@pytest.mark.parametrize("algorithm", [SET, RigL])
def test_set_and_rigl_updates_keep_the_exact_count(algorithm: type) -> None:
    layer = nn.Linear(10, 10, bias=False)
    sparsity = algorithm(sparsity=0.9, update={"freq": 1}, drop_fraction=0.3, param_filter="weight")
    sparsity.apply(layer)
    assert int(sparsity.masks["weight"].sum()) == 10
    opt = torch.optim.Adam(layer.parameters(), lr=0.1)
    sparsity.apply(opt)
    for _ in range(3):
        opt.zero_grad()
        layer(torch.randn(4, 10)).sum().backward()
        opt.step()
        assert int(sparsity.masks["weight"].sum()) == 10


# (nnz, drop_fraction): int((1 - df) * nnz) survivors, where the old n_drop = int(df * nnz) kept more
DROPS = [(5, 0.3), (2, 1 / 3), (10, 0.25), (7, 0.5), (10, 0.9), (9, 0.3)]


@pytest.mark.parametrize(("nnz", "drop_fraction"), DROPS)
def test_drop_keeps_the_exact_survivors(nnz: int, drop_fraction: float) -> None:
    """Grow scores of 0 on the old mask rank it last, so the old positions kept are the survivors."""
    gen = torch.Generator().manual_seed(nnz)
    weight = torch.zeros(40)
    weight[:nnz] = torch.rand(nnz, generator=gen) + 1
    mask = weight != 0
    score = torch.where(mask, 0.0, torch.rand(40, generator=gen) + 1)
    new = drop_and_grow(weight, mask, 1 - nnz / 40, drop_fraction, score)
    survivors = keep_count(nnz, drop_fraction)
    assert int(new.sum()) == nnz
    assert int((new & mask).sum()) == survivors
    assert torch.equal(new & mask, weight >= weight[:nnz].sort(descending=True).values[survivors - 1])


@pytest.mark.parametrize("groups", [(4, None), (None, 4)], ids=["out groups", "in groups"])
def test_grouped_drop_keeps_the_exact_survivors(groups: tuple) -> None:
    out_groups, in_groups = groups
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(8, 8, generator=gen)
    mask = make_mask(weight, 0.75, "topk", balance_out_groups=out_groups, balance_in_groups=in_groups)
    weight = weight * mask
    score = torch.where(mask, 0.0, torch.rand(8, 8, generator=gen) + 1)
    new = drop_and_grow(
        weight, mask, 0.75, 0.3, score, balance_out_groups=out_groups, balance_in_groups=in_groups
    )
    rows = to_groups(new, out_groups, in_groups), to_groups(new & mask, out_groups, in_groups)
    assert rows[0].sum(dim=1).tolist() == [keep_count(16, 0.75)] * 4
    assert rows[1].sum(dim=1).tolist() == [keep_count(4, 0.3)] * 4  # int(0.7 * 4) = 2, not 4 - int(0.3 * 4)


def test_global_magnitude_keeps_the_exact_count() -> None:
    weights = {"a": torch.randn(10, 10), "b": torch.randn(10)}
    masks = global_magnitude_masks(weights, 0.9)
    assert sum(int(m.sum()) for m in masks.values()) == 11  # floor(0.1 * 110)
    assert sum(int(m.sum()) for m in global_magnitude_masks({"a": torch.randn(10, 10)}, 0.9).values()) == 10


def test_retarget_keeps_the_exact_count() -> None:
    weight = torch.randn(10, 10)
    full = torch.ones(10, 10, dtype=torch.bool)
    assert int(retarget_mask(weight, full, 0.9, seed=0).sum()) == 10
    sparse = make_mask(weight, 0.95, "topk")
    assert int(retarget_mask(weight, sparse, 0.9, seed=0).sum()) == 10
    sm = sparsefx.compile(nn.Sequential(nn.Linear(10, 10)), 0.5)
    assert retarget_(sm, 0.9) == {"0.weight": (50, 10)}


def test_accounting_counts_the_exact_nnz_on_cpu_and_meta() -> None:
    report = sparsefx.flops(nn.Sequential(nn.Linear(100, 100)), torch.randn(4, 100), config=0.9)
    assert (report.sparse_forward, report.sparse_params) == (2 * 1000 * 4, 1000 + 100)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(100, 100))
    meta = sparsefx.flops(model, torch.randn(4, 100, device="meta"), config=0.9)
    assert (meta.sparse_forward, meta.sparse_params) == (2 * 1000 * 4, 1000 + 100)


def test_meta_nnz_of_a_balanced_decision_counts_every_group() -> None:
    """Ten groups of 10 at 0.75 keep 2 each: 20, where one top-k over all 100 would keep 25."""
    meta = torch.empty(10, 10, dtype=torch.bool, device="meta")
    sm = sparsefx.compile(nn.Sequential(nn.Linear(10, 10)), {"sparsity": 0.75, "balance_out_groups": 10})
    decision = sm.plan["0.weight"]
    assert int(sm.masks["0.weight"].sum()) == mask_nnz(meta, decision) == 10 * keep_count(10, 0.75) == 20
