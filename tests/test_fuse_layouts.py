"""Chains of layout changes lower to one kernel (``passes/lower/fuse_layouts.py``): a GPT's head split
is one step, not three; a layout value read twice, or returned, stays its own kernel; outputs are
PyTorch's in both executors; a chain step that is not a one-input layout is an error."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import sparsefx
from sparsefx.errors import EmulationError
from sparsefx.models.gpt import GPT, GPTConfig
from sparsefx.runtime.text import parse_program, print_program


def _chains(program: sparsefx.DataflowProgram) -> dict[str, list[str]]:
    return {
        k.name: [s["fn"] for s in k.attrs["steps"]]
        for k in program.kernels
        if k.op == "layout" and k.attrs.get("fn") == "chain"
    }


@pytest.mark.parametrize("mode, mesh", [("streaming", (16, 16)), ("pipelined", (40, 16))])
def test_a_gpt_head_split_is_one_layout_kernel(mode, mesh):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, vocab_size=64, max_seq_len=32)).eval()
    ids = torch.randint(0, 64, (1, 16))
    sm = sparsefx.compile(model, 0.8, (ids,))
    p = sparsefx.lower(sm, (ids,), mesh=mesh, mode=mode)
    chains = _chains(p)
    assert sorted(chains.values()) == [
        ["permute", "reshape"],  # the heads merged back: transpose, then flatten
        *[["slice", "reshape", "permute"]] * 3,  # q, k and v: chunk, unflatten, transpose
    ]
    assert sum(k.op == "layout" for k in p.kernels) == 4
    fresh = torch.randint(0, 64, (1, 16))
    for executor in ("fast", "reference"):
        out = sparsefx.run(p, (fresh,), executor=executor).outputs
        assert torch.allclose(out, sm.eval()(fresh), rtol=1e-4, atol=1e-5)
    assert _chains(parse_program(print_program(p))) == chains


class _Shared(nn.Module):
    """``v`` is read by two kernels and ``w`` is returned: neither joins the layout after it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        v = self.fc(x).reshape(4, 2, 4)
        w = v.transpose(1, 2)
        return w.reshape(4, 8) * 2, v.permute(1, 0, 2) + 1, w


def test_a_layout_read_twice_or_returned_keeps_its_kernel():
    x = torch.randn(4, 8)
    model = _Shared().eval()
    sm = sparsefx.compile(model, 0.5, (x,))
    p = sparsefx.lower(sm, (x,), mesh=(8, 8), mode="streaming")
    assert sum(k.op == "layout" for k in p.kernels) == 4  # reshape, transpose, reshape, permute
    assert _chains(p) == {}
    out = sparsefx.run(p, (x,)).outputs
    for got, want in zip(out, sm.eval()(x)):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_chain_step_that_is_not_a_one_input_layout_is_refused():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, vocab_size=64, max_seq_len=32)).eval()
    ids = torch.randint(0, 64, (1, 16))
    p = sparsefx.lower(sparsefx.compile(model, 0.8, (ids,)), (ids,), mesh=(16, 16), mode="streaming")
    name = next(iter(_chains(p)))
    k = p.kernel(name)
    bad = dict(k.attrs, steps=[*k.attrs["steps"], {"fn": "cat", "dim": 0}])
    p.kernels[p.kernels.index(k)] = dataclasses.replace(k, attrs=bad)
    with pytest.raises(EmulationError, match="chain step .*'cat'.* is not a layout of one of reshape"):
        sparsefx.run(p, (ids,))
