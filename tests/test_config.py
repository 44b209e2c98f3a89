"""Config parsing and resolution: which parameters are selected, at which level and why; error messages."""

from __future__ import annotations

import pathlib
import re
import textwrap

import pytest
import torch

from sparsefx.config import (
    DEFAULT_SEED,
    INIT_METHODS,
    GroupConfig,
    ParamDecision,
    ParamFilter,
    SparsityConfig,
    SparsityPlan,
    load_config,
    param_seed,
    registry,
)
from sparsefx.config.schedules import Constant, Cosine, Cycling, Polynomial, UpdateSchedule
from sparsefx.errors import ConfigError

SHAPES = {
    "embedding.weight": (10, 4),
    "fc1.weight": (8, 4),
    "fc1.bias": (8,),
    "block.norm.weight": (4, 4),
    "fc2.weight": (4, 8),
    "fc2.bias": (4,),
    "lm_head.weight": (10, 4),
}


def params(device: str = "cpu") -> list[tuple[str, torch.Tensor]]:
    return [(name, torch.empty(shape, device=device)) for name, shape in SHAPES.items()]


def _raises(fragment: str):
    return pytest.raises(ConfigError, match=re.escape(fragment))


def summary(plan: SparsityPlan) -> dict[str, tuple[float, str]]:
    return {d.name: (d.sparsity, d.reason) for d in plan.sparse.values()}


# --- grammar: float ----------------------------------------------------------------------------------------


def test_float_uses_default_filter():
    cfg = load_config(0.5)
    assert cfg.grammar == "float"
    assert cfg.groups == (GroupConfig(path="sparsity", sparsity=Constant(0.5)),)
    plan = cfg.resolve(params())
    assert summary(plan) == {"fc1.weight": (0.5, "default filter"), "fc2.weight": (0.5, "default filter")}
    assert {name: d.reason for name, d in plan.dense.items()} == {
        "embedding.weight": "default exclusion: name contains 'embedding'",
        "fc1.bias": "default exclusion: ndim <= 1",
        "block.norm.weight": "default exclusion: name contains 'norm'",
        "fc2.bias": "default exclusion: ndim <= 1",
        "lm_head.weight": "default exclusion: name contains 'lm_head'",
    }


def test_default_exclusion_is_case_insensitive():
    plan = load_config(0.5).resolve([("LayerNorm.W", torch.empty(3, 3)), ("Embedding.W", torch.empty(3, 3))])
    assert not plan.sparse


def test_int_zero_is_a_level():
    assert load_config(0).groups[0].sparsity == Constant(0.0)


def test_decision_fields():
    d = load_config(0.5).resolve(params())["fc1.weight"]
    assert d == ParamDecision(
        name="fc1.weight",
        shape=(8, 4),
        sparse=True,
        sparsity=0.5,
        group=0,
        algorithm="static",
        init_method="random",
        seed=param_seed(DEFAULT_SEED, "fc1.weight"),
        balance_in_groups=None,
        balance_out_groups=None,
        reason="default filter",
    )
    dense = load_config(0.5).resolve(params())["fc1.bias"]
    assert (dense.sparse, dense.sparsity, dense.group, dense.algorithm, dense.seed) == (
        False,
        0.0,
        None,
        None,
        0,
    )


@pytest.mark.parametrize("value", [1.0, 1.5, -0.1, 1])
def test_float_out_of_range(value):
    with _raises(f"sparsity: {float(value)!r} is not in [0, 1)"):
        load_config(value)


@pytest.mark.parametrize("value", [True, False])
def test_bool_is_not_a_number(value):
    with _raises(f"sparsity: expected a number or a schedule, got {value}"):
        load_config(value)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite(value):
    with _raises("is not finite"):
        load_config(value)


# --- grammar: cerebras.pytorch dicts -----------------------------------------------------------------------


