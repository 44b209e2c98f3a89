"""Fuzzing load_config and resolve: any input either loads or raises ConfigError, never anything else."""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsefx.config import GROUP_KEYS, SparsityConfig, load_config
from sparsefx.errors import ConfigError

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

PARAMS = [
    ("embedding.weight", torch.empty(10, 4, device="meta")),
    ("fc1.weight", torch.empty(8, 4, device="meta")),
    ("fc1.bias", torch.empty(8, device="meta")),
    ("block.norm.weight", torch.empty(4, 4, device="meta")),
    ("fc2.weight", torch.empty(4, 8, device="meta")),
    ("conv.weight", torch.empty(6, 3, 3, 3, device="meta")),
]

KEYS = (
    *GROUP_KEYS,
    "model",
    "optimizer",
    "value",
    "init",
    "slope",
    "gamma",
    "final",
    "beta",
    "half_period",
    "minimum",
    "values",
    "begin",
    "end",
    "power",
    "freq",
    "start",
    "stop",
    "steps",
    "fc.*",
    "fc*.weight",
)
WORDS = (
    "static",
    "gmp",
    "set",
    "rigl",
    "RigL",
    "rigll",
    "random",
    "topk",
    "from_zeros",
    "checkerboard",
    "constant",
    "linear",
    "exp",
    "power",
    "cosine",
    "cycling",
    "polynomial",
    "fc.*",
    "fc*.weight",
    "*.weight",
    "(",
    "[",
    "*",
    "",
    "fc1",
    "conv.weight",
)


def _raise(*args: Any) -> Any:
    raise RuntimeError("user function failed")


CALLABLES = (
    lambda *args: 0.5,
    lambda *args: 2.0,
    lambda *args: "x",
    lambda *args: True,
    lambda *args: float("nan"),
    _raise,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=1.0),
    st.text(max_size=12),
    st.sampled_from(WORDS),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=8), st.integers(-2, 2), st.none(), st.booleans())
data = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=5),
    ),
    max_leaves=20,
)
python_data = st.recursive(
    st.one_of(scalars, st.sampled_from(CALLABLES)),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(keys, children, max_size=5),
    ),
    max_leaves=20,
)

plausible = st.one_of(
    st.sampled_from(WORDS),
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(min_value=0, max_value=8),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
)
values = st.one_of(python_data, plausible)

VALID = [
    0.5,
    {"sparsity": 0.9, "param_filter": "fc*.weight"},
    {"sparsity": 0.3, "init_method": "topk", "seed": 1234, "param_name_patterns": "fc.*weight"},
    {"sparsity": 0.3, "param_name_patterns": {"fc1.*": {"sparsity": 0.5, "seed": 7}, "fc2.*": None}},
    {"model": {"hidden_size": 8}, "sparsity": {"sparsity": 0.25, "param_name_patterns": ["fc1", "conv"]}},
    {
        "algorithm": "rigl",
        "sparsity": 0.8,
        "update": {"freq": 10, "start": 5, "stop": 100},
        "drop_fraction": {"type": "cosine", "init": 0.3, "half_period": 750},
        "balance_out_groups": 2,
        "param_filter": ["fc*.weight", "conv.weight"],
    },
    {
        "algorithm": "gmp",
        "sparsity": {"type": "polynomial", "init": 0.0, "final": 0.9, "begin": 0, "end": 1000},
        "update": {"steps": [0, 100]},
    },
    [{"algorithm": "set", "sparsity": [0.5, 0.6], "param_filter": "fc1.*"}, 0.5],
    {"algorithm": "gmp", "sparsity": {"type": "exp", "init": 0.0, "gamma": -0.01, "final": 0.9}},
]


def check(source: Any) -> SparsityConfig | None:
    """Load and resolve ``source``; only ConfigError may escape. Returns the config when it loaded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            config = load_config(source)
        except ConfigError as exc:
            assert str(exc)
            return None
        assert isinstance(config, SparsityConfig)
        try:
            plan = config.resolve(PARAMS)
        except ConfigError:
            return config
    assert len(plan) == len(PARAMS)
    for decision in plan.sparse.values():
        assert 0.0 <= decision.sparsity < 1.0
        assert 0 <= decision.seed < 2**63
    return config


def test_valid_configs_load_and_resolve():
    for source in VALID:
        assert check(source) is not None
        assert check(yaml.safe_dump(source)) is not None


@FUZZ
@given(data)
def test_random_data(value):
    check(value)


@FUZZ
@given(python_data)
def test_random_python_objects(value):
    check(value)


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    """A valid config with a few keys replaced, deleted or added."""
    config = copy.deepcopy(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 3))):
        node = config
        # walk down a random path of dicts and lists
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            key = draw(st.sampled_from(list(node) if isinstance(node, dict) else list(range(len(node)))))
            if not isinstance(node[key], (dict, list)):
                break
            node = node[key]
        if isinstance(node, dict):
            action = draw(st.sampled_from(("replace", "delete", "add")))
            if action == "add" or not node:
                node[draw(keys)] = draw(values)
            elif action == "delete":
                del node[draw(st.sampled_from(list(node)))]
            else:
                node[draw(st.sampled_from(list(node)))] = draw(values)
        elif isinstance(node, list) and node:
            node[draw(st.integers(0, len(node) - 1))] = draw(values)
        else:
            config = draw(python_data)
    return config


@FUZZ
@given(mutated())
def test_mutated_valid_configs(value):
    check(value)


@FUZZ
@given(st.text(max_size=200))
def test_random_text(text):
    check(text)


yaml_alphabet = st.sampled_from(list("{}[]:,-&*!|>'\"#%@` \n\t.0123456789ae") + ["sparsity", "type", "\n  "])


@FUZZ
@given(st.lists(yaml_alphabet, max_size=60).map("".join))
def test_random_yaml_like_text(text):
    check(text)


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_corrupted_yaml_of_valid_configs(source, draw_data):
    text = yaml.safe_dump(source)
    position = draw_data.draw(st.integers(0, len(text)))
    insert = draw_data.draw(st.text(max_size=4) | yaml_alphabet)
    cut = draw_data.draw(st.integers(0, 3))
    check(text[:position] + insert + text[position + cut :])


def test_hostile_yaml():
    for text in (
        "&a [*a]",
        "&a {sparsity: *a}",
        "&a {sparsity: {sparsity: *a}}",
        "[" * 400 + "]" * 400,
        "{a: " * 1200 + "1" + "}" * 1200,
        "!!python/object/apply:os.system ['true']",
        "sparsity: 2020-13-45",
        "sparsity: !!binary aGVsbG8=",
        "? [a, b]\n: 1",
        "sparsity: .nan",
        "sparsity: 1e-3",
        "\ud800",
        "x" * 10000,
        "a.yaml\x00",
    ):
        check(text)


def test_hostile_params():
    config = load_config({"sparsity": 0.5, "param_filter": "*"})
    for named in (None, 3, [("a",)], [(1, torch.empty(2))], [("a", object())], [("a", torch.empty(2))] * 2):
        try:
            config.resolve(named)
        except ConfigError:
            continue
        raise AssertionError(f"resolve accepted {named!r}")


def test_level_checks_cover_nan():
    assert check({"algorithm": "gmp", "sparsity": lambda step: math.nan}) is None
