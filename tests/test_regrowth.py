"""SET and RigL regrow among every position not kept after the drop, the just-dropped ones included.

RigL's Algorithm 1 grows outside ``theta`` minus ``I_drop``; Cerebras applies make_mask_grow_maximum to
the mask make_mask_drop_minimum returns. A weight dropped and regrown in the same update was never
pruned: it keeps its value and optimizer state. Positions grown from outside the old mask start at 0.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sparsefx.sparse import SET, RigL
from sparsefx.sparse.drop_grow import drop_and_grow
from sparsefx.sparse.init import keep_count, to_groups

# One group of 8: kept |w| 5, 4, 3, 0.5 at 1, 3, 5, 7. Dropping half drops 3 (at 5) and 0.5 (at 7);
# the dense gradient (GRAD) is largest at 7, the just-dropped one, then at 4, never active.
PATTERN = torch.tensor([0.0, 5.0, 0.0, 4.0, 0.0, 3.0, 0.0, 0.5])
GRAD = torch.tensor([1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 1.0, 9.0])
REGROWN, NEW, PRUNED = 7, 4, 5


def _adam_state(opt: torch.optim.Optimizer, param: nn.Parameter) -> dict[str, torch.Tensor]:
    return {key: opt.state[param][key].clone() for key in ("exp_avg", "exp_avg_sq")}


def _step(layer: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, c: torch.Tensor) -> None:
    """One optimizer step on loss ``sum(layer(x) * c)``: the weight's dense gradient is ``outer(c, x)``."""
    opt.zero_grad()
    (layer(x) * c).sum().backward()
    opt.step()