def test_cstorch_glob_filter():
    cfg = load_config({"sparsity": 0.9, "param_filter": "fc*.weight"})
    assert cfg.grammar == "cstorch"
    assert summary(cfg.resolve(params())) == {
        "fc1.weight": (0.9, "matched param_filter 'fc*.weight'"),
        "fc2.weight": (0.9, "matched param_filter 'fc*.weight'"),
    }
    assert cfg.resolve(params())["fc1.bias"].reason == "no pattern matched"


def test_cstorch_glob_list_reason_names_the_glob_that_matched():
    cfg = load_config({"sparsity": 0.7, "param_filter": ["fc1.*", "embedding.weight"]})
    assert summary(cfg.resolve(params())) == {
        "embedding.weight": (0.7, "matched param_filter 'embedding.weight'"),
        "fc1.weight": (0.7, "matched param_filter 'fc1.*'"),
        "fc1.bias": (0.7, "matched param_filter 'fc1.*'"),
    }


def test_explicit_patterns_override_default_exclusion():
    plan = load_config({"sparsity": 0.5, "param_filter": ["lm_head.weight", "*.bias"]}).resolve(params())
    assert set(plan.sparse) == {"lm_head.weight", "fc1.bias", "fc2.bias"}


def test_glob_must_match_whole_name():
    with _raises("sparsity.param_filter: pattern 'fc1' matches no parameter; closest parameter names:"):
        load_config({"sparsity": 0.5, "param_filter": "fc1"}).resolve(params())


def test_callable_filter_and_init_method():
    def big(name: str, param: torch.Tensor) -> bool:
        return param.numel() >= 32

    def init(p, sparsity, score_shaper, device):
        return torch.ones_like(p, dtype=torch.bool)

    cfg = load_config({"sparsity": 0.5, "param_filter": big, "init_method": init})
    plan = cfg.resolve(params())
    assert set(plan.sparse) == {"embedding.weight", "fc1.weight", "fc2.weight", "lm_head.weight"}
    assert (
        plan["fc1.weight"].reason
        == "matched param_filter callable test_callable_filter_and_init_method.<locals>.big"
    )
    assert plan["fc1.weight"].init_method is init


def test_callable_filter_failure_is_config_error():
    cfg = load_config({"sparsity": 0.5, "param_filter": lambda name, p: 1 / 0})
    with _raises("sparsity.param_filter: failed on 'embedding.weight'"):
        cfg.resolve(params())


def test_init_method_and_seed():
    cfg = load_config({"sparsity": 0.5, "init_method": "TopK", "seed": 1234})
    d = cfg.resolve(params())["fc2.weight"]
    assert (d.init_method, d.seed) == ("topk", param_seed(1234, "fc2.weight"))
    assert INIT_METHODS == ("random", "topk", "from_zeros", "checkerboard")


def test_rigl_defaults():
    (group,) = load_config({"algorithm": "RigL", "sparsity": 0.9}).groups
    assert group.algorithm == "rigl"
    assert group.update == UpdateSchedule(freq=100)
    assert group.drop_fraction == Constant(0.3)


def test_set_with_update_and_drop_fraction_schedule():
    (group,) = load_config(
        {
            "algorithm": "set",
            "sparsity": 0.8,
            "update": {"freq": 10, "start": 5, "stop": 100},
            "drop_fraction": {"type": "cosine", "init": 0.3, "half_period": 750},
        }
    ).groups
    assert group.update == UpdateSchedule(freq=10, start=5, stop=100)
    assert group.drop_fraction == Cosine(0.3, 750.0)


def test_gmp_with_polynomial_schedule():
    cfg = load_config(
        {
            "algorithm": "gmp",
            "sparsity": {"type": "polynomial", "init": 0.0, "final": 0.9, "begin": 0, "end": 1000},
            "update": {"steps": [0, 500, 250]},
        }
    )
    (group,) = cfg.groups
    assert group.sparsity == Polynomial(0.0, 0.9, 0, 1000)
    assert group.update == UpdateSchedule(steps=(0, 250, 500))
    assert group.drop_fraction is None
    assert cfg.resolve(params())["fc1.weight"].sparsity == 0.0


