"""``record_inputs``: first inputs per submodule, nothing changed, no hook left behind."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sparsefx.record_inputs import record_inputs


class Twice(nn.Module):
    """Calls its child twice with inputs of different shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(x).sum() + self.fc(y, **{}).sum()


def test_keeps_the_first_call_and_lets_later_calls_run_on_their_own_inputs() -> None:
    model = Twice()
    x, y = torch.randn(2, 4), torch.randn(3, 4)
    expected = model(x, y)
    with record_inputs({"fc": model.fc}) as seen:
        out = model(x, y)
    assert torch.equal(out, expected)
    (args, kwargs) = seen["fc"]
    assert args[0] is x and kwargs == {}


def test_records_keyword_arguments() -> None:
    class Kw(nn.Module):
        def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
            return x * scale

    outer = nn.ModuleDict({"kw": Kw()})
    with record_inputs(dict(outer.named_children())) as seen:
        outer["kw"](torch.ones(1), scale=2.0)
    assert seen["kw"][1] == {"scale": 2.0}


def test_hooks_go_even_when_the_block_raises() -> None:
    model = Twice()
    with pytest.raises(RuntimeError), record_inputs({"fc": model.fc}) as seen:
        model(torch.randn(2, 4), torch.randn(2, 5))
    assert "fc" in seen
    assert not model.fc._forward_pre_hooks and not model.fc._forward_pre_hooks_with_kwargs
