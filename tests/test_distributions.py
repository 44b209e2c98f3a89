"""Layer sparsity distributions (uniform, ERK, ER), global magnitude masks, and their config keys."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from torch import nn

import sparsefx
from sparsefx.config import GroupConfig, load_config
from sparsefx.config.distributions import global_magnitude_masks, layer_densities
from sparsefx.errors import ConfigError
from sparsefx.sparse.init import keep_count, make_mask

MLP_SHAPES = {"fc1.weight": (300, 784), "fc2.weight": (100, 300), "fc3.weight": (10, 100)}
NUMEL = {"fc1.weight": 235200, "fc2.weight": 30000, "fc3.weight": 1000}  # 266200 in all
TOTAL = 266200


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 300)
        self.fc2 = nn.Linear(300, 100)
        self.fc3 = nn.Linear(100, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def kept(densities: dict[str, float], numel: dict[str, int]) -> float:
    return math.fsum(densities[name] * numel[name] for name in densities)


def stable_global_topk(weights: dict[str, torch.Tensor], sparsity: float) -> dict[str, torch.Tensor]:
    """The slow reference: one stable descending sort of |w| over every tensor in order."""
    flat = torch.cat(
        [w.detach().float().abs().nan_to_num(nan=0.0, posinf=0.0).reshape(-1) for w in weights.values()]
    )
    k = math.floor((1 - Fraction(str(sparsity))) * flat.numel())
    keep = torch.zeros(flat.numel(), dtype=torch.bool)
    keep[torch.sort(flat, descending=True, stable=True).indices[:k]] = True
    sizes = [w.numel() for w in weights.values()]
    return {name: part.reshape(w.shape) for (name, w), part in zip(weights.items(), keep.split(sizes))}


# ---------------------------------------------------------------------------------------------------------
# layer_densities


def test_erk_one_layer_saturates_by_hand():
    # raw_l = (n_out + n_in) / (n_out * n_in); raw_l * numel_l = n_out + n_in: 1084, 400 and 110
    # budget 0.1 * 266200 = 26620; eps = 26620 / 1594 = 16.70 puts fc3 at 16.70 * 0.11 = 1.84 > 1: dense
    # solve again without fc3: eps = (26620 - 1000) / (1084 + 400) = 17.264
    eps = (26620 - 1000) / (1084 + 400)
    want = {"fc1.weight": 1084 / 235200 * eps, "fc2.weight": 400 / 30000 * eps, "fc3.weight": 1.0}
    got = layer_densities(MLP_SHAPES, 0.9, "erk")
    assert list(got) == list(MLP_SHAPES)
    assert got == pytest.approx(want, rel=1e-12)
    assert (round(got["fc1.weight"], 6), round(got["fc2.weight"], 6)) == (0.079568, 0.230189)
    assert kept(got, NUMEL) == pytest.approx(26620, rel=1e-12)


def test_erk_no_layer_saturates_by_hand():
    eps = 0.01 * TOTAL / (1084 + 400 + 110)  # 2662 / 1594 = 1.670; fc3 gets 0.184 < 1
    want = {
        "fc1.weight": 1084 / 235200 * eps,
        "fc2.weight": 400 / 30000 * eps,
        "fc3.weight": 110 / 1000 * eps,
    }
    got = layer_densities(MLP_SHAPES, 0.99, "erk")
    assert got == pytest.approx(want, rel=1e-12)
    assert all(d < 1 for d in got.values())
    assert kept(got, NUMEL) == pytest.approx(2662, rel=1e-12)


def test_erk_counts_kernel_dims():
    got = layer_densities({"conv": (16, 8, 3, 3), "fc": (10, 64)}, 0.8, "erk")
    eps = 0.2 * (1152 + 640) / (30 + 74)  # raw * numel = sum of dims: 16+8+3+3 and 10+64
    assert got == pytest.approx({"conv": 30 / 1152 * eps, "fc": 74 / 640 * eps}, rel=1e-12)


def test_er_reads_dims_0_and_1_not_the_last_two():
    shapes = {"conv": (16, 8, 3, 3), "fc": (10, 64)}
    # PyTorch layout: conv n_out = 16, n_in = 8 -> raw = 24 / 128; fc raw = 74 / 640
    eps = 0.2 * (1152 + 640) / (24 / 128 * 1152 + 74 / 640 * 640)  # 358.4 / 290
    got = layer_densities(shapes, 0.8, "er")
    assert got == pytest.approx({"conv": 24 / 128 * eps, "fc": 74 / 640 * eps}, rel=1e-12)
    assert got["conv"] == pytest.approx(0.231724, abs=1e-6)
    # TensorFlow's convention would read (kh, kw) = (3, 3): raw 6 / 9, conv density 0.2838
    tf_eps = 358.4 / (6 / 9 * 1152 + 74)
    assert got["conv"] != pytest.approx(6 / 9 * tf_eps, rel=1e-3)


@pytest.mark.parametrize("method", ["uniform", "erk", "er"])
@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.9, 0.99, 0.999])
def test_budget_is_met(method, sparsity):
    shapes = {**MLP_SHAPES, "conv": (32, 16, 5, 5), "tiny": (2, 3)}
    numel = {name: math.prod(shape) for name, shape in shapes.items()}
    got = layer_densities(shapes, sparsity, method)
    assert all(0 < d <= 1 for d in got.values())
    assert kept(got, numel) == pytest.approx((1 - sparsity) * sum(numel.values()), rel=1e-12)
    if sparsity == 0.0:
        assert set(got.values()) == {1.0}


def test_uniform_is_the_level():
    assert layer_densities(MLP_SHAPES, 0.75, "uniform") == dict.fromkeys(MLP_SHAPES, 0.25)


def test_erk_power_zero_is_uniform_and_power_sharpens():
    assert layer_densities(MLP_SHAPES, 0.5, "erk", power=0.0) == pytest.approx(dict.fromkeys(MLP_SHAPES, 0.5))
    flat, sharp = (
        layer_densities(MLP_SHAPES, 0.99, "erk"),
        layer_densities(MLP_SHAPES, 0.99, "erk", power=2.0),
    )
    assert sharp["fc1.weight"] < flat["fc1.weight"]


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((MLP_SHAPES, 0.9, "erkk"), {}, "unknown method 'erkk'; valid: uniform, erk, er"),
        ((MLP_SHAPES, 1.0, "erk"), {}, r"not in \[0, 1\)"),
        ((MLP_SHAPES, -0.1, "er"), {}, r"not in \[0, 1\)"),
        ((MLP_SHAPES, float("nan"), "erk"), {}, r"not in \[0, 1\)"),
        (({}, 0.5, "erk"), {}, "no layers"),
        (({"b": (10,)}, 0.5, "er"), {}, "er needs ndim >= 2"),
        (({"w": (0, 4)}, 0.5, "erk"), {}, "no empty dim"),
        ((MLP_SHAPES, 0.5, "erk"), {"power": float("inf")}, "power must be a finite number"),
        ((MLP_SHAPES, 0.5, "erk"), {"power": 1000.0}, "cannot meet the budget"),  # raw underflows to 0
    ],
)
def test_layer_densities_errors(args, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        layer_densities(*args, **kwargs)


# ---------------------------------------------------------------------------------------------------------
# global_magnitude_masks


def test_global_keeps_largest_overall_with_exact_count():
    weights = {"a": torch.randn(50, 40), "b": torch.randn(30) * 3, "c": torch.randn(7, 9, 3) / 10}
    masks = global_magnitude_masks(weights, 0.7)
    total = sum(w.numel() for w in weights.values())
    assert sum(int(m.sum()) for m in masks.values()) == int(0.3 * total)
    kept_min = min(float(w.abs()[m].min()) for w, m in zip(weights.values(), masks.values()) if m.any())
    dropped_max = max(
        float(w.abs()[~m].max()) for w, m in zip(weights.values(), masks.values()) if (~m).any()
    )
    assert kept_min >= dropped_max
    assert all(masks[n].shape == weights[n].shape and masks[n].dtype == torch.bool for n in weights)
    assert int(masks["b"].sum()) > int(masks["c"].sum())  # the big-magnitude tensor keeps more


def test_global_ties_are_deterministic_by_order():
    many_ties = {"a": torch.randint(0, 4, (3000,)).float(), "b": -torch.randint(0, 4, (50, 40)).float()}
    for sparsity in (0.2, 0.5, 0.6, 0.95):
        got = global_magnitude_masks(many_ties, sparsity)
        want = stable_global_topk(many_ties, sparsity)
        assert all(torch.equal(got[n], want[n]) for n in many_ties)
    masks = global_magnitude_masks({"a": torch.ones(4), "b": -torch.ones(4)}, 0.5)
    assert masks["a"].all() and not masks["b"].any()


def test_global_matches_a_sort_on_a_million_entries():
    weights = {f"w{i}": torch.randn(256, 1024) for i in range(4)}
    weights["zeros"] = torch.zeros(1000)
    got = global_magnitude_masks(weights, 0.9)
    want = stable_global_topk(weights, 0.9)
    assert all(torch.equal(got[n], want[n]) for n in weights)


def test_global_single_tensor_equals_topk_init():
    w = torch.randn(64, 32)
    assert torch.equal(global_magnitude_masks({"w": w}, 0.8)["w"], make_mask(w, 0.8, "topk"))


def test_global_edge_cases():
    w = torch.tensor([float("nan"), float("inf"), 1.0, 0.5])
    assert global_magnitude_masks({"w": w}, 0.5)["w"].tolist() == [False, False, True, True]
    assert global_magnitude_masks({"w": torch.randn(3)}, 0.0)["w"].all()
    assert not global_magnitude_masks({"w": torch.randn(3)}, 0.9)["w"].any()  # int(0.1 * 3) == 0
    meta = global_magnitude_masks({"w": torch.empty(3, 3, device="meta")}, 0.5)["w"]
    assert meta.device.type == "meta" and meta.dtype == torch.bool
    half = global_magnitude_masks({"w": torch.randn(8, 8, dtype=torch.bfloat16)}, 0.5)["w"]
    assert int(half.sum()) == 32
    with pytest.raises(ConfigError, match="at least one weight"):
        global_magnitude_masks({}, 0.5)
    with pytest.raises(ConfigError, match=r"not in \[0, 1\)"):
        global_magnitude_masks({"w": torch.randn(3)}, 1.0)


# ---------------------------------------------------------------------------------------------------------
# Config: the distribution key, pools and overrides


def test_distribution_key_in_both_grammars():
    assert load_config({"sparsity": 0.9, "distribution": "erk"}).groups[0].distribution == "erk"
    assert load_config("sparsity: 0.9\ndistribution: ER").groups[0].distribution == "er"
    section = load_config(
        {"model": {}, "sparsity": {"sparsity": 0.9, "distribution": "erk", "param_name_patterns": "fc"}}
    )
    assert section.grammar == "modelzoo" and section.groups[0].distribution == "erk"
    assert load_config(0.5).groups[0].distribution == GroupConfig(path="x").distribution == "uniform"
    group = load_config({"sparsity": 0.9, "distribution": "global"}).groups[0]
    assert group.init_method == "topk"  # the default under global


def test_erk_plan_levels():
    plan = sparsefx.compiler.resolve_plan(load_config({"sparsity": 0.9, "distribution": "erk"}), MLP())
    densities = layer_densities(MLP_SHAPES, 0.9, "erk")
    for name, density in densities.items():
        assert plan[name].sparsity == pytest.approx(1 - density, abs=1e-15)
        assert (plan[name].distribution, plan[name].pool) == ("erk", "sparsity")
    assert plan["fc3.weight"].sparsity == 0.0
    assert not plan["fc1.bias"].sparse


def test_uniform_plan_is_unchanged():
    d = load_config(0.9).resolve(MLP().named_parameters())["fc1.weight"]
    assert (d.sparsity, d.distribution, d.pool) == (0.9, "uniform", None)


def test_compile_erk_masks_meet_the_budget():
    sm = sparsefx.compile(MLP(), {"sparsity": 0.9, "distribution": "erk"})
    eps = (26620 - 1000) / (1084 + 400)
    want_levels = {
        "fc1.weight": 1 - 1084 / 235200 * eps,
        "fc2.weight": 1 - 400 / 30000 * eps,
        "fc3.weight": 0.0,
    }
    nnz = {name: int(mask.sum()) for name, mask in sm.masks.items()}
    assert set(nnz) == set(MLP_SHAPES)
    for name, level in want_levels.items():
        assert sm.plan[name].sparsity == pytest.approx(level, abs=1e-12)
        assert nnz[name] == keep_count(NUMEL[name], sm.plan[name].sparsity)
    assert nnz == {"fc1.weight": 18714, "fc2.weight": 6905, "fc3.weight": 1000}
    assert 0 <= 26620 - sum(nnz.values()) < len(nnz)  # each layer floors (1 - s_l) * numel


def test_compile_erk_with_a_conv():
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 6 * 6, 10))
    sm = sparsefx.compile(model, {"sparsity": 0.8, "distribution": "erk"}, torch.randn(1, 3, 8, 8))
    levels = layer_densities({"0.weight": (16, 3, 3, 3), "3.weight": (10, 576)}, 0.8, "erk")
    for name, density in levels.items():
        assert int(sm.masks[name].sum()) == keep_count(sm.masks[name].numel(), 1 - density)
    assert abs(sum(int(m.sum()) for m in sm.masks.values()) - 0.2 * (432 + 5760)) < 2


def test_compile_global_is_one_topk_across_layers():
    model = MLP()
    weights = {name: model.get_parameter(name).detach().clone() for name in MLP_SHAPES}
    with torch.no_grad():
        model.fc3.weight.mul_(10)  # the small layer holds the largest weights: it keeps nearly all
        weights["fc3.weight"].mul_(10)
    sm = sparsefx.compile(model, {"sparsity": 0.9, "distribution": "global"})
    d = sm.plan["fc2.weight"]
    assert (d.distribution, d.sparsity, d.init_method, d.pool) == ("global", 0.9, "topk", "sparsity")
    assert (
        sum(int(m.sum()) for m in sm.masks.values()) == keep_count(TOTAL, 0.9) == 26620
    )  # floor((1 - 0.9) * 266200) exactly; float64 int((1 - 0.9) * 266200) gives 26619
    want = stable_global_topk(weights, 0.9)
    assert all(torch.equal(sm.masks[name], want[name]) for name in MLP_SHAPES)
    assert int(sm.masks["fc3.weight"].sum()) > 900


def test_modelzoo_sparsity_override_forms_its_own_pool():
    config = {
        "sparsity": 0.9,
        "distribution": "erk",
        "param_name_patterns": {r"fc3\.weight": {"sparsity": 0.5}, r"fc[12]\.weight": None},
    }
    sm = sparsefx.compile(MLP(), config)
    assert sm.plan["fc3.weight"].sparsity == 0.5  # the explicit level wins, bit for bit
    assert int(sm.masks["fc3.weight"].sum()) == keep_count(1000, 0.5) == 500
    # ERK over fc1 and fc2 only: budget 0.1 * 265200, neither saturates
    eps = 0.1 * 265200 / (1084 + 400)
    assert sm.plan["fc1.weight"].sparsity == pytest.approx(1 - 1084 / 235200 * eps, abs=1e-12)
    assert sm.plan["fc2.weight"].sparsity == pytest.approx(1 - 400 / 30000 * eps, abs=1e-12)
    assert sm.plan["fc1.weight"].pool == sm.plan["fc2.weight"].pool != sm.plan["fc3.weight"].pool


def test_list_groups_each_have_their_own_pool():
    config = [{"sparsity": 0.5, "param_filter": "fc3.weight"}, {"sparsity": 0.9, "distribution": "erk"}]
    plan = sparsefx.compiler.resolve_plan(load_config(config), MLP())
    assert (plan["fc3.weight"].sparsity, plan["fc3.weight"].distribution) == (0.5, "uniform")
    eps = 0.1 * 265200 / (1084 + 400)
    assert plan["fc2.weight"].sparsity == pytest.approx(1 - 400 / 30000 * eps, abs=1e-12)


def test_patterns_without_a_level_share_one_pool():
    by_list = {
        "sparsity": 0.9,
        "distribution": "erk",
        "param_name_patterns": [r"fc1\.weight", r"fc[23]\.weight"],
    }
    by_seed = {
        "sparsity": 0.9,
        "distribution": "erk",
        "param_name_patterns": {r"fc1\.weight": {"seed": 3}, "fc[23].weight": None},
    }
    whole = sparsefx.compiler.resolve_plan(load_config({"sparsity": 0.9, "distribution": "erk"}), MLP())
    for config in (by_list, by_seed):
        plan = sparsefx.compiler.resolve_plan(load_config(config), MLP())
        assert [plan[n].sparsity for n in MLP_SHAPES] == [whole[n].sparsity for n in MLP_SHAPES]


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (
            {"sparsity": 0.9, "distribution": "erkk"},
            "unknown distribution 'erkk'; valid: uniform, erk, er, global",
        ),
        ({"sparsity": 0.9, "distribution": 3}, "unknown distribution"),
        ({"sparsity": 0.9, "distribution": "global", "init_method": "random"}, "needs init_method 'topk'"),
        ({"sparsity": 0.9, "distribution": "global", "balance_out_groups": 2}, "cannot keep balance groups"),
        (
            {
                "sparsity": 0.9,
                "distribution": "global",
                "param_name_patterns": {"fc1": {"init_method": "random"}},
            },
            "needs init_method 'topk'",
        ),
    ],
)
def test_config_errors(config, match):
    with pytest.raises(ConfigError, match=match):
        load_config(config)


def test_er_on_a_bias_is_an_error_naming_the_group():
    with pytest.raises(ConfigError, match=r"sparsity\.distribution: er needs ndim >= 2.*fc1\.bias"):
        load_config({"sparsity": 0.5, "distribution": "er", "param_filter": "*"}).resolve(
            MLP().named_parameters()
        )
