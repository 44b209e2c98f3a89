"""Augmented assignment (``h += 1``) and other in-place writes: eager semantics, captured and lowered.

On a tensor, ``h += 1`` writes ``h`` in place, so every alias of it sees the change. fx's Proxy has no
``__iadd__``, and a trace used to record ``h = h + 1``, a new value: the compiled model and the program
silently computed something else. Now fx records ``operator.iadd``, lowering follows the write to every
alias, and a write that reaches a view read afterwards is a ``LoweringError`` naming the op.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import sparsefx
from conftest import assert_outputs_close, reference_forward
from sparsefx.errors import LoweringError


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)


class AliasSeesIncrement(_Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        y = h
        h += 1
        return y * 2


class AliasAndResult(_Linear):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.fc(x)
        z = a
        a += x * 3
        return z, a


class Chain(_Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.fc(x)
        z = a
        a *= 2
        a **= 2
        a -= x
        a /= 3
        return z + 1


class BoolMask(_Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.fc(x) > 0
        k = m
        m |= x > 0.5
        m &= x < 1.0
        return k.to(x.dtype) * x


class WriteThroughView(_Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.fc(x)
        v = a[:, 1:3]
        v += 1
        return a * 2


class ViewOfWritten(_Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.fc(x)
        v = a[:, 1:3]
        a += 1
        return v * 2


def _name(cls: type) -> str:
    return cls.__name__


def _compiled(cls: type, method: str) -> tuple[nn.Module, sparsefx.SparseModel]:
    model = cls().eval()
    x = torch.randn(3, 4)
    sm = sparsefx.compile(copy.deepcopy(model), {"sparsity": 0.5}, (x,), capture_method=method)
    assert sm.capture_method == method
    return model, sm.eval()


@pytest.mark.parametrize("method", ["fx", "export"])
@pytest.mark.parametrize("cls", [AliasSeesIncrement, AliasAndResult, Chain, BoolMask], ids=_name)
def test_augmented_assignment_matches_eager_compiled_and_on_the_mesh(cls: type, method: str) -> None:
    model, sm = _compiled(cls, method)
    fresh = torch.randn(3, 4)
    want = reference_forward(model, sm.masks, (fresh,), {})
    assert_outputs_close(sm(fresh), want)
    program = sparsefx.lower(sm, torch.randn(3, 4), mesh=(16, 4))
    for executor in ("fast", "reference"):
        assert_outputs_close(sparsefx.run(program, fresh, executor=executor).outputs, want, atol=1e-5)


@pytest.mark.parametrize("method", ["fx", "export"])
@pytest.mark.parametrize("cls", [WriteThroughView, ViewOfWritten], ids=_name)
def test_a_write_a_view_would_see_is_refused_by_name(cls: type, method: str) -> None:
    model, sm = _compiled(cls, method)
    fresh = torch.randn(3, 4)
    assert_outputs_close(sm(fresh), reference_forward(model, sm.masks, (fresh,), {}))
    refused = r"writes in place into .*\((iadd|add_\.Tensor)\).* read afterwards"
    with pytest.raises(LoweringError, match=refused):
        sparsefx.lower(sm, fresh, mesh=(16, 4))
