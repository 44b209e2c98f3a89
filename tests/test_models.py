"""Built-in models: shapes, fx traceability, torch.export fallbacks, meta builds and build_model errors."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.utils._pytree as pytree

import sparsefx
from sparsefx.errors import ConfigError
from sparsefx.models import (
    BUILTIN_MODELS,
    CausalLMOutput,
    ModelSpec,
    ZooOutput,
    build_model,
)
from sparsefx.sparse.init import keep_count

ALL = sorted(BUILTIN_MODELS)
FX_TRACEABLE = ["mlp", "gpt-tiny", "gpt-small-bench", "cnn", "conv1d"]
ZOO = [name for name in ALL if name.startswith("zoo-")]
EXPORTABLE_ZOO = ["zoo-shape-branch", "zoo-inplace", "zoo-dataclass", "zoo-dict", "zoo-gpt2-conv1d"]
# gpt2-small is too big to run eagerly in a unit test; its forward runs on meta instead.
DEVICE = {"gpt2-small": "meta"}


def _build(name: str) -> ModelSpec:
    return build_model(name, device=DEVICE.get(name, "cpu"))


def _run(spec: ModelSpec):
    with torch.no_grad():
        return spec.model(*spec.args, **spec.kwargs)


def _leaves(out) -> list[torch.Tensor]:
    """Tensors in a model output (tensor, dict, tuple or one of the zoo's dataclasses)."""
    if isinstance(out, (ZooOutput, CausalLMOutput)):
        out = [out.logits, out.loss, getattr(out, "hidden", None)]
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _register_outputs() -> None:
    for cls in (ZooOutput, CausalLMOutput):
        if cls not in pytree.SUPPORTED_NODES:
            torch.export.register_dataclass(cls)


def test_names_are_the_documented_ones():
    assert set(BUILTIN_MODELS) == {
        "mlp",
        "gpt-tiny",
        "gpt-small-bench",
        "gpt2-small",
        "cnn",
        "conv1d",
        "zoo-data-dependent",
        "zoo-shape-branch",
        "zoo-inplace",
        "zoo-dataclass",
        "zoo-dict",
        "zoo-gpt2-conv1d",
    }
    assert all(isinstance(d, str) and d for d in BUILTIN_MODELS.values())


def _check_output(name: str, out) -> None:
    tensor_shapes = {
        "mlp": (8, 10),
        "gpt-tiny": (2, 64, 256),
        "gpt-small-bench": (2, 128, 2048),
        "gpt2-small": (2, 128, 50257),
        "cnn": (4, 10),
        "conv1d": (4, 5),
        "zoo-data-dependent": (4, 4),
        "zoo-shape-branch": (4, 4),
        "zoo-inplace": (4, 4),
    }
    if name in tensor_shapes:
        assert isinstance(out, torch.Tensor)
        assert out.shape == tensor_shapes[name]
    elif name == "zoo-dataclass":
        assert isinstance(out, ZooOutput)
        assert out.logits.shape == (4, 4) and out.loss.shape == ()
        assert [h.shape for h in out.hidden] == [(4, 32), (4, 32)]
    elif name == "zoo-dict":
        assert isinstance(out, dict) and set(out) == {"logits", "aux"}
        assert out["logits"].shape == (2, 4) and out["aux"].shape == (2, 8)
    elif name == "zoo-gpt2-conv1d":
        assert isinstance(out, CausalLMOutput)
        assert out.logits.shape == (2, 16, 64) and out.loss.shape == ()
        assert torch.isfinite(out.loss)
    else:
        raise AssertionError(f"no expected output for {name}")


@pytest.mark.parametrize("name", ALL)
def test_builds_and_runs(name):
    spec = _build(name)
    assert isinstance(spec, ModelSpec) and spec.name == name
    assert isinstance(spec.model, torch.nn.Module)
    _check_output(name, _run(spec))


@pytest.mark.parametrize("name", FX_TRACEABLE)
def test_fx_traceable_models_match_eager(name):
    spec = _build(name)
    spec.model.eval()
    traced = torch.fx.symbolic_trace(spec.model)
    with torch.no_grad():
        torch.testing.assert_close(traced(*spec.args, **spec.kwargs), _run(spec))


@pytest.mark.parametrize("name", ZOO)
def test_zoo_models_defeat_fx(name):
    model = _build(name).model
    with pytest.raises(Exception):  # noqa: B017 - each zoo model fails fx its own way
        torch.fx.symbolic_trace(model)


@pytest.mark.parametrize("name", EXPORTABLE_ZOO)
def test_zoo_models_export(name):
    _register_outputs()
    spec = _build(name)
    exported = torch.export.export(spec.model, spec.args, spec.kwargs, strict=False)
    with torch.no_grad():
        got = exported.module()(*spec.args, **spec.kwargs)
    want = _run(spec)
    assert type(got) is type(want)
    got_leaves, want_leaves = _leaves(got), _leaves(want)
    assert len(got_leaves) == len(want_leaves) > 0
    for g, w in zip(got_leaves, want_leaves):
        torch.testing.assert_close(g, w)


def test_data_dependent_model_defeats_export():
    spec = _build("zoo-data-dependent")
    with pytest.raises(Exception):  # noqa: B017 - a data-dependent guard error
        torch.export.export(spec.model, spec.args, spec.kwargs, strict=False)


@pytest.mark.parametrize("name", ALL)
def test_meta_builds_allocate_nothing(name):
    spec = build_model(name, device="meta")
    tensors = [*spec.model.parameters(), *spec.model.buffers(), *_leaves(list(spec.args) + [spec.kwargs])]
    assert tensors and all(t.is_meta for t in tensors)


def test_gpt2_small_parameter_count():
    model = build_model("gpt2-small", device="meta").model
    n_layer, d, vocab, ctx = 12, 768, 50257, 1024
    per_layer = 2 * (2 * d) + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    expected = vocab * d + ctx * d + n_layer * per_layer + 2 * d  # the LM head is wte, counted once
    assert sum(p.numel() for p in model.parameters()) == expected == 124_439_808
    assert abs(expected - 124.4e6) / 124.4e6 < 0.01  # GPT-2 small's published 124M
    assert model.config.n_layer == n_layer and model.config.n_head == 12
    assert model.lm_head.weight is model.wte.weight


def test_gpt2_small_compiles_with_its_tied_head_on_meta() -> None:
    spec = build_model("gpt2-small", device="meta", input_shape=(1, 16))
    sm = sparsefx.compile(spec.model, 0.9, spec.args)
    assert "wte.weight" in sm.plan and "lm_head.weight" not in sm.plan  # one parameter, one name
    assert not sm.plan["wte.weight"].sparse  # an embedding: dense by default, so is the head it is
    assert len(sm.plan.sparse) == 48
    report = sparsefx.flops(sm)
    assert report.dense_params == 124_439_808


def test_a_tied_gpt_trains_sparse_and_keeps_the_tie() -> None:
    from sparsefx.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, vocab_size=32, max_seq_len=8, tie_weights=True))
    (idx,), _ = model.example_inputs(batch=2, seq_len=8)
    sm = sparsefx.compile(model, {"algorithm": "set", "sparsity": 0.75, "update": {"freq": 2}}, (idx,))
    opt = torch.optim.AdamW(sm.parameters(), lr=1e-2)
    sm.sparsity.apply(opt)
    before = model.wte.weight.detach().clone()
    for _ in range(4):
        opt.zero_grad()
        logits = sm(idx)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
        opt.step()
    assert model.lm_head.weight is model.wte.weight
    assert not torch.equal(model.wte.weight, before)  # the shared weight trains (dense)
    for name, mask in sm.masks.items():
        assert bool((sm.get_parameter(name)[~mask] == 0).all())
        assert int(mask.sum()) == keep_count(mask.numel(), 0.75)


