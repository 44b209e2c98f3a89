"""A checkpoint or state dict at another sparsity level is re-levelled to the config, with a message."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import sparsefx
from sparsefx.checkpoint import load_checkpoint, save_checkpoint
from sparsefx.config.counts import keep_count


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 20), nn.ReLU(), nn.Linear(20, 10))


def trained(level: float) -> tuple[sparsefx.SparseModel, torch.optim.Optimizer]:
    sm = sparsefx.compile(net(), level)
    opt = torch.optim.Adam(sm.parameters(), lr=1e-2)
    sm.sparsity.apply(opt)
    for _ in range(2):
        sm(torch.randn(4, 20)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return sm, opt


@pytest.mark.parametrize(("saved", "wanted"), [(0.5, 0.9), (0.9, 0.5)])
def test_checkpoint_at_another_level_is_relevelled(
    saved: float, wanted: float, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old, old_opt = trained(saved)
    save_checkpoint(tmp_path / "ckpt.pt", old, old_opt)
    sm = sparsefx.compile(net(), wanted)
    opt = torch.optim.Adam(sm.parameters(), lr=1e-2)
    sm(torch.randn(2, 20)).sum().backward()
    opt.step()  # creates state, so the optimizer checkpoint fits
    with caplog.at_level(logging.WARNING, logger="sparsefx"):
        load_checkpoint(tmp_path / "ckpt.pt", sm, opt)
    messages = [r.getMessage() for r in caplog.records if "another level" in r.getMessage()]
    assert len(messages) == 1 and f"re-levelled to {100 * wanted:.1f}%" in messages[0], messages
    for name, mask in sm.masks.items():
        before = old.masks[name]
        assert int(mask.sum()) == keep_count(mask.numel(), wanted)
        weight = sm.get_parameter(name)
        assert bool((weight[~mask] == 0).all())
        state = opt.state[weight]
        assert bool((state["exp_avg"][~mask] == 0).all()) and bool((state["exp_avg_sq"][~mask] == 0).all())
        if wanted > saved:
            assert bool((mask <= before).all()), "raising the level keeps pruned positions pruned"
            kept = weight.detach().abs()[mask]
            dropped = old.get_parameter(name).detach().abs()[before & ~mask]
            assert float(kept.min()) >= float(dropped.max()), "the smallest |w| are pruned"
        else:
            assert bool((mask >= before).all()), "lowering the level keeps every kept position"
            assert bool((weight[mask & ~before] == 0).all()), "regrown weights start at 0"


def test_state_dict_at_the_same_level_loads_silently(caplog: pytest.LogCaptureFixture) -> None:
    old, _ = trained(0.7)
    sm = sparsefx.compile(net(), 0.7)
    with caplog.at_level(logging.WARNING, logger="sparsefx"):
        sm.load_state_dict(old.state_dict())
    assert not caplog.records
    for name, mask in sm.masks.items():
        assert torch.equal(mask, old.masks[name])


def test_dynamic_algorithms_keep_the_masks_they_load() -> None:
    old, _ = trained(0.5)
    sm = sparsefx.compile(net(), {"algorithm": "set", "sparsity": 0.9, "update": {"freq": 10}})
    sm.load_state_dict(old.state_dict())
    for name, mask in sm.masks.items():
        assert torch.equal(mask, old.masks[name])