def test_gmp_default_update_is_every_step():
    cfg = load_config({"algorithm": "gmp", "sparsity": {"type": "linear", "init": 0.1, "slope": 0.001}})
    assert cfg.groups[0].update == UpdateSchedule(freq=1)


def test_static_with_single_valued_cycling_is_constant():
    assert load_config({"sparsity": [0.4, 0.4]}).groups[0].sparsity == Constant(0.4)


def test_user_registered_algorithm(monkeypatch):
    monkeypatch.setitem(registry._registry, "mydyn", object)
    (group,) = load_config(
        {"algorithm": "MyDyn", "sparsity": [0.5, 0.6], "update": {"freq": 2}, "drop_fraction": 0.1}
    ).groups
    assert (group.algorithm, group.sparsity, group.update) == (
        "mydyn",
        Cycling((0.5, 0.6)),
        UpdateSchedule(freq=2),
    )
    assert group.drop_fraction == Constant(0.1)


def test_type_alias_warns():
    with pytest.warns(FutureWarning, match=re.escape("sparsity.type is deprecated; use 'algorithm'")):
        cfg = load_config({"type": "rigl", "sparsity": 0.5})
    assert cfg.groups[0].algorithm == "rigl"


def test_schedule_alias():
    cfg = load_config(
        {"algorithm": "gmp", "schedule": {"type": "exp", "init": 0.0, "gamma": -0.01, "final": 0.9}}
    )
    assert cfg.groups[0].sparsity(0) == 0.0


def test_balance_groups():
    cfg = load_config({"sparsity": 0.5, "param_filter": "fc*.weight", "balance_out_groups": 4})
    plan = cfg.resolve(params())
    assert plan["fc1.weight"].balance_out_groups == 4
    cfg = load_config({"sparsity": 0.5, "param_filter": "fc1.weight", "balance_in_groups": 2})
    assert cfg.resolve(params())["fc1.weight"].balance_in_groups == 2


def test_balance_must_divide():
    cfg = load_config({"sparsity": 0.5, "param_filter": "fc*.weight", "balance_out_groups": 8})
    with _raises(
        "sparsity.balance_out_groups: 8 does not divide dim 0 of 'fc2.weight' (size 4, shape (4, 8))"
    ):
        cfg.resolve(params())
    cfg = load_config({"sparsity": 0.5, "param_filter": "fc2.weight", "balance_in_groups": 3})
    with _raises("sparsity.balance_in_groups: 3 does not divide dim 1 of 'fc2.weight' (size 8"):
        cfg.resolve(params())


def test_balance_needs_two_dims():
    cfg = load_config({"sparsity": 0.5, "param_filter": "*.bias", "balance_out_groups": 2})
    with _raises("sparsity.balance_out_groups: 'fc1.bias' has shape (8,); balanced groups need ndim >= 2"):
        cfg.resolve(params())


# --- grammar: Model Zoo ------------------------------------------------------------------------------------


def test_modelzoo_section_with_regex():
    cfg = load_config(
        {"sparsity": 0.3, "init_method": "topk", "seed": 1234, "param_name_patterns": "fc.*weight"}
    )
    assert cfg.grammar == "modelzoo"
    plan = cfg.resolve(params())
    assert summary(plan) == {
        "fc1.weight": (0.3, "matched param_name_patterns 'fc.*weight'"),
        "fc2.weight": (0.3, "matched param_name_patterns 'fc.*weight'"),
    }
    assert plan["fc1.weight"].seed == param_seed(1234, "fc1.weight")
    assert plan["fc1.weight"].init_method == "topk"


def test_modelzoo_regex_uses_search():
    plan = load_config({"sparsity": 0.3, "param_name_patterns": "bias"}).resolve(params())
    assert set(plan.sparse) == {"fc1.bias", "fc2.bias"}


def test_modelzoo_pattern_list_first_wins():
    cfg = load_config({"sparsity": 0.3, "param_name_patterns": ["fc1", "weight"]})
    assert [g.path for g in cfg.groups] == [
        "sparsity.param_name_patterns[0]",
        "sparsity.param_name_patterns[1]",
    ]
    plan = cfg.resolve(params())
    assert plan["fc1.weight"].reason == "matched param_name_patterns 'fc1'"
    assert plan["fc1.weight"].group == 0
    assert plan["embedding.weight"].reason == "matched param_name_patterns 'weight'"
    assert plan["fc2.bias"].reason == "no pattern matched"