def test_gpt2_conv1d_param_names():
    names = dict(build_model("zoo-gpt2-conv1d", device="meta").model.named_parameters())
    assert names["transformer.h.0.attn.c_attn.weight"].shape == (32, 96)  # [in, out]
    assert "transformer.h.0.mlp.c_fc.weight" in names and "transformer.wte.weight" in names
    assert "lm_head.weight" in names and "lm_head.bias" not in names
    assert names["lm_head.weight"] is not names["transformer.wte.weight"]


def test_shapes_and_batch_override():
    assert build_model("mlp", input_shape=(3, 20)).args[0].shape == (3, 20)
    assert build_model("cnn", batch=2).args[0].shape == (2, 3, 32, 32)
    assert build_model("cnn", input_shape=(4, 1, 16, 16), batch=1).args[0].shape == (1, 1, 16, 16)
    spec = build_model("gpt-tiny", input_shape=(1, 10))
    assert spec.args[0].shape == (1, 10) and spec.args[0].dtype == torch.long
    shape_branch = build_model("zoo-shape-branch", input_shape=(2, 5, 4))
    assert _run(shape_branch).shape == (2, 4)


def test_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = build_model("gpt-tiny", seed=7)
    assert torch.equal(torch.rand(3), expected)
    b = build_model("gpt-tiny", seed=7)
    c = build_model("gpt-tiny", seed=8)
    assert torch.equal(a.args[0], b.args[0])
    for (_, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(pa, pb)
    assert not torch.equal(a.model.lm_head.weight, c.model.lm_head.weight)


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """An importable module ``sfx_user_factories`` holding user factories."""
    (tmp_path / "sfx_user_factories.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def plain():
                return nn.Linear(5, 2)

            def with_inputs():
                return nn.Linear(5, 2), ((torch.randn(3, 5),), {})

            def with_tensor():
                return nn.Linear(5, 2), torch.randn(4, 5)

            def broken():
                raise RuntimeError("boom")

            def not_a_module():
                return 42

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "sfx_user_factories"


def test_user_factories(factories):
    spec = build_model(f"{factories}:plain", input_shape=(6, 5))
    assert spec.args[0].shape == (6, 5) and spec.kwargs == {}
    assert spec.model(*spec.args).shape == (6, 2)
    assert build_model(f"{factories}:plain").args == ()
    assert build_model(f"{factories}:with_inputs").args[0].shape == (3, 5)
    assert build_model(f"{factories}:with_tensor").args[0].shape == (4, 5)
    meta = build_model(f"{factories}:plain", device="meta", input_shape=(2, 5))
    assert meta.model.weight.is_meta and meta.args[0].is_meta
    assert build_model("sparsefx.models.mlp:MLP").model.in_features == 64


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        ("nope", ["'nope'", "gpt-tiny", "zoo-gpt2-conv1d", "package.module:factory"]),
        ("", ["package.module:factory"]),
        ("a.b:", ["'a.b:'", "package.module:factory", "mlp"]),
        ("a:b:c", ["'a:b:c'", "package.module:factory"]),
        ("1bad:f", ["'1bad:f'", "package.module:factory"]),
        ("sfx_no_such_module_xyz:f", ["sfx_no_such_module_xyz", "import"]),
        ("sparsefx.models.mlp:nope", ["'nope'", "sparsefx.models.mlp"]),
        ("sparsefx.models.gpt:GPT", ["GPT", "raised", "TypeError"]),
    ],
)
def test_build_errors_name_the_bad_value(spec, needles):
    with pytest.raises(ConfigError) as info:
        build_model(spec)
    for needle in needles:
        assert needle in str(info.value)


@pytest.mark.parametrize(
    ("attr", "needle"),
    [("broken", "boom"), ("not_a_module", "int"), ("NOT_CALLABLE", "not a callable")],
)
def test_bad_user_factories(factories, attr, needle):
    with pytest.raises(ConfigError) as info:
        build_model(f"{factories}:{attr}")
    assert f"{factories}:{attr}" in str(info.value) and needle in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"input_shape": (2, 3, 4)}, "(batch, in_features)"),
        ({"input_shape": (2, 0)}, "positive"),
        ({"batch": 0}, "batch"),
        ({"device": "nodevice"}, "nodevice"),
    ],
)
def test_bad_options(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        build_model("mlp", **kwargs)
    assert needle in str(info.value)


def test_sequence_too_long():
    with pytest.raises(ConfigError, match="max_seq_len"):
        build_model("gpt-tiny", input_shape=(1, 65))
    with pytest.raises(ConfigError, match="n_positions"):
        build_model("zoo-gpt2-conv1d", input_shape=(1, 33))
