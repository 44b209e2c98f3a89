"""Static, GMP, SET, RigL, Group and custom algorithms: exact counts, schedules, resume, invariants."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import sparsefx
from sparsefx.config.registry import unregister_algorithm
from sparsefx.errors import ConfigError
from sparsefx.models import build_model
from sparsefx.sparse import GMP, SET, DynamicSparsityAlgorithm, Group, RigL, Static
from sparsefx.sparse.drop_grow import drop_and_grow
from sparsefx.sparse.init import from_groups, keep_count, to_groups


def _mlp(seed: int = 0) -> nn.Module:
    return build_model("mlp", seed=seed).model


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 64, generator=gen)
    return x, (x[:, :10].argmax(1) + (x[:, 10] > 0).long()) % 10


def _train(model: nn.Module, sparsity, steps: int, opt=None, seed: int = 0, hook=None):  # type: ignore[no-untyped-def]
    opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-2)
    sparsity.apply(opt)
    x, y = _data(seed)
    for step in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if hook:
            hook(step)
    return opt


def test_model_apply_and_compile_give_the_same_masks() -> None:
    """One mask mechanism: seeds come from parameter names, whichever way masks are made."""
    plain = _mlp()
    sparsity = Static(sparsity=0.8, seed=3)
    plain.apply(sparsity)
    sm = sparsefx.compile(_mlp(), {"sparsity": 0.8, "seed": 3})
    assert set(sparsity.masks) == set(sm.masks) == {"net.0.weight", "net.2.weight", "net.4.weight"}
    for name, mask in sm.masks.items():
        assert torch.equal(mask, sparsity.masks[name])
        assert int(mask.sum()) == keep_count(mask.numel(), 0.8)


def test_plain_module_training_keeps_the_invariants() -> None:
    model = _mlp()
    sparsity = Static(sparsity=0.9)
    model.apply(sparsity)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)

    def check(_: int) -> None:
        for name, sp in sparsity.params.items():
            assert torch.all(sp.param[~sp.mask] == 0), name
            assert torch.all(sp.param.grad[~sp.mask] == 0), name
            assert torch.all(opt.state[sp.param]["momentum_buffer"][~sp.mask] == 0), name

    _train(model, sparsity, 10, opt=opt, hook=check)
    assert "net.0.weight_mask" in model.state_dict()


def test_optimizer_state_is_masked_and_requires_dense_state_is_not() -> None:
    model = _mlp()
    sparsity = Static(sparsity=0.5)
    model.apply(sparsity)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _train(model, sparsity, 2, opt=opt)
    sp = sparsity.params["net.0.weight"]
    state = opt.state[sp.param]
    state["exp_avg"].fill_(1.0)
    state["exp_avg_sq"].fill_(1.0)
    state["exp_avg_sq"].requires_dense = True
    sparsity.mask_optimizer_state(opt)
    assert torch.all(state["exp_avg"][~sp.mask] == 0) and torch.all(state["exp_avg"][sp.mask] == 1)
    assert torch.all(state["exp_avg_sq"] == 1)


def test_gmp_follows_the_cubic_schedule_exactly() -> None:
    schedule = {"type": "polynomial", "init": 0.0, "final": 0.9, "begin": 0, "end": 40}
    sparsity = GMP(sparsity=schedule, update={"freq": 10})
    model = _mlp()
    model.apply(sparsity)
    seen = {}

    def record(step: int) -> None:
        if (step + 1) % 10 == 0:
            seen[step + 1] = {n: int(m.sum()) for n, m in sparsity.masks.items()}

    _train(model, sparsity, 50, hook=record)
    for step, counts in seen.items():
        level = sparsity.group.sparsity(step)
        for name, nnz in counts.items():
            assert nnz == keep_count(sparsity.params[name].mask.numel(), level), (step, name)
    assert seen[40]["net.0.weight"] == keep_count(64 * 256, 0.9)


@pytest.mark.parametrize("cls", [SET, RigL])
def test_nnz_is_constant_and_masks_change(cls: type) -> None:
    sparsity = cls(sparsity=0.8, update={"freq": 5}, drop_fraction=0.3)
    model = _mlp()
    model.apply(sparsity)
    before = {n: m.clone() for n, m in sparsity.masks.items()}
    counts = {n: int(m.sum()) for n, m in before.items()}

    def check(_: int) -> None:
        for name, mask in sparsity.masks.items():
            assert int(mask.sum()) == counts[name]
            assert torch.all(sparsity.params[name].param[~mask] == 0)

    _train(model, sparsity, 20, hook=check)
    changed = sum(int((before[n] != m).sum()) for n, m in sparsity.masks.items())
    assert changed > 0


def test_rigl_grows_where_the_dense_gradient_is_largest() -> None:
    layer = nn.Linear(6, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.0, 5.0, 0.0, 4.0, 0.0, 0.1]]))
    sparsity = RigL(sparsity=0.5, update={"freq": 1}, drop_fraction=1 / 3, param_filter="weight")
    sparsity.apply(layer)  # prunes to a random initial mask: set the weights again, then the mask
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.0, 5.0, 0.0, 4.0, 0.0, 0.1]]))
    sparsity.params["weight"].mask = layer.weight != 0
    opt = torch.optim.SGD(layer.parameters(), lr=0.0)
    sparsity.apply(opt)
    x = torch.tensor([[1.0, 0.0, 9.0, 0.0, 2.0, 0.0]])  # dense grad of w_j is x_j
    opt.zero_grad()
    layer(x).sum().backward()
    opt.step()
    assert sparsity.masks["weight"].int().tolist() == [[0, 1, 1, 1, 0, 0]]  # drop 0.1, grow position 2


def test_rigl_sums_dense_gradients_over_micro_batches() -> None:
    sm = sparsefx.compile(_mlp(), {"algorithm": "rigl", "sparsity": 0.9, "update": {"freq": 1}})
    reference = copy.deepcopy(_mlp())
    x, y = _data()
    expected = {}
    for half, target in (
        (x[:32], y[:32]),
        (x[32:], y[32:]),
    ):  # the reference's full gradient, per micro-batch
        ref = copy.deepcopy(reference)
        with torch.no_grad():
            for name, mask in sm.masks.items():
                ref.get_parameter(name).mul_(mask)
        nn.functional.cross_entropy(ref(half), target).backward()
        for name in sm.masks:
            expected[name] = expected.get(name, 0) + ref.get_parameter(name).grad
    for half, target in ((x[:32], y[:32]), (x[32:], y[32:])):
        nn.functional.cross_entropy(sm(half), target).backward()
    for name in sm.masks:
        torch.testing.assert_close(sm.sparsity.dense_grad(name), expected[name])


def _rigl_every_3(compiled: bool) -> tuple[nn.Module, RigL]:
    if compiled:
        sm = sparsefx.compile(_mlp(), {"algorithm": "rigl", "sparsity": 0.9, "update": {"freq": 3}})
        return sm, sm.sparsity
    model, sparsity = _mlp(), RigL(sparsity=0.9, update={"freq": 3})
    model.apply(sparsity)
    return model, sparsity


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "model.apply"])
def test_rigl_captures_dense_gradients_only_for_steps_that_update_masks(compiled: bool) -> None:
    model, sparsity = _rigl_every_3(compiled)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sparsity.apply(opt)
    x, y = _data()
    captured = []
    for _ in range(6):  # updates after steps 3 and 6
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        captured.append([sparsity.dense_grad(name) is not None for name in sparsity.masks])
        opt.step()
    assert [all(c) for c in captured] == [False, False, True, False, False, True]
    assert not any(any(c) for i, c in enumerate(captured) if i not in (2, 5))

    resumed_model, resumed = _rigl_every_3(compiled)
    resumed_model(x)  # binds the lazy model.apply form
    resumed.load_state_dict({**sparsity.state_dict(), "step": 2})  # the next step updates: armed
    nn.functional.cross_entropy(resumed_model(x), y).backward()
    assert all(resumed.dense_grad(name) is not None for name in resumed.masks)


def test_dynamic_algorithm_that_does_not_update_at_step_0_starts_dense() -> None:
    sm = sparsefx.compile(_mlp(), {"algorithm": "set", "sparsity": 0.9, "update": {"freq": 10, "start": 10}})
    assert all(bool(m.all()) for m in sm.masks.values())
    _train(sm, sm.sparsity, 10)
    for mask in sm.masks.values():
        assert int(mask.sum()) == keep_count(mask.numel(), 0.9)


def test_no_mask_change_on_a_step_with_non_finite_gradients() -> None:
    model = _mlp()
    sparsity = SET(sparsity=0.8, update={"freq": 1})
    model.apply(sparsity)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sparsity.apply(opt)
    before = {n: m.clone() for n, m in sparsity.masks.items()}
    x, y = _data()
    nn.functional.cross_entropy(model(x), y).backward()
    model.net[0].weight.grad[0, 0] = float("inf")
    opt.step()
    assert all(torch.equal(before[n], m) for n, m in sparsity.masks.items())


def test_custom_algorithm_is_selectable_by_name() -> None:
    class EveryOther(DynamicSparsityAlgorithm):
        def update_mask(self, p: torch.Tensor, mask: torch.Tensor, sparsity: float) -> torch.Tensor:
            return torch.roll(mask, 1, dims=-1)

    try:
        sm = sparsefx.compile(_mlp(), {"algorithm": "everyother", "sparsity": 0.5, "update": {"freq": 1}})
        assert isinstance(sm.sparsity, EveryOther)
        before = {n: m.clone() for n, m in sm.masks.items()}
        _train(sm, sm.sparsity, 1)
        for name, mask in sm.masks.items():
            assert torch.equal(mask, torch.roll(before[name], 1, dims=-1))
    finally:
        unregister_algorithm("everyother")


def test_group_from_a_list_config_first_match_wins() -> None:
    config = [
        {"algorithm": "static", "sparsity": 0.5, "param_filter": "net.0.*"},
        {"algorithm": "set", "sparsity": 0.9, "param_filter": "net.*.weight"},
    ]
    sm = sparsefx.compile(_mlp(), config)
    assert isinstance(sm.sparsity, Group)
    assert int(sm.masks["net.0.weight"].sum()) == keep_count(64 * 256, 0.5)
    assert int(sm.masks["net.2.weight"].sum()) == keep_count(256 * 256, 0.9)
    _train(sm, sm.sparsity, 3)


def test_group_errors() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        Group({})
    with pytest.raises(ConfigError, match="cannot contain another Group"):
        Group({"a*": Group({"b*": Static(sparsity=0.5)})})


@pytest.mark.parametrize("algorithm", ["set", "rigl", "gmp"])
def test_resume_from_checkpoint_is_bit_identical(algorithm: str, tmp_path: object) -> None:
    config = {"algorithm": algorithm, "sparsity": 0.8, "update": {"freq": 3}}
    if algorithm == "gmp":
        config["sparsity"] = {"type": "polynomial", "init": 0.5, "final": 0.8, "begin": 0, "end": 12}

    def run(steps: int, start: dict | None = None) -> tuple[nn.Module, object, object]:
        sm = sparsefx.compile(_mlp(), config)
        opt = torch.optim.AdamW(sm.parameters(), lr=1e-2)
        if start is not None:
            sm.load_state_dict(start["model"])
            opt.load_state_dict(start["opt"])
            sm.sparsity.load_state_dict(start["sparsity"])
        _train(sm, sm.sparsity, steps, opt=opt)
        return sm, opt, sm.sparsity

    straight, _, _ = run(12)
    half, opt, alg = run(6)
    path = tmp_path / "ckpt.pt"  # type: ignore[operator]
    torch.save({"model": half.state_dict(), "opt": opt.state_dict(), "sparsity": alg.state_dict()}, path)
    resumed, _, _ = run(6, torch.load(path, weights_only=True))
    for key, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_target_sparsity_hooks_report_each_update() -> None:
    sparsity = SET(sparsity=0.8, update={"freq": 2})
    model = _mlp()
    model.apply(sparsity)
    seen: list[tuple[str, float, float, int]] = []
    sparsity.register_target_sparsity_hook(lambda *row: seen.append(row))
    _train(model, sparsity, 4)
    assert {row[3] for row in seen} == {2, 4}
    assert all(abs(row[1] - 0.8) < 1e-9 and abs(row[2] - 0.8) < 1e-3 for row in seen)


def test_model_apply_global_magnitude_is_one_top_k_across_layers() -> None:
    model = _mlp()
    original = {n: p.detach().abs().clone() for n, p in model.named_parameters()}
    sparsity = Static(sparsity=0.9, distribution="global")
    model.apply(sparsity)
    masks = sparsity.masks
    weights = torch.cat([original[n].flatten() for n in masks])
    kept = torch.cat([m.flatten() for m in masks.values()])
    assert int(kept.sum()) == keep_count(weights.numel(), 0.9)
    assert weights[kept].min() >= weights[~kept].max()
    assert len({round(float(m.float().mean()), 3) for m in masks.values()}) > 1, "levels differ per layer"
    compiled = sparsefx.compile(_mlp(), {"sparsity": 0.9, "distribution": "global"}).masks
    assert all(torch.equal(compiled[n], masks[n]) for n in masks)


def test_grad_scaler_skipped_step_changes_no_mask() -> None:
    model = _mlp()
    sparsity = SET(sparsity=0.8, update={"freq": 1})
    model.apply(sparsity)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sparsity.apply(opt)
    scaler = torch.amp.GradScaler("cpu")
    before = {n: m.clone() for n, m in sparsity.masks.items()}
    x, y = _data()
    scaler.scale(nn.functional.cross_entropy(model(x), y)).backward()
    model.net[2].weight.grad[0, 0] = float("inf")
    scaler.step(opt)  # finds the inf, skips optimizer.step(), so no re-prune and no update
    scaler.update()
    assert sparsity.step == 0
    assert all(torch.equal(before[n], m) for n, m in sparsity.masks.items())
    opt.zero_grad()
    scaler.scale(nn.functional.cross_entropy(model(x), y)).backward()
    scaler.step(opt)
    scaler.update()
    assert sparsity.step == 1 and any(not torch.equal(before[n], m) for n, m in sparsity.masks.items())


@pytest.mark.parametrize("groups", [(4, None), (None, 8)], ids=["out groups", "in groups"])
def test_grouped_drop_and_grow_is_the_flat_step_inside_every_group(groups: tuple) -> None:
    gen = torch.Generator().manual_seed(0)
    weight, score = torch.randn(16, 24, generator=gen), torch.rand(16, 24, generator=gen)
    mask = torch.rand(16, 24, generator=gen) < 0.3  # unbalanced: some groups above the level, some below
    out_groups, in_groups = groups
    got = drop_and_grow(
        weight, mask, 0.75, 0.3, score, balance_out_groups=out_groups, balance_in_groups=in_groups
    )
    rows = [to_groups(t, out_groups, in_groups) for t in (weight, mask, score)]
    want = torch.stack([drop_and_grow(w, m, 0.75, 0.3, s) for w, m, s in zip(*rows)])
    assert torch.equal(got, from_groups(want, mask.shape, in_groups))


@pytest.mark.parametrize("algorithm", ["set", "rigl"])
@pytest.mark.parametrize("groups", ["balance_out_groups", "balance_in_groups"])
def test_dynamic_updates_keep_a_balanced_mask_balanced(algorithm: str, groups: str) -> None:
    cfg = {"algorithm": algorithm, "sparsity": 0.75, "update": {"freq": 1}, groups: 2, "init_method": "topk"}
    sm = sparsefx.compile(_mlp(), cfg)
    before = {name: mask.clone() for name, mask in sm.masks.items()}

    def check(step: int) -> None:
        for name, mask in sm.masks.items():
            rows = to_groups(mask, 2, None) if groups == "balance_out_groups" else to_groups(mask, None, 2)
            assert rows.sum(dim=1).tolist() == [keep_count(rows.shape[1], 0.75)] * 2, (name, step)

    check(-1)
    _train(sm, sm.sparsity, 5, hook=check)
    assert any(not torch.equal(before[n], m) for n, m in sm.masks.items()), "no update changed a mask"
