"""Capture: fx when it works, torch.export otherwise, partial capture as the last resort."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import sparsefx
from conftest import assert_outputs_close, reference_forward
from sparsefx.capture import capture
from sparsefx.errors import CaptureError
from sparsefx.models import build_model


class OptionalMask(nn.Module):
    """fx would trace ``mask`` as a Proxy and always take the ``is not None`` branch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.fc(x)
        if mask is not None:
            h = h * mask
        return h


def test_fx_traces_unsupplied_defaults_as_constants() -> None:
    model = OptionalMask()
    cap = capture(model)
    assert cap.method == "fx"
    x = torch.randn(2, 8)
    assert torch.equal(cap.root(x), model(x))


def test_fx_failure_without_inputs_asks_for_them() -> None:
    spec = build_model("zoo-inplace")
    with pytest.raises(CaptureError, match=r"needs example inputs: pass example_inputs"):
        sparsefx.compile(spec.model, 0.5)


def test_forced_fx_on_untraceable_model_is_a_capture_error() -> None:
    spec = build_model("zoo-inplace")
    with pytest.raises(CaptureError, match="symbolic_trace failed on InplaceAssignNet"):
        sparsefx.compile(spec.model, 0.5, spec.args, capture_method="fx")


def test_unknown_capture_method() -> None:
    with pytest.raises(CaptureError, match="'jit' is not one of auto, fx, export"):
        capture(nn.Linear(2, 2), method="jit")


def test_partial_capture_keeps_value_dependent_control_flow_correct() -> None:
    spec = build_model("zoo-data-dependent")
    model = spec.model.eval()
    sm = sparsefx.compile(model, 0.5, spec.args)
    assert sm.capture_method == "partial"
    assert any("GuardOnDataDependentSymNode" in line or "export:" in line for line in sm.capture_log)
    for sign in (1.0, -1.0):  # inputs that take each branch
        x = sign * torch.rand(4, *spec.args[0].shape[1:]) * 5
        assert_outputs_close(sm(x), reference_forward(model, sm.masks, (x,), {}))


def test_aliased_example_inputs_do_not_alias_graph_inputs() -> None:
    spec = build_model("zoo-gpt2-conv1d")
    model = spec.model.eval()
    assert spec.kwargs["labels"] is spec.args[0]
    sm = sparsefx.compile(model, 0.5, spec.args, example_kwargs=spec.kwargs)
    ids = torch.randint(0, 50, spec.args[0].shape)
    labels = torch.randint(0, 50, spec.args[0].shape)
    kwargs = {"attention_mask": torch.ones_like(ids), "labels": labels}
    assert_outputs_close(sm(ids, **kwargs), reference_forward(model, sm.masks, (ids,), kwargs))


def test_not_a_module() -> None:
    with pytest.raises(CaptureError, match="must be a torch.nn.Module; got function"):
        sparsefx.compile(lambda x: x, 0.5)  # type: ignore[arg-type]


def test_embeddings_stay_dense_by_default_whatever_their_name() -> None:
    spec = build_model("gpt-tiny")
    sm = sparsefx.compile(spec.model, 0.5, spec.args)
    assert "wte.weight" not in sm.masks and "lm_head.weight" not in sm.masks
    assert sm.plan["wte.weight"].reason == "default exclusion: Embedding module"
    explicit = sparsefx.compile(
        build_model("gpt-tiny").model, {"sparsity": 0.5, "param_filter": "wte.weight"}
    )
    assert set(explicit.masks) == {"wte.weight"}


def test_requires_dense_on_modules_and_parameters() -> None:
    model = build_model("mlp").model
    model.net[0].requires_dense = True
    model.net[2].weight.requires_dense = True
    sm = sparsefx.compile(model, 0.5)
    assert "net.0.weight" not in sm.masks and "net.2.weight" not in sm.masks
    assert sm.plan["net.0.weight"].reason.startswith("requires_dense")