def test_modelzoo_overrides():
    cfg = load_config(
        {
            "sparsity": 0.3,
            "seed": 1,
            "param_name_patterns": {
                "fc1.*": {"sparsity": 0.5, "init_method": "topk", "seed": 7},
                "fc2.*": None,
            },
        }
    )
    assert [g.path for g in cfg.groups] == [
        "sparsity.param_name_patterns['fc1.*']",
        "sparsity.param_name_patterns['fc2.*']",
    ]
    plan = cfg.resolve(params())
    assert summary(plan) == {
        "fc1.weight": (0.5, "matched param_name_patterns 'fc1.*'"),
        "fc1.bias": (0.5, "matched param_name_patterns 'fc1.*'"),
        "fc2.weight": (0.3, "matched param_name_patterns 'fc2.*'"),
        "fc2.bias": (0.3, "matched param_name_patterns 'fc2.*'"),
    }
    assert (plan["fc1.weight"].init_method, plan["fc1.weight"].seed) == ("topk", param_seed(7, "fc1.weight"))
    assert (plan["fc2.weight"].init_method, plan["fc2.weight"].seed) == (
        "random",
        param_seed(1, "fc2.weight"),
    )


def test_modelzoo_override_supplies_missing_level():
    cfg = load_config({"param_name_patterns": {"fc1.weight": {"sparsity": 0.5}}})
    assert cfg.groups[0].sparsity == Constant(0.5)


PARAMS_FILE = textwrap.dedent(
    """\
    model:
      hidden_size: 16
    optimizer:
      optimizer_type: adamw
    runconfig:
      max_steps: 10
    sparsity:
      type: static
      sparsity: 0.25
      init_method: topk
      seed: 1234
      param_name_patterns: "fc.*weight"
    """
)


def _check_params_file(cfg: SparsityConfig) -> None:
    assert cfg.grammar == "modelzoo"
    plan = cfg.resolve(params())
    assert set(plan.sparse) == {"fc1.weight", "fc2.weight"}
    assert plan["fc2.weight"].sparsity == 0.25
    assert plan["fc2.weight"].seed == param_seed(1234, "fc2.weight")


def test_params_file_yaml_text():
    with pytest.warns(FutureWarning):
        _check_params_file(load_config(PARAMS_FILE))


def test_params_file_on_disk(tmp_path: pathlib.Path):
    path = tmp_path / "params.yaml"
    path.write_text(PARAMS_FILE)
    with pytest.warns(FutureWarning):
        _check_params_file(load_config(path))
    with pytest.warns(FutureWarning):
        _check_params_file(load_config(str(path)))


def test_params_file_sparsity_section_only():
    cfg = load_config({"sparsity": {"sparsity": 0.3}})
    assert cfg.grammar == "modelzoo"
    assert cfg.groups[0].sparsity == Constant(0.3)


def test_cstorch_dict_whose_sparsity_is_a_schedule_is_not_a_params_file():
    cfg = load_config({"sparsity": {"type": "cosine", "init": 0.5, "half_period": 10}, "algorithm": "set"})
    assert cfg.grammar == "cstorch"
    assert cfg.groups[0].sparsity == Cosine(0.5, 10.0)


def test_params_file_without_sparsity_section():
    with _raises("sparsity: no sparsity settings found"):
        load_config({"model": {}, "optimizer": {}})


def test_params_file_empty_section():
    with _raises("sparsity: the params file's sparsity section is empty"):
        load_config("model: {}\nsparsity:\n")


# --- grammar: lists ----------------------------------------------------------------------------------------


