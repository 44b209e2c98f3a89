"""FLOP and parameter accounting: exact formulas, symbolic in batch/seq, and on the meta device."""

from __future__ import annotations

import pytest
import sympy
import torch

import sparsefx
from sparsefx.models import build_model
from sparsefx.passes.shape_prop import BATCH, SEQ
from sparsefx.sparse.init import keep_count


def _gpt_linears(d: int, layers: int) -> dict[str, int]:
    shapes = {"attn.qkv": 3 * d * d, "attn.proj": d * d, "mlp.fc": 4 * d * d, "mlp.proj": 4 * d * d}
    return {f"blocks.{i}.{k}.weight": n for i in range(layers) for k, n in shapes.items()}


def test_gpt_forward_flops_match_the_hand_formula() -> None:
    spec = build_model("gpt-tiny")  # 2 layers, d=64, vocab 256
    d, layers, vocab = 64, 2, 256
    sm = sparsefx.compile(spec.model, 0.5, spec.args)
    report = sparsefx.flops(sm, symbolic=True)
    tokens = BATCH * SEQ
    linear = sum(_gpt_linears(d, layers).values())
    attention = layers * 4 * BATCH * SEQ**2 * d  # q k^T and (softmax) v, dense
    dense = 2 * linear * tokens + attention + 2 * d * vocab * tokens
    nnz = sum(keep_count(n, 0.5) for n in _gpt_linears(d, layers).values())
    sparse = 2 * nnz * tokens + attention + 2 * d * vocab * tokens
    assert sympy.expand(report.forward_expr[0] - dense) == 0
    assert sympy.expand(report.forward_expr[1] - sparse) == 0
    b, t = spec.args[0].shape
    assert report.dense_forward == int(dense.subs({BATCH: b, SEQ: t}))
    assert report.sparse_forward == int(sparse.subs({BATCH: b, SEQ: t}))
    assert report.dense_train == 3 * report.dense_forward and report.sparse_train == 3 * report.sparse_forward
    total = sum(p.numel() for p in spec.model.parameters())
    assert report.dense_params == total
    assert report.sparse_params == total - sum(
        n - keep_count(n, 0.5) for n in _gpt_linears(d, layers).values()
    )


def test_conv_flops_count_every_output_position() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False))
    report = sparsefx.flops(model, torch.randn(2, 3, 10, 10), config=0.75)
    assert report.dense_forward == 2 * (8 * 3 * 9) * (2 * 10 * 10)
    assert report.sparse_forward == 2 * keep_count(8 * 27, 0.75) * (2 * 10 * 10)


def test_plain_model_without_config_is_all_dense() -> None:
    model = build_model("mlp").model
    report = sparsefx.flops(model, torch.randn(4, 64))
    assert report.dense_forward == report.sparse_forward == 2 * 4 * (64 * 256 + 256 * 256 + 256 * 10)
    assert report.dense_params == report.sparse_params


def test_meta_device_compile_allocates_nothing_and_still_counts() -> None:
    spec = build_model("gpt2-small", device="meta", input_shape=(1, 128))
    sm = sparsefx.compile(spec.model, 0.9, spec.args)
    assert all(p.is_meta for p in sm.parameters())
    assert all(m.is_meta for m in sm.masks.values())
    report = sparsefx.flops(sm)
    d, layers = 768, 12
    linear = _gpt_linears(d, layers)
    assert report.sparse_params == report.dense_params - sum(n - keep_count(n, 0.9) for n in linear.values())
    tokens, vocab = 128, 50257
    attention = layers * 4 * tokens * tokens * d
    head = 2 * d * vocab * tokens
    assert report.dense_forward == 2 * sum(linear.values()) * tokens + attention + head
    assert (
        report.sparse_forward
        == 2 * sum(keep_count(n, 0.9) for n in linear.values()) * tokens + attention + head
    )
    rows = {r.name: r for r in sm.sparsity_report()}
    assert rows["blocks.0.mlp.fc.weight"].nnz == keep_count(4 * d * d, 0.9)


def _gpt3_xl_on_meta() -> tuple[torch.nn.Module, torch.Tensor]:
    """GPT-3 XL's shape (24 layers, d=2048, context 2048, vocab 50257), LM head tied to the embedding."""
    from sparsefx.models.gpt import GPT, GPTConfig

    with torch.device("meta"):
        model = GPT(GPTConfig(n_layer=24, n_head=16, d_model=2048, vocab_size=50257, max_seq_len=2048))
        tokens = torch.zeros(1, 2048, dtype=torch.long)
    model.lm_head.weight = model.wte.weight
    return model, tokens


def test_gpt3_xl_published_ratios_on_meta() -> None:
    """SPDF / Cerebras figures: 75% -> ~2.5x fewer training FLOPs; 83.8% -> ~3x inference, ~4.3x params."""
    model, tokens = _gpt3_xl_on_meta()
    at_75 = sparsefx.flops(model, tokens, config=0.75)
    model, tokens = _gpt3_xl_on_meta()
    at_838 = sparsefx.flops(model, tokens, config=0.838)
    assert all(p.is_meta for p in model.parameters())
    assert 1.30e9 < at_75.dense_params < 1.33e9
    assert at_75.train_reduction == pytest.approx(2.5, abs=0.05)
    assert at_838.forward_reduction == pytest.approx(3.0, abs=0.05)
    assert at_838.param_reduction == pytest.approx(4.3, abs=0.1)


def test_rigl_training_flops_average_over_the_update_interval() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(100, 100, bias=False))
    x = torch.randn(4, 100)
    report = sparsefx.flops(model, x, config={"algorithm": "rigl", "sparsity": 0.9, "update": {"freq": 10}})
    f_d, f_s = 2 * 4 * 100 * 100, 2 * 4 * keep_count(100 * 100, 0.9)
    assert report.sparse_train == round((3 * f_s * 10 + 2 * f_s + f_d) / 11)
    static = sparsefx.flops(torch.nn.Sequential(torch.nn.Linear(100, 100, bias=False)), x, config=0.9)
    assert static.sparse_train == 3 * f_s


@pytest.mark.parametrize("length", [64, 128])
def test_the_sequence_of_a_conv1d_input_is_its_length_not_its_channels(length: int) -> None:
    spec = build_model("conv1d")
    (x,) = spec.args
    x = torch.randn(x.shape[0], x.shape[1], length)  # [B, C, L]
    report = sparsefx.flops(spec.model, (x,), config=0.9, symbolic=True)
    dense, sparse = report.forward_expr
    assert SEQ in dense.free_symbols and BATCH in dense.free_symbols
    values = {BATCH: x.shape[0], SEQ: length}
    assert (int(dense.subs(values)), int(sparse.subs(values))) == (
        report.dense_forward,
        report.sparse_forward,
    )
    doubled = {BATCH: x.shape[0], SEQ: 2 * length}
    longer = sparsefx.flops(spec.model, (torch.randn(x.shape[0], x.shape[1], 2 * length),), config=0.9)
    assert int(dense.subs(doubled)) == longer.dense_forward  # the formula holds at another length
