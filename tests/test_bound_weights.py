"""Bound weights: a compiled model's masked ops use its pruned weights in place.

Whatever happens to a weight (optimizer steps of any kind, in-place writes, loaded optimizer
state, mask updates), the forward must equal the model run with ``where(mask, weight, 0)``, and
whenever ``sparsefx.bound`` claims a weight is clean, its pruned entries must really be +0.0.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

import sparsefx
from sparsefx import bound
from sparsefx.model import SparseModel


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 24), nn.GELU(), nn.Linear(24, 5))


def _compiled(sparsity: float | dict = 0.75) -> tuple[SparseModel, nn.Module]:
    model = _mlp()
    plain = copy.deepcopy(model)  # same weights, never compiled: the reference runs on it
    return sparsefx.compile(model, sparsity), plain


def _reference(sm: SparseModel, plain: nn.Module, x: Tensor) -> Tensor:
    """``plain`` run with sm's current weights, each sparse one as ``where(mask, weight, 0)``."""
    params = {name: p.detach() for name, p in sm.named_parameters()}
    for name, mask in sm.masks.items():
        params[name] = torch.where(mask, params[name], 0.0)
    return functional_call(plain, params, (x,))


def _assert_exact_forward(sm: SparseModel, plain: nn.Module) -> None:
    x = torch.randn(7, 12)
    with torch.no_grad():
        want = _reference(sm, plain, x)
        got = sm(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def _pruned_entries_are_zero(sm: SparseModel) -> bool:
    return all(
        bool((sm.get_parameter(name).detach()[~mask].view(torch.int32) == 0).all())
        for name, mask in sm.masks.items()
    )


def _all_clean(sm: SparseModel) -> bool:
    return all(bound.is_clean(sm.get_parameter(name), mask) for name, mask in sm.masks.items())


def _train(sm: SparseModel, opt: torch.optim.Optimizer, steps: int, *, check: Callable[[], None]) -> None:
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(sm(torch.randn(16, 12)), torch.randn(16, 5)).backward()
        opt.step()
        check()


ELEMENTWISE = [
    (torch.optim.SGD, {"lr": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    (torch.optim.Adam, {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}),
    (torch.optim.AdamW, {"lr": 0.01}),
    (torch.optim.AdamW, {"lr": 0.01, "fused": True}),
    (torch.optim.AdamW, {"lr": 0.01, "foreach": False, "maximize": True}),
    (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.9, "centered": True}),
]


@pytest.mark.parametrize(("cls", "kwargs"), ELEMENTWISE, ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_step_of_an_elementwise_optimizer_keeps_the_weights_clean(cls: type, kwargs: dict) -> None:
    sm, plain = _compiled()
    opt = cls(sm.parameters(), **kwargs)

    def check() -> None:
        assert _all_clean(sm), "the step should be trusted to keep pruned weights at zero"
        assert _pruned_entries_are_zero(sm)
        _assert_exact_forward(sm, plain)

    _train(sm, opt, 5, check=check)


def test_an_optimizer_not_known_to_be_elementwise_is_never_trusted() -> None:
    sm, plain = _compiled()
    opt = torch.optim.Adagrad(sm.parameters(), lr=0.1)

    def check() -> None:
        assert not _all_clean(sm)
        _assert_exact_forward(sm, plain)  # the forward zeroes the weights again
        assert _all_clean(sm) and _pruned_entries_are_zero(sm)

    _train(sm, opt, 3, check=check)


def test_gradient_clipping_keeps_the_chain_of_trust() -> None:
    sm, plain = _compiled()
    opt = torch.optim.AdamW(sm.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(sm(torch.randn(16, 12)), torch.randn(16, 5)).backward()
        torch.nn.utils.clip_grad_norm_(sm.parameters(), 1e-3)  # writes every gradient in place
        opt.step()
        assert _all_clean(sm) and _pruned_entries_are_zero(sm)
    _assert_exact_forward(sm, plain)


def _dirty_optimizer(sm: SparseModel) -> torch.optim.AdamW:
    """An AdamW whose state is nonzero at pruned positions (trained on the dense weights)."""
    dense = copy.deepcopy(sm._modules)  # the same modules, uncompiled and unbound
    params = [p for m in dense.values() for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        x = torch.randn(16, 12)
        for module in dense.values():
            x = module(x)
        x.pow(2).mean().backward()
        opt.step()
    mine = torch.optim.AdamW(sm.parameters(), lr=0.01)
    mine.load_state_dict(opt.state_dict())
    return mine


def test_optimizer_state_loaded_from_elsewhere_is_not_trusted() -> None:
    sm, plain = _compiled()
    opt = _dirty_optimizer(sm)

    def check() -> None:
        assert not _all_clean(sm)
        _assert_exact_forward(sm, plain)

    _train(sm, opt, 3, check=check)


def test_state_masked_by_the_algorithm_regains_trust() -> None:
    sm, plain = _compiled()
    opt = _dirty_optimizer(sm)
    sm.sparsity.apply(opt)  # masks same-shape state before every step

    def check() -> None:
        assert _all_clean(sm) and _pruned_entries_are_zero(sm)
        _assert_exact_forward(sm, plain)

    _train(sm, opt, 3, check=check)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 5.0])
def test_an_in_place_write_at_pruned_positions_is_seen(value: float) -> None:
    sm, plain = _compiled()
    opt = torch.optim.AdamW(sm.parameters(), lr=0.01)
    _train(sm, opt, 2, check=lambda: None)
    w, mask = sm.get_parameter("2.weight"), sm.masks["2.weight"]
    with torch.no_grad():
        w[~mask] = value
    assert not bound.is_clean(w, mask)
    out = sm(torch.randn(4, 12))
    assert torch.isfinite(out).all()
    assert _pruned_entries_are_zero(sm)
    _assert_exact_forward(sm, plain)


def test_load_state_dict_with_dense_weights_is_seen() -> None:
    sm, plain = _compiled()
    state = {k: (torch.randn_like(v) if v.is_floating_point() else v) for k, v in sm.state_dict().items()}
    sm.load_state_dict(state)
    _assert_exact_forward(sm, plain)


def test_a_write_through_data_needs_prune_weights() -> None:
    # ``.data`` writes bypass the version counter (documented); prune_weights restores the invariant.
    sm, plain = _compiled()
    w, mask = sm.get_parameter("0.weight"), sm.masks["0.weight"]
    sm(torch.randn(2, 12))
    w.data[~mask] = 3.0
    sm.sparsity.prune_weights()
    _assert_exact_forward(sm, plain)


def test_a_new_mask_is_seen_without_a_version_bump_of_the_weight() -> None:
    sm, plain = _compiled()
    sm(torch.randn(2, 12))
    name = "2.weight"
    with torch.no_grad():
        sm.get_parameter(name).copy_(torch.randn(24, 24))  # dense values everywhere
    sm.sparsity.params[name].mask = torch.rand(24, 24) > 0.5  # copied into the buffer in place
    _assert_exact_forward(sm, plain)
    assert _pruned_entries_are_zero(sm)


@pytest.mark.parametrize("registered", [False, True])
def test_dynamic_masks_every_step_keep_the_forward_exact(registered: bool) -> None:
    cfg = {"algorithm": "set", "sparsity": 0.75, "update": {"freq": 1}, "drop_fraction": 0.3}
    sm, plain = _compiled(cfg)
    opt = torch.optim.AdamW(sm.parameters(), lr=0.05)
    if registered:
        sm.sparsity.apply(opt)
    before = {n: m.clone() for n, m in sm.masks.items()}
    for _ in range(4):
        opt.zero_grad()
        F.mse_loss(sm(torch.randn(16, 12)), torch.randn(16, 5)).backward()
        opt.step()
        if not registered:
            sm.sparsity.update()
        _assert_exact_forward(sm, plain)
    assert any(not torch.equal(before[n], m) for n, m in sm.masks.items()), "SET never changed a mask"


def test_gradients_are_selected_for_every_way_of_asking() -> None:
    sm, _ = _compiled()
    x = torch.randn(5, 12)
    weights = [sm.get_parameter(n) for n in sm.masks]
    masks = list(sm.masks.values())
    grads = torch.autograd.grad(sm(x).sum(), weights)
    assert all(bool((g[~m] == 0).all()) for g, m in zip(grads, masks))
    grads = torch.autograd.grad(sm(x).pow(2).sum(), weights, create_graph=True)
    sum(g.pow(2).sum() for g in grads).backward()  # double backward
    assert all(bool((w.grad[~m] == 0).all()) for w, m in zip(weights, masks))


def test_two_forwards_then_one_backward_and_checkpointing() -> None:
    sm, plain = _compiled()
    x = torch.randn(5, 12)
    with torch.no_grad():
        sm.get_parameter("0.weight")[~sm.masks["0.weight"]] = 1.0  # dirty: the next forward zeroes it
    (sm(x) + sm(2 * x)).sum().backward()
    ckpt = torch.utils.checkpoint.checkpoint(sm, x, use_reentrant=False)
    ckpt.sum().backward()
    for name, mask in sm.masks.items():
        assert bool((sm.get_parameter(name).grad[~mask] == 0).all())
    _assert_exact_forward(sm, plain)


def test_tensors_that_are_not_the_bound_weights_take_the_autograd_select() -> None:
    sm, plain = _compiled()
    params = {k: v.detach().clone().requires_grad_() for k, v in sm.named_parameters()}
    for name in sm.masks:
        params[name].data.fill_(1.0)  # dense: the op must select, since nothing prunes these
    x = torch.randn(3, 12)
    out = functional_call(sm, params, (x,))
    ref = functional_call(
        plain, {k: torch.where(sm.masks[k], v, 0.0) if k in sm.masks else v for k, v in params.items()}, (x,)
    )
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    for name, mask in sm.masks.items():
        assert bool((params[name].grad[~mask] == 0).all())
        assert bool((params[name] == 1.0).all()), "a tensor the model does not own was written to"


def test_inference_mode_and_export_of_a_compiled_model() -> None:
    sm, plain = _compiled()
    with torch.no_grad():
        sm.get_parameter("4.weight")[~sm.masks["4.weight"]] = 2.0
    x = torch.randn(3, 12)
    with torch.inference_mode():
        out = sm(x)
    torch.testing.assert_close(out, _reference(sm, plain, x))
    exported = torch.export.export(sm, (x,)).module()
    torch.testing.assert_close(exported(x), sm(x))


class _TwoReads(nn.Module):
    """``fc.weight`` is read by a linear and by a sum; ``out.weight`` only by a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(12, 24), nn.Linear(24, 5)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(torch.relu(self.fc(x))) + self.fc.weight.sum()


def test_only_weights_read_by_named_ops_have_their_gradients_selected_in_place() -> None:
    model = _TwoReads()
    plain = copy.deepcopy(model)
    sm = sparsefx.compile(model, 0.75)
    assert sm.weights_with_fresh_grads() == {"out.weight"}
    x = torch.randn(6, 12)
    sm(x).sum().backward()
    params = {n: p.detach().clone().requires_grad_() for n, p in sm.named_parameters()}
    masked = {n: torch.where(sm.masks[n], p, 0.0) if n in sm.masks else p for n, p in params.items()}
    functional_call(plain, masked, (x,)).sum().backward()
    for name, p in sm.named_parameters():
        torch.testing.assert_close(p.grad, params[name].grad, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(sm(x), functional_call(plain, masked, (x,)))


def test_a_gradient_hook_registered_after_ours_cannot_smuggle_values_into_pruned_weights() -> None:
    sm, plain = _compiled()
    for name in sm.masks:
        sm.get_parameter(name).register_hook(lambda g: g + 1.0)  # e.g. noise injection, after the select
    opt = torch.optim.SGD(sm.parameters(), lr=0.1)

    def check() -> None:
        assert _pruned_entries_are_zero(sm)
        _assert_exact_forward(sm, plain)

    _train(sm, opt, 3, check=check)


def test_accumulating_micro_batches_keeps_the_weights_clean() -> None:
    sm, plain = _compiled()
    opt = torch.optim.AdamW(sm.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        for _ in range(3):
            F.mse_loss(sm(torch.randn(8, 12)), torch.randn(8, 5)).backward()
        opt.step()
        assert _all_clean(sm) and _pruned_entries_are_zero(sm)
    _assert_exact_forward(sm, plain)


def test_state_the_algorithm_leaves_dense_is_not_trusted() -> None:
    sm, plain = _compiled()
    opt = _dirty_optimizer(sm)
    for state in opt.state.values():
        state["exp_avg"].requires_dense = True  # the algorithm must not mask it
    sm.sparsity.apply(opt)

    def check() -> None:  # right after the step, before a forward could zero anything
        assert _pruned_entries_are_zero(sm), "the step moved pruned weights: it must not be trusted"
        _assert_exact_forward(sm, plain)

    _train(sm, opt, 3, check=check)


def _backward(sm: SparseModel, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    F.mse_loss(sm(torch.randn(16, 12)), torch.randn(16, 5)).backward()


@pytest.mark.parametrize("how", ["in place", "assigned", "accumulated by hand"])
def test_a_gradient_changed_between_backward_and_step_is_selected_again(how: str) -> None:
    sm, plain = _compiled()
    opt = torch.optim.AdamW(sm.parameters(), lr=0.1)
    for _ in range(2):
        _backward(sm, opt)
        for name in sm.masks:
            w = sm.get_parameter(name)
            if how == "in place":
                w.grad.add_(1.0)
            elif how == "assigned":
                w.grad = torch.ones_like(w)
            else:
                w.grad = w.grad + torch.randn_like(w)
        opt.step()
        assert _pruned_entries_are_zero(sm), f"a gradient {how} moved pruned weights"
        assert _all_clean(sm)
    _assert_exact_forward(sm, plain)


def test_a_mask_changed_between_backward_and_step_is_seen() -> None:
    sm, plain = _compiled()
    opt = torch.optim.SGD(sm.parameters(), lr=0.5)
    _backward(sm, opt)
    mask = sm.masks["2.weight"]
    kept = mask.nonzero()[:5]
    mask[kept[:, 0], kept[:, 1]] = False  # prune five more entries, in place, after the backward
    opt.step()
    assert _pruned_entries_are_zero(sm)
    _assert_exact_forward(sm, plain)


def test_a_trusted_step_makes_no_pass_over_weights_or_state(monkeypatch: pytest.MonkeyPatch) -> None:
    sm, plain = _compiled()
    opt = torch.optim.AdamW(sm.parameters(), lr=0.01)
    sm.sparsity.apply(opt)
    _train(sm, opt, 2, check=lambda: None)  # the first step creates the state; the second records it
    passes: list[int] = []
    for module in (sparsefx.bits, sparsefx.bound, sparsefx.step_trust, sparsefx.sparse.base):
        real = module.prune_
        monkeypatch.setattr(module, "prune_", lambda t, m, real=real: passes.append(t.numel()) or real(t, m))

    def check() -> None:
        assert passes == [], f"a trusted step pruned or masked {len(passes)} tensors"
        assert _all_clean(sm) and _pruned_entries_are_zero(sm)
        _assert_exact_forward(sm, plain)

    _train(sm, opt, 3, check=check)


def test_a_dtype_change_after_training_selects_with_the_right_width() -> None:
    sm, plain = _compiled()
    opt = torch.optim.AdamW(sm.parameters(), lr=0.01)
    _train(sm, opt, 2, check=lambda: None)
    sm.double()
    plain.double()
    opt = torch.optim.AdamW(sm.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(
            sm(torch.randn(16, 12, dtype=torch.float64)), torch.randn(16, 5, dtype=torch.float64)
        ).backward()
        for name, mask in sm.masks.items():
            grad = sm.get_parameter(name).grad
            assert grad.dtype == torch.float64 and bool((grad[~mask] == 0).all())
        opt.step()
        assert _all_clean(sm) and _pruned_entries_are_zero(sm)
    x = torch.randn(7, 12, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(sm(x), _reference(sm, plain, x))