def test_list_groups_first_filter_wins():
    cfg = load_config([{"algorithm": "rigl", "sparsity": 0.9, "param_filter": "fc1.*"}, 0.5])
    assert cfg.grammar == "list"
    assert [g.path for g in cfg.groups] == ["sparsity[0]", "sparsity[1]"]
    plan = cfg.resolve(params())
    assert summary(plan) == {
        "fc1.weight": (0.9, "matched param_filter 'fc1.*'"),
        "fc1.bias": (0.9, "matched param_filter 'fc1.*'"),
        "fc2.weight": (0.5, "default filter"),
    }
    assert plan["fc1.weight"].algorithm == "rigl"
    assert plan["fc2.weight"].algorithm == "static"
    assert plan["embedding.weight"].reason == "default exclusion: name contains 'embedding'"


def test_list_reason_when_only_patterns():
    plan = load_config([{"sparsity": 0.5, "param_filter": "fc1.weight"}]).resolve(params())
    assert plan["fc2.weight"].reason == "no pattern matched"


def test_list_yaml():
    cfg = load_config("- {sparsity: 0.9, param_filter: 'fc2.*'}\n- 0.1\n")
    assert [g.sparsity for g in cfg.groups] == [Constant(0.9), Constant(0.1)]


def test_list_errors():
    with _raises("sparsity: an empty list has no groups"):
        load_config([])
    with _raises("sparsity[1]: a group cannot contain a list of groups"):
        load_config([0.5, [0.5]])
    with _raises("sparsity[0]: expected a dict or a number, got 'x'"):
        load_config(["x"])
    with _raises("sparsity[1].sparsity: 1.5 is not in [0, 1)"):
        load_config([0.5, {"sparsity": 1.5}])
    with _raises("sparsity[1]: 2.0 is not in [0, 1)"):
        load_config([0.5, 2.0])


# --- resolution rules --------------------------------------------------------------------------------------


def test_requires_dense_and_caller_forced_dense():
    named = params()
    named[1][1].requires_dense = True  # fc1.weight
    plan = load_config(0.5).resolve(named, dense={"fc2.weight": "tied to the embedding"})
    assert plan["fc1.weight"].reason == "requires_dense"
    assert plan["fc2.weight"].reason == "tied to the embedding"
    assert not plan.sparse


def test_forced_dense_param_still_counts_as_matched():
    cfg = load_config({"sparsity": 0.5, "param_filter": "fc1.weight"})
    assert not cfg.resolve(params(), dense={"fc1.weight": "requires_dense"}).sparse


def test_meta_device():
    plan = load_config(0.5).resolve(params("meta"))
    assert set(plan.sparse) == {"fc1.weight", "fc2.weight"}


def test_named_params_from_a_module():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    plan = load_config(0.5).resolve(model.named_parameters())
    assert set(plan.sparse) == {"0.weight", "2.weight"}


def test_plan_api():
    plan = load_config(0.5).resolve(params())
    assert len(plan) == len(SHAPES)
    assert [d.name for d in plan] == list(SHAPES)
    assert "fc1.weight" in plan and "nope" not in plan
    assert set(plan.sparse) | set(plan.dense) == set(SHAPES)
    with pytest.raises(KeyError):
        plan["nope"]


def test_lambda_level_checked_at_step_0():
    with _raises("sparsity.sparsity: lambda schedule reaches 1.0, which is not in [0, 1)"):
        load_config({"algorithm": "gmp", "sparsity": lambda step: 1.0})


def test_pattern_matching_nothing_lists_closest_names():
    cfg = load_config({"sparsity": 0.5, "param_name_patterns": {"fc3.*": None, "fc1": None}})
    with _raises("sparsity.param_name_patterns['fc3.*']: pattern 'fc3.*' matches no parameter; "):
        cfg.resolve(params())
    with _raises("closest parameter names: 'fc2.bias', 'fc1.bias', 'fc2.weight'"):
        cfg.resolve(params())


def test_pattern_on_empty_model():
    with _raises("matches no parameter; the model has no parameters"):
        load_config({"sparsity": 0.5, "param_filter": "x"}).resolve([])