def _set_weight_and_mask(sparsity, weight: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    """Replace the random initial mask: ``weight`` as given, kept where it is nonzero."""
    sp = sparsity.params["weight"]
    with torch.no_grad():
        sp.param.copy_(weight)
    sp.mask = weight != 0


# ------------------------------------------------------------------------------------- drop_and_grow


def test_drop_and_grow_regrows_a_just_dropped_position() -> None:
    new = drop_and_grow(PATTERN, PATTERN != 0, 0.5, 0.5, GRAD)
    assert new.int().tolist() == [0, 1, 0, 1, 1, 0, 0, 1]  # 7 dropped and regrown, 4 new, 5 pruned


@pytest.mark.parametrize("groups", [(2, None), (None, 2)], ids=["out groups", "in groups"])
def test_grouped_drop_and_grow_regrows_a_just_dropped_position(groups: tuple) -> None:
    out_groups, in_groups = groups
    weight = PATTERN.repeat(2, 1) if out_groups else PATTERN.repeat(2, 1).T.contiguous()
    score = GRAD.repeat(2, 1) if out_groups else GRAD.repeat(2, 1).T.contiguous()
    new = drop_and_grow(
        weight, weight != 0, 0.5, 0.5, score, balance_out_groups=out_groups, balance_in_groups=in_groups
    )
    assert to_groups(new, out_groups, in_groups).int().tolist() == [[0, 1, 0, 1, 1, 0, 0, 1]] * 2


# ---------------------------------------------------------------------------------------------- RigL


@pytest.mark.parametrize("layout", ["flat", "out groups", "in groups"])
def test_rigl_regrows_a_dropped_weight_with_its_value_and_adam_state(layout: str) -> None:
    """Two steps of Adam, then an update whose dense gradient peaks at a just-dropped position."""
    groups: dict[str, int] = {}
    if layout == "in groups":  # weight [8, 2]: each input column is one group of 8
        layer, x, c = nn.Linear(2, 8, bias=False), torch.ones(1, 2), GRAD
        weight, groups = PATTERN.repeat(2, 1).T, {"balance_in_groups": 2}
    else:  # weight [1, 8] or [2, 8]: each output row is one group of 8
        rows = 2 if layout == "out groups" else 1
        layer, x, c = nn.Linear(8, rows, bias=False), GRAD.view(1, 8), torch.ones(rows)
        weight = PATTERN.repeat(rows, 1)
        if layout == "out groups":
            groups = {"balance_out_groups": 2}
    sparsity = RigL(sparsity=0.5, update={"freq": 2}, drop_fraction=0.5, param_filter="weight", **groups)
    sparsity.apply(layer)
    _set_weight_and_mask(sparsity, weight)
    old = sparsity.masks["weight"].clone()
    opt = torch.optim.Adam(layer.parameters(), lr=0.01)
    sparsity.apply(opt)
    sparsity.autoupdate = False  # update by hand, to see the weight and state the update starts from
    _step(layer, opt, x, c)
    sparsity.update()  # step 1: no mask change
    _step(layer, opt, x, c)
    before, state = layer.weight.detach().clone(), _adam_state(opt, layer.weight)
    sparsity.update()  # step 2: drop and grow

    new = sparsity.masks["weight"]
    group_rows = to_groups(new, groups.get("balance_out_groups"), groups.get("balance_in_groups"))
    assert group_rows.int().tolist() == [[0, 1, 0, 1, 1, 0, 0, 1]] * group_rows.shape[0]
    assert group_rows.sum(dim=1).tolist() == [keep_count(8, 0.5)] * group_rows.shape[0]
    regrown = new & old & (weight == 0.5)  # dropped (the smallest) and grown back
    assert int(regrown.sum()) == group_rows.shape[0]
    assert torch.all(before[regrown] != 0)
    assert torch.equal(layer.weight.detach()[regrown], before[regrown])  # kept its value
    after = _adam_state(opt, layer.weight)
    for key in state:
        assert torch.all(state[key][regrown] != 0), key
        assert torch.equal(after[key][regrown], state[key][regrown]), key  # kept its Adam state
    grown = new & ~old  # newly active: weight and state 0
    assert int(grown.sum()) == group_rows.shape[0]
    assert torch.all(layer.weight.detach()[grown] == 0)
    assert all(torch.all(after[key][grown] == 0) for key in after)
    assert torch.all(layer.weight.detach()[~new] == 0)
    assert all(torch.all(after[key][~new] == 0) for key in after)


def test_rigl_keeps_training_a_regrown_weight_from_where_it_was() -> None:
    """The next step moves the regrown weight from its old value, as if the update never dropped it."""
    layer = nn.Linear(8, 1, bias=False)
    sparsity = RigL(sparsity=0.5, update={"freq": 1}, drop_fraction=0.5, param_filter="weight")
    sparsity.apply(layer)
    _set_weight_and_mask(sparsity, PATTERN.view(1, 8))
    opt = torch.optim.SGD(layer.parameters(), lr=0.01, momentum=0.9)
    sparsity.apply(opt)
    _step(layer, opt, GRAD.view(1, 8), torch.ones(1))  # SGD moves 0.5 by -0.01 * 9; the update follows
    assert sparsity.masks["weight"].int().tolist() == [[0, 1, 0, 1, 1, 0, 0, 1]]
    assert layer.weight[0, REGROWN].item() == pytest.approx(0.5 - 0.09)
    assert opt.state[layer.weight]["momentum_buffer"][0, REGROWN].item() == pytest.approx(9.0)
    assert layer.weight[0, NEW].item() == 0.0 and layer.weight[0, PRUNED].item() == 0.0


# ----------------------------------------------------------------------------------------------- SET


def test_set_regrows_among_the_just_dropped_positions_with_their_value_and_state() -> None:
    """8 weights, 6 kept; dropping half leaves 3, and 3 grow among 5 positions: 3 just dropped, 2 not.

    Growing only among the 2 positions inactive before the drop cannot reach 6, so a just-dropped
    one must come back; which ones is the top-3 of the algorithm's seeded random scores.
    """
    layer = nn.Linear(4, 2, bias=False)
    sparsity = SET(sparsity=0.25, update={"freq": 2}, drop_fraction=0.5, param_filter="weight", seed=5)
    sparsity.apply(layer)
    weight = torch.tensor([[0.0, 6.0, 5.0, 4.0], [3.0, 0.0, 2.0, 1.0]])
    _set_weight_and_mask(sparsity, weight)
    old = sparsity.masks["weight"].clone()
    opt = torch.optim.Adam(layer.parameters(), lr=0.01)
    sparsity.apply(opt)
    sparsity.autoupdate = False
    x = torch.ones(1, 4)
    _step(layer, opt, x, torch.ones(2))
    sparsity.update()
    _step(layer, opt, x, torch.ones(2))
    before, state = layer.weight.detach().clone(), _adam_state(opt, layer.weight)
    score = torch.rand(weight.shape, generator=torch.Generator().set_state(sparsity.generator.get_state()))
    sparsity.update()

    new = sparsity.masks["weight"]
    assert int(new.sum()) == keep_count(8, 0.25) == 6
    keep = weight.abs() >= 4.0  # keep_count(6, 0.5) = 3 survivors: 6, 5, 4
    best = torch.where(keep, -1.0, score).reshape(-1).topk(3).indices  # top 3 scores not kept
    want_grown = torch.zeros(8, dtype=torch.bool).index_fill_(0, best, True).view(2, 4)
    assert torch.equal(new, keep | want_grown)
    regrown = new & old & ~keep
    assert int(regrown.sum()) >= 1
    assert torch.equal(layer.weight.detach()[regrown], before[regrown])
    after = _adam_state(opt, layer.weight)
    for key in state:
        assert torch.all(state[key][regrown] != 0), key
        assert torch.equal(after[key][regrown], state[key][regrown]), key
    assert torch.all(layer.weight.detach()[new & ~old] == 0)
    assert all(torch.all(after[key][new & ~old] == 0) for key in after)
