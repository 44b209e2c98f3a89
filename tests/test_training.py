"""A compiled model trains like any nn.Module, and its masks hold through training and checkpoints."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import sparsefx
from conftest import assert_outputs_close
from sparsefx.models import build_model

OPTIMIZERS = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=1.0, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
}


def _task(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 64, generator=gen)
    y = (x[:, :10].argmax(1) + (x[:, 10] > 0).long()) % 10
    return x, y


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_trains_with_stock_optimizers_and_pruned_weights_stay_zero(opt_name: str) -> None:
    model = build_model("mlp").model
    sm = sparsefx.compile(model, 0.9)
    masks = {k: v.clone() for k, v in sm.masks.items()}
    opt = OPTIMIZERS[opt_name](sm.parameters())
    x, y = _task()
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(sm(x), y)
        loss.backward()
        for name, mask in sm.masks.items():
            grad = sm.get_parameter(name).grad
            assert torch.all(grad[~mask] == 0), name  # selected, not multiplied
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    for name, mask in sm.masks.items():
        assert torch.equal(mask, masks[name])
        assert torch.all(sm.get_parameter(name)[~mask] == 0), name


def test_nan_in_pruned_positions_cannot_leak() -> None:
    sm = sparsefx.compile(nn.Sequential(nn.Linear(16, 8)), 0.5)
    weight, mask = sm.get_parameter("0.weight"), sm.masks["0.weight"]
    with torch.no_grad():
        weight[~mask] = float("nan")
    out = sm(torch.randn(4, 16))
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert torch.isfinite(weight.grad).all() and torch.all(weight.grad[~mask] == 0)


def test_parameters_are_shared_with_the_original_model() -> None:
    model = nn.Sequential(nn.Linear(16, 8))
    sm = sparsefx.compile(model, 0.5)
    assert sm.get_parameter("0.weight") is model[0].weight
    assert "0.weight_mask" not in model.state_dict(), "the user's model gains no buffers"


def test_state_dict_round_trip_is_exact(tmp_path: object) -> None:
    spec = build_model("gpt-tiny")
    sm = sparsefx.compile(spec.model, {"sparsity": 0.8, "seed": 1}, spec.args)
    path = tmp_path / "sm.pt"  # type: ignore[operator]
    torch.save(sm.state_dict(), path)
    other = build_model("gpt-tiny", seed=5)
    sm2 = sparsefx.compile(other.model, {"sparsity": 0.8, "seed": 2}, other.args)
    sm2.load_state_dict(torch.load(path, weights_only=True))
    for key, value in sm.state_dict().items():
        assert torch.equal(value, sm2.state_dict()[key]), key
    x = torch.randint(0, 256, (2, 16))
    assert_outputs_close(sm2(x), sm(x), atol=0, rtol=0)


def test_same_seed_same_masks_whatever_ran_before() -> None:
    first = sparsefx.compile(build_model("mlp").model, {"sparsity": 0.7, "seed": 42}).masks
    torch.manual_seed(123)
    torch.rand(1000)
    second = sparsefx.compile(build_model("mlp", seed=9).model, {"sparsity": 0.7, "seed": 42}).masks
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_train_eval_mode_reaches_the_eager_root_of_a_partial_capture() -> None:
    spec = build_model("zoo-data-dependent")
    sm = sparsefx.compile(spec.model, 0.5, spec.args)
    assert sm.capture_method == "partial"
    sm.eval()
    assert not sm._root.training and all(not m.training for m in sm.modules())
    sm.train()
    assert sm._root.training