def test_bad_named_params():
    with _raises("named_params: parameter 'a' is listed twice"):
        load_config(0.5).resolve([("a", torch.empty(2, 2)), ("a", torch.empty(2, 2))])
    with _raises("named_params: expected (name, tensor) pairs"):
        load_config(0.5).resolve([("a",)])


# --- seeds -------------------------------------------------------------------------------------------------


def test_param_seed_literal():
    assert param_seed(1234, "fc.weight") == 3153224863606233390
    assert param_seed(0, "fc.weight") != param_seed(1234, "fc.weight")
    assert 0 <= param_seed(2**70, "x") < 2**63


def test_seed_independent_of_other_params():
    cfg = load_config({"sparsity": 0.5, "seed": 1234})
    alone = cfg.resolve([("fc.weight", torch.empty(3, 3))])["fc.weight"].seed
    crowded = cfg.resolve([("a.weight", torch.empty(3, 3)), ("fc.weight", torch.empty(3, 3))])[
        "fc.weight"
    ].seed
    assert alone == crowded == 3153224863606233390


# --- sources -----------------------------------------------------------------------------------------------


def test_config_passes_through():
    cfg = load_config(0.5)
    assert load_config(cfg) is cfg


def test_yaml_text_float():
    assert load_config("0.5").grammar == "float"


def test_missing_yaml_file():
    with _raises("config file 'nope/sparsity.yaml' not found"):
        load_config("nope/sparsity.yaml")
    with _raises("not found"):
        load_config(pathlib.Path("nope.yml"))


def test_directory_is_not_a_config(tmp_path: pathlib.Path):
    with _raises("is a directory"):
        load_config(str(tmp_path))


def test_yaml_errors():
    with _raises("invalid YAML"):
        load_config("sparsity: [0.5")
    with _raises("sparsity: the config is empty"):
        load_config("")
    with _raises("is a plain string, not a config"):
        load_config("hello")
    with _raises("sparsity: expected a number, a dict"):
        load_config(b"0.5")


def test_frozen():
    cfg = load_config(0.5)
    with pytest.raises(AttributeError):
        cfg.groups[0].algorithm = "gmp"


def test_direct_construction_checks():
    with _raises("a config needs at least one group"):
        SparsityConfig(())
    with _raises("param filter kind 'fnmatch'"):
        ParamFilter("fnmatch")
    with _raises("param filter: invalid regex '(x'"):
        ParamFilter("regex", ("(x",))
    with _raises("param filter: expected a glob string, got 3"):
        ParamFilter("glob", (3,))


