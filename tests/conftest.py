"""Shared helpers: the PyTorch reference every compiled model is compared against."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call


def reference_forward(model: nn.Module, masks: dict[str, torch.Tensor], args: tuple, kwargs: dict) -> Any:
    """The original model run with ``weight * mask`` for every sparse weight."""
    params = dict(model.named_parameters())
    masked = {name: params[name] * mask for name, mask in masks.items()}
    return functional_call(model, masked, args, kwargs)


def tensor_leaves(obj: Any) -> list[torch.Tensor]:
    """Tensors inside nested tuples, lists, dicts and dataclasses, in a stable order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in tensor_leaves(getattr(obj, f.name))]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensor_leaves(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensor_leaves(v)]
    return []


def assert_outputs_close(got: Any, want: Any, atol: float = 1e-6, rtol: float = 1e-5) -> None:
    assert type(got) is type(want), f"output type {type(got)} != {type(want)}"
    g, w = tensor_leaves(got), tensor_leaves(want)
    assert len(g) == len(w) and g, "output structure differs"
    for a, b in zip(g, w):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)
