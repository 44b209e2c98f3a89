"""Frozen convolutions: ``SparseConv`` equals the masked convolution on every kernel, geometry and
padding mode; ``freeze`` packs a CNN's convolutions (a grouped one is left dense and said so) and a
Hugging Face ViT's patch embedding and linear layers, equal to the compiled model on fresh inputs."""

from __future__ import annotations

import importlib

import pytest
import torch

import sparsefx
from sparsefx.errors import FreezeError
from sparsefx.frozen.kernels import COLUMN_BINDERS, NUMBA, NUMBA_KERNELS
from sparsefx.frozen.packed import pack
from sparsefx.frozen.sparse_conv import CONV_BUCKETS, SparseConv, choose_conv
from sparsefx.models.registry import build_model

KERNELS = [k for k in COLUMN_BINDERS if k not in NUMBA_KERNELS or NUMBA] + ["dense"]

CONVS = {
    "2d 3x3 pad 1": lambda: torch.nn.Conv2d(5, 7, 3, padding=1),
    "2d stride 2 dilation 2": lambda: torch.nn.Conv2d(5, 7, 3, stride=2, dilation=2, padding=2),
    "2d same, even kernel": lambda: torch.nn.Conv2d(5, 7, (2, 4), padding="same"),
    "2d reflect": lambda: torch.nn.Conv2d(5, 7, 3, padding=1, padding_mode="reflect"),
    "2d circular, no bias": lambda: torch.nn.Conv2d(
        5, 7, 3, padding=(1, 2), padding_mode="circular", bias=False
    ),
    "2d patches (stride = kernel)": lambda: torch.nn.Conv2d(5, 7, 4, stride=4),
    "1d": lambda: torch.nn.Conv1d(5, 7, 5, padding=2),
    "1d replicate, stride 3": lambda: torch.nn.Conv1d(5, 7, 3, stride=3, padding=1, padding_mode="replicate"),
}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("what", list(CONVS))
def test_a_sparse_conv_equals_the_masked_convolution(what: str, kernel: str) -> None:
    torch.manual_seed(len(what))
    conv = CONVS[what]().requires_grad_(False)
    mask = torch.rand(conv.weight.shape) < 0.2
    mask[0] = False  # an output channel with nothing kept
    conv.weight.mul_(mask)
    p = pack(conv.weight.reshape(conv.out_channels, -1), mask.reshape(conv.out_channels, -1))
    layer = SparseConv(conv, p, (kernel,) * len(CONV_BUCKETS))
    spatial = (13, 11) if conv.weight.dim() == 4 else (29,)
    for x in (torch.randn(3, 5, *spatial), torch.randn(5, *spatial)):  # batched, and one unbatched
        got, expected = layer(x), conv(x)
        assert got.shape == expected.shape and got.is_contiguous(), what
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5), (what, kernel)
    with pytest.raises(FreezeError, match="takes \\[batch,\\] 5 channels"):
        layer(torch.randn(2, 4, *spatial))


def test_choose_conv_measures_each_bucket_and_the_choice_runs() -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(32, 32, 3, padding=1).requires_grad_(False)
    mask = torch.rand(conv.weight.shape) < 0.1
    p = pack(conv.weight.reshape(32, -1), mask.reshape(32, -1))
    probe = SparseConv(conv, p, ("dense",) * len(CONV_BUCKETS))
    choice = choose_conv(probe, ["rows", "torch", "dense"] if NUMBA else ["torch", "dense"])
    assert len(choice) == len(CONV_BUCKETS) and set(choice) <= {"rows", "torch", "dense"}


@pytest.fixture
def sparse_convs(monkeypatch) -> None:
    """Every layer packed, whatever this machine's timings say (the outputs are tested here)."""
    freeze_module = importlib.import_module("sparsefx.frozen.freeze")
    linear = ("spmv", "torch", "rows", "rows", "rows") if NUMBA else ("torch",) * 5
    conv = ("torch", "rows", "rows", "torch", "rows") if NUMBA else ("torch",) * 5
    monkeypatch.setattr(freeze_module, "choose", lambda *a, **k: linear)
    monkeypatch.setattr(freeze_module, "choose_conv", lambda *a, **k: conv)


@pytest.mark.parametrize("name", ["cnn", "conv1d"])
def test_a_frozen_cnn_equals_the_compiled_model_and_names_its_grouped_conv(name: str, sparse_convs) -> None:
    spec = build_model(name, seed=0)
    sm = sparsefx.compile(spec.model, 0.9, spec.args).eval()
    fast = sparsefx.freeze(sm)
    report = {r.weight: r for r in fast.freeze_report}
    assert report["features.conv1.0.weight"].kernels and report["features.conv2.0.weight"].kernels
    assert "grouped convolution (groups=4)" in report["features.conv3.0.weight"].why_dense
    assert isinstance(fast.module.features.conv1[0], SparseConv)
    fresh = build_model(name, seed=1)
    with torch.no_grad():
        assert torch.allclose(fast(*fresh.args), sm(*fresh.args), rtol=1e-4, atol=1e-5)
    state = fast.state_dict()
    assert "module.features.conv1.0.weight_values" in state and "module.features.conv1.0.weight" not in state


def test_a_frozen_hf_vit_equals_the_compiled_model(sparse_convs) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, num_labels=5,
    )  # fmt: skip
    model = transformers.ViTForImageClassification(config).eval()
    config_text = {"sparsity": 0.9, "param_filter": ["*.weight"]}
    sm = sparsefx.compile(model, config_text, (torch.randn(2, 3, 32, 32),)).eval()
    fast = sparsefx.freeze(sm)
    packed = {r.weight for r in fast.freeze_report if r.kernels}
    assert "vit.embeddings.patch_embeddings.projection.weight" in packed
    assert sum(".layers.1." in name for name in packed) >= 5  # its attention and MLP layers
    pixels = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected, got = sm(pixels), fast(pixels)
    assert type(got) is type(expected)
    assert torch.allclose(got.logits, expected.logits, rtol=1e-4, atol=1e-5)


def test_a_3d_convolution_stays_dense_and_is_named(sparse_convs) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv3d(2, 4, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(4 * 64, 3)
    )
    x = torch.randn(2, 2, 4, 4, 4)
    sm = sparsefx.compile(model, {"sparsity": 0.9, "param_filter": ["*.weight"]}, (x,)).eval()
    fast = sparsefx.freeze(sm)
    report = {r.weight: r for r in fast.freeze_report}
    assert "Conv3d" in report["0.weight"].why_dense and not report["0.weight"].kernels
    assert report["2.weight"].kernels
    with torch.no_grad():
        assert torch.allclose(fast(x), sm(x), rtol=1e-4, atol=1e-5)