# --- error messages ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        (
            {"algorithm": "rigll", "sparsity": 0.5},
            "sparsity.algorithm: unknown algorithm 'rigll'; valid: static, gmp, set, rigl",
        ),
        ({"algorithm": 3, "sparsity": 0.5}, "sparsity.algorithm: unknown algorithm 3; valid: static"),
        (
            {"algorithm": "gmp", "type": "gmp", "sparsity": 0.5},
            "sparsity: give 'algorithm' or its alias 'type', not both",
        ),
        ({"sparsity": 0.5, "schedule": 0.5}, "sparsity: give 'sparsity' or its alias 'schedule', not both"),
        (
            {"sparsity": {"type": "cosin", "init": 0.5}},
            "sparsity.sparsity.type: unknown schedule type 'cosin'; valid: constant, linear",
        ),
        (
            {"sparsity": 0.5, "sparsty": 0.5},
            "sparsity.sparsty: unknown key (did you mean 'sparsity'?); valid keys: algorithm, sparsity",
        ),
        ({"sparsty": 0.5}, "sparsity.sparsty: unknown key"),
        ({"sparsity": 0.5, 3: 1}, "sparsity[3]: keys must be strings"),
        ({}, "sparsity.sparsity: missing required key"),
        ({"algorithm": "static"}, "sparsity.sparsity: missing required key"),
        (
            {"sparsity": 0.5, "init_method": "magnitude"},
            "sparsity.init_method: unknown init method 'magnitude'; "
            "valid: random, topk, from_zeros, checkerboard",
        ),
        (
            {"sparsity": 0.5, "param_filter": "*", "param_name_patterns": "x"},
            "sparsity: give param_filter (globs) or param_name_patterns (regexes), not both",
        ),
        (
            {"sparsity": 0.5, "param_name_patterns": "(fc"},
            "sparsity.param_name_patterns: invalid regex '(fc'",
        ),
        (
            {"sparsity": 0.5, "param_name_patterns": ["fc", 3]},
            "sparsity.param_name_patterns[1]: expected a regex string, got 3",
        ),
        ({"sparsity": 0.5, "param_name_patterns": []}, "sparsity.param_name_patterns: expected a regex"),
        (
            {"sparsity": 0.5, "param_name_patterns": {"fc.*": {"sparsity": 1.5}}},
            "sparsity.param_name_patterns['fc.*'].sparsity: 1.5 is not in [0, 1)",
        ),
        (
            {"sparsity": 0.5, "param_name_patterns": {"fc.*": {"algorithm": "gmp"}}},
            "sparsity.param_name_patterns['fc.*'].algorithm: unknown key; "
            "valid keys: sparsity, init_method, seed",
        ),
        (
            {"sparsity": 0.5, "param_name_patterns": {"fc.*": 0.5}},
            "sparsity.param_name_patterns['fc.*']: expected a dict of overrides",
        ),
        (
            {"sparsity": 0.5, "param_filter": []},
            "sparsity.param_filter: expected a glob, a non-empty list of globs or a callable",
        ),
        (
            {"sparsity": 0.5, "param_filter": ["a", None]},
            "sparsity.param_filter[1]: expected a glob string, got None",
        ),
        ({"sparsity": 1.5}, "sparsity.sparsity: 1.5 is not in [0, 1)"),
        ({"sparsity": -0.5}, "sparsity.sparsity: -0.5 is not in [0, 1)"),
        ({"sparsity": True}, "sparsity.sparsity: expected a number or a schedule, got True"),
        ({"sparsity": float("nan")}, "sparsity.sparsity: nan is not finite"),
        ({"sparsity": "50%"}, "sparsity.sparsity: expected a number, a list, a callable or a schedule dict"),
        (
            {"sparsity": {"type": "linear", "init": 0.1, "slope": 0.01}},
            "sparsity.sparsity: static sparsity needs a constant level, got a linear schedule; "
            "use algorithm: gmp",
        ),
        (
            {"algorithm": "gmp", "sparsity": 0.5},
            "sparsity.sparsity: gmp needs a schedule that changes over training, got constant 0.5; "
            "use static",
        ),
        ({"algorithm": "gmp", "sparsity": [0.5, 0.5]}, "use static"),
        (
            {
                "algorithm": "gmp",
                "sparsity": {"type": "polynomial", "init": 0, "final": 1.0, "begin": 0, "end": 9},
            },
            "sparsity.sparsity: polynomial schedule reaches 1.0, which is not in [0, 1)",
        ),
        (
            {"algorithm": "set", "sparsity": [0.5, 1.2]},
            "sparsity.sparsity: cycling schedule reaches 1.2, which is not in [0, 1)",
        ),
        (
            {"sparsity": 0.5, "update": {"freq": 10}},
            "sparsity.update: static sparsity never updates its mask",
        ),
        (
            {"algorithm": "rigl", "sparsity": 0.5, "update": {"freq": 0}},
            "sparsity.update.freq: 0 must be >= 1",
        ),
        (
            {"algorithm": "rigl", "sparsity": 0.5, "update": {"freq": 10, "steps": [1]}},
            "sparsity.update: steps and freq/start/stop are mutually exclusive",
        ),
        (
            {"algorithm": "rigl", "sparsity": 0.5, "update": {"freq": 10, "stop": 0}},
            "sparsity.update.stop: 0 must be > start (0)",
        ),
        ({"algorithm": "rigl", "sparsity": 0.5, "update": 100}, "sparsity.update: expected a dict"),
        (
            {"algorithm": "rigl", "sparsity": 0.5, "drop_fraction": 1.5},
            "sparsity.drop_fraction: 1.5 is not in [0, 1]",
        ),
        (
            {"algorithm": "gmp", "sparsity": [0.1, 0.2], "drop_fraction": 0.3},
            "sparsity.drop_fraction: only set and rigl drop and regrow",
        ),
        ({"sparsity": 0.5, "drop_fraction": 0.3}, "sparsity.drop_fraction: only set and rigl"),
        ({"sparsity": 0.5, "seed": -1}, "sparsity.seed: expected a non-negative integer, got -1"),
        ({"sparsity": 0.5, "seed": 1.5}, "sparsity.seed: expected a non-negative integer, got 1.5"),
        ({"sparsity": 0.5, "seed": True}, "sparsity.seed: expected a non-negative integer, got True"),
        (
            {"sparsity": 0.5, "balance_in_groups": 2, "balance_out_groups": 2},
            "sparsity: balance_in_groups and balance_out_groups are mutually exclusive",
        ),
        (
            {"sparsity": 0.5, "balance_out_groups": 0},
            "sparsity.balance_out_groups: expected a positive integer, got 0",
        ),
        (
            {"sparsity": 0.5, "balance_in_groups": "2"},
            "sparsity.balance_in_groups: expected a positive integer, got '2'",
        ),
        (None, "sparsity: the config is empty"),
        ({1, 2}, "sparsity: expected a number, a dict, a list of groups"),
    ],
)
def test_error_messages(config, fragment):
    with _raises(fragment):
        load_config(config)


