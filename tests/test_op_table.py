"""The op table describes every masked op once; rewrite, shapes and FLOPs read it."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import fx, nn

import sparsefx
from sparsefx import op_table, ops


@pytest.mark.parametrize("op", sorted(op_table.MASKED, key=lambda f: f.__name__))
def test_a_row_matches_its_masked_op_signature(op: object) -> None:
    row = op_table.MASKED[op]
    names = list(inspect.signature(op).parameters)
    assert tuple(names) == row.params
    assert names[row.weight_arg] == "weight" and names[row.weight_arg + 1] == "mask"
    operands = {name: f"<{name}>" for name in row.params}
    canonical = row.operands(row.masked_args(operands))
    assert (canonical.input, canonical.weight, canonical.mask) == ("<input>", "<weight>", "<mask>")


def test_every_masked_op_of_ops_is_in_the_table() -> None:
    names = [n for n in vars(ops) if n.startswith("masked_") and n != "masked_module_call"]
    masked = {getattr(ops, n) for n in names}
    assert masked == set(op_table.MASKED)


class Calls(nn.Module):
    """One dense call of every masked kind, each reading a weight the config makes sparse."""

    def __init__(self) -> None:
        super().__init__()
        self.w_lin = nn.Parameter(torch.randn(6, 8))
        self.w_mm = nn.Parameter(torch.randn(8, 6))
        self.w_first = nn.Parameter(torch.randn(5, 4))
        self.w_addmm = nn.Parameter(torch.randn(8, 6))
        self.b_addmm = nn.Parameter(torch.zeros(6))
        self.conv = nn.Conv1d(4, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(2, 3, 3)

    def forward(self, x: torch.Tensor, seq: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
        a = torch.nn.functional.linear(x, self.w_lin)
        b = x @ self.w_mm
        c = torch.addmm(self.b_addmm, x, self.w_addmm, beta=0.5, alpha=2.0)
        d = self.w_first @ seq[0]
        e = self.conv(seq)
        f = self.conv2(img)
        return a.sum() + b.sum() + c.sum() + d.sum() + e.sum() + f.sum()


def test_rewrite_and_flops_agree_with_the_dense_graph() -> None:
    model = Calls()
    inputs = (torch.randn(3, 8), torch.randn(2, 4, 5), torch.randn(1, 2, 6, 6))
    config = {"sparsity": 0.5, "param_filter": ["w_*", "conv.weight", "conv2.weight"]}
    sm = sparsefx.compile(model, config, inputs)
    targets = [n.target for n in sm.graph_module.graph.nodes if n.op == "call_function"]
    for op in op_table.MASKED:
        assert op in targets, f"{op.__name__} missing from {targets}"
    assert ops.apply_mask not in targets
    dense = sparsefx.flops(model, inputs)
    sparse = sparsefx.flops(sm)
    assert sparse.dense_forward == dense.dense_forward, "masked ops cost what their dense sources do"
    assert sparse.sparse_forward < dense.dense_forward
    gm = fx.symbolic_trace(model)
    rows = [op_table.by_function(n.target) or op_table.by_method(str(n.target)) for n in gm.graph.nodes]
    assert {r.kind for r in rows if r is not None} == {"linear", "matmul", "addmm"}
