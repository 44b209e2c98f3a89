"""Every compiled model equals the original run with weights * masks, on fresh random inputs."""

from __future__ import annotations

import pytest
import torch

import sparsefx
from conftest import assert_outputs_close, reference_forward
from sparsefx.models import build_model

CASES = {
    "mlp": "fx",
    "gpt-tiny": "fx",
    "cnn": "fx",
    "conv1d": "fx",
    "zoo-data-dependent": "partial",
    "zoo-shape-branch": "export",
    "zoo-inplace": "export",
    "zoo-dataclass": "fx",
    "zoo-dict": "export",
    "zoo-gpt2-conv1d": "export",
}


def _fresh_inputs(args: tuple, kwargs: dict, seed: int) -> tuple[tuple, dict]:
    """New random values with the same shapes and dtypes (token ids stay in range)."""
    gen = torch.Generator().manual_seed(seed)

    def fresh(t: object) -> object:
        if not isinstance(t, torch.Tensor):
            return t
        if t.is_floating_point():
            return torch.randn(t.shape, generator=gen, dtype=t.dtype)
        high = int(t.max()) + 1 if t.numel() else 1
        return torch.randint(0, max(high, 1), t.shape, generator=gen, dtype=t.dtype)

    return tuple(fresh(a) for a in args), {k: fresh(v) for k, v in kwargs.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_forward_matches_masked_reference(name: str) -> None:
    spec = build_model(name)
    model = spec.model.eval()
    sm = sparsefx.compile(model, 0.8, spec.args, example_kwargs=spec.kwargs)
    assert sm.capture_method == CASES[name]
    assert sm.masks, "some weights must be sparse"
    for seed in (1, 2):
        args, kwargs = _fresh_inputs(spec.args, spec.kwargs, seed)
        assert_outputs_close(sm(*args, **kwargs), reference_forward(model, sm.masks, args, kwargs))


@pytest.mark.parametrize("name", ["mlp", "gpt-tiny", "zoo-gpt2-conv1d"])
def test_parameter_names_are_the_original_ones(name: str) -> None:
    spec = build_model(name)
    sm = sparsefx.compile(spec.model, 0.5, spec.args, example_kwargs=spec.kwargs)
    original = {n for n, _ in spec.model.named_parameters()}
    assert {n for n, _ in sm.named_parameters()} == original
    masks = {k for k in sm.state_dict() if k.endswith("_mask")}
    assert masks == {f"{n}_mask" for n in sm.masks}


def test_dynamic_batch_after_export() -> None:
    spec = build_model("zoo-inplace")
    sm = sparsefx.compile(spec.model.eval(), 0.5, spec.args, example_kwargs=spec.kwargs)
    x = torch.randn(5, *spec.args[0].shape[1:])
    assert_outputs_close(sm(x), reference_forward(spec.model, sm.masks, (x,), {}))


def test_masks_have_exact_counts_and_prune_weights() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(30, 40), torch.nn.ReLU(), torch.nn.Linear(40, 7))
    sm = sparsefx.compile(model, 0.75)
    for name, mask in sm.masks.items():
        assert mask.dtype == torch.bool
        assert int(mask.sum()) == int(0.25 * mask.numel())
        assert torch.all(sm.get_parameter(name)[~mask] == 0)
    assert set(sm.masks) == {"0.weight", "2.weight"}
