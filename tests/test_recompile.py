"""Compiling a model twice, or a SparseModel again, warns and says what is shared."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

import sparsefx
from sparsefx.config.counts import keep_count


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def masked_grads(model: nn.Module, masks: dict, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradients of the masked reference, selected by ``masks``."""
    params = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
    weights = {n: params[n] * masks[n] if n in masks else params[n] for n in params}
    functional_call(model, weights, (x,)).sum().backward()
    return {n: torch.where(masks[n], params[n].grad, 0.0) for n in masks}


def test_compiling_the_same_model_twice_warns_and_the_newest_owns_the_gradients() -> None:
    model = net()
    first = sparsefx.compile(model, 0.5)
    with pytest.warns(UserWarning, match=r"compiled \(or given to a sparsity algorithm\) before.*deepcopy"):
        second = sparsefx.compile(model, {"sparsity": 0.75, "seed": 123})  # a pattern not nested in the first
    assert not all(bool((second.masks[n] <= first.masks[n]).all()) for n in first.masks)
    x = torch.randn(5, 16)
    second(x).sum().backward()
    want = masked_grads(net_like(model), second.masks, x)
    for name, grad in want.items():
        torch.testing.assert_close(second.get_parameter(name).grad, grad)


def net_like(model: nn.Module) -> nn.Module:
    clone = net()
    clone.load_state_dict(model.state_dict())
    return clone


def test_compiling_a_sparse_model_again_warns_and_uses_the_new_config() -> None:
    model = net()
    keys = set(model.state_dict())
    first = sparsefx.compile(model, 0.5)
    with pytest.warns(UserWarning, match="already a compiled SparseModel"):
        again = sparsefx.compile(first, 0.9)
    assert set(again.state_dict()) == keys | {"0.weight_mask", "2.weight_mask"}
    for name, mask in again.masks.items():
        assert int(mask.sum()) == keep_count(mask.numel(), 0.9)
        assert again.get_parameter(name) is first.get_parameter(name)
    assert int(first.masks["0.weight"].sum()) == keep_count(256, 0.5), "the first model keeps its masks"


def test_a_fresh_model_compiles_without_a_warning(recwarn: pytest.WarningsRecorder) -> None:
    sparsefx.compile(net(), 0.5)
    assert not [w for w in recwarn if "sparsefx" in str(w.message)]


def test_accounting_leaves_the_model_alone(recwarn: pytest.WarningsRecorder) -> None:
    model = net()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(2):
        report = sparsefx.flops(model, torch.randn(2, 16), config=0.75)
    assert report.sparse_params < report.dense_params
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]), f"flops changed {name}"
    assert not [w for w in recwarn if "sparsefx" in str(w.message)]