def test_unknown_algorithm_suggests():
    with _raises("did you mean 'rigl'?"):
        load_config({"algorithm": "rigll", "sparsity": 0.5})


def test_errors_are_value_errors_too():
    with pytest.raises(ValueError):
        load_config(2.0)


def test_group_defaults():
    g = GroupConfig(path="sparsity")
    assert (g.algorithm, g.init_method, g.seed, g.update, g.options) == ("static", "random", 0, None, ())


# --- hints for a pattern that matches nothing ----------------------------------------------------------

FFN_NAMES = {
    "wte.weight": (10, 4),
    "blocks.0.attn.qkv.weight": (12, 4),
    "blocks.0.ffn.fc1.weight": (16, 4),
    "blocks.0.ffn.fc2.weight": (4, 16),
    "ln_f.weight": (4,),
    "ln_f.bias": (4,),
}


@pytest.mark.parametrize(
    "config",
    [
        {"sparsity": 0.5, "param_filter": "ffn.*weight"},  # a glob must match the whole name
        {"sparsity": 0.5, "param_name_patterns": "ffn_.*weight"},
        {"sparsity": 0.5, "param_name_patterns": r"blocks\.\d+\.ffn\.fc3"},
    ],
)
def test_closest_names_rank_by_the_pattern_tokens(config: dict) -> None:
    named = [(name, torch.empty(shape)) for name, shape in FFN_NAMES.items()]
    with pytest.raises(ConfigError, match="matches no parameter") as info:
        load_config(config).resolve(named)
    hint = str(info.value).split("closest parameter names: ", 1)[1]
    first, second = hint.split(", ")[:2]
    assert "ffn" in first and "ffn" in second, hint
    assert "ln_f" not in hint.split(", ")[0]


def test_closest_names_mention_a_tied_alias() -> None:
    from sparsefx.sparse.select import resolve_plan, tied_aliases

    model = torch.nn.ModuleDict(
        {"wte": torch.nn.Embedding(10, 4), "lm_head": torch.nn.Linear(4, 10, bias=False)}
    )
    model["lm_head"].weight = model["wte"].weight
    assert tied_aliases(model) == {"lm_head.weight": "wte.weight"}
    with _raises("pattern 'lm_head' matches no parameter; closest parameter names: 'wte.weight' (tied with"):
        resolve_plan(load_config({"sparsity": 0.5, "param_name_patterns": "lm_head"}), model)
    with _raises("'wte.weight' (tied with 'lm_head.weight')"):
        resolve_plan(load_config({"sparsity": 0.5, "param_filter": "wte"}), model)
