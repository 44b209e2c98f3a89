"""Golden and before/expected tests of the rewrite pipeline, pass by pass."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import sparsefx
from conftest import assert_outputs_close, reference_forward
from sparsefx import ops
from sparsefx.compiler import resolve_plan
from sparsefx.config import load_config
from sparsefx.errors import PassError
from sparsefx.passes import PassManager, PassResult, fail
from sparsefx.passes.insert_masks import InsertMasks
from sparsefx.passes.rewrite_sparse_ops import RewriteSparseOps
from sparsefx.passes.select_params import SelectSparseParams


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _pipeline(model: nn.Module, config: object = 0.5) -> tuple[fx.GraphModule, PassManager]:
    gm = fx.symbolic_trace(model)
    plan = resolve_plan(load_config(config), model)
    pm = PassManager([SelectSparseParams(plan), InsertMasks(), RewriteSparseOps()], debug=True)
    return pm(gm).graph_module, pm


def _calls(gm: fx.GraphModule) -> list[str]:
    return [
        n.target.__name__ if callable(n.target) else str(n.target)
        for n in gm.graph.nodes
        if n.op != "get_attr"
    ]


def test_golden_mlp_graph() -> None:
    gm, pm = _pipeline(TwoLayer())
    assert _calls(gm) == ["x", "masked_linear", "relu", "masked_linear", "output"]
    code = gm.code
    assert "sparsefx_ops_masked_linear(x, fc1_weight, fc1_weight_mask, fc1_bias)" in code
    assert "sparsefx_ops_masked_linear(relu, fc2_weight, fc2_weight_mask, fc2_bias)" in code
    assert [name for name, _ in pm.history] == ["select-sparse-params", "insert-masks", "rewrite-sparse-ops"]


def test_before_expected_structure() -> None:
    """Build the expected graph by hand and compare node by node."""
    model = TwoLayer()
    gm, _ = _pipeline(model)
    expected = fx.Graph()
    x = expected.placeholder("x")
    w1, b1, m1 = (expected.get_attr(t) for t in ("fc1.weight", "fc1.bias", "fc1.weight_mask"))
    h = expected.call_function(ops.masked_linear, (x, w1, m1, b1))
    h = expected.call_function(torch.relu, (h,))
    w2, b2, m2 = (expected.get_attr(t) for t in ("fc2.weight", "fc2.bias", "fc2.weight_mask"))
    expected.output(expected.call_function(ops.masked_linear, (h, w2, m2, b2)))

    def shape(g: fx.Graph) -> list[tuple]:
        out = []
        for n in g.nodes:
            if n.op == "get_attr":
                continue
            args = tuple(
                a.target if isinstance(a, fx.Node) and a.op == "get_attr" else type(a).__name__
                for a in n.args
            )
            out.append((n.op, n.target if n.op != "placeholder" else "x", args))
        return out

    assert shape(gm.graph) == shape(expected)


def test_pipeline_is_idempotent() -> None:
    gm, _ = _pipeline(TwoLayer())
    code, masks = gm.code, {k: v.clone() for k, v in gm.state_dict().items() if k.endswith("_mask")}
    plan = resolve_plan(load_config(0.5), TwoLayer())
    for p in (SelectSparseParams(plan), InsertMasks(), RewriteSparseOps()):
        result = p(gm)
        assert not result.modified, p.name
    assert gm.code == code
    for k, v in masks.items():
        assert torch.equal(gm.get_buffer(k), v)


def test_pass_error_names_pass_node_and_history() -> None:
    class Boom:
        name = "boom"

        def __call__(self, gm: fx.GraphModule) -> PassResult:
            node = next(n for n in gm.graph.nodes if n.op == "call_module")
            raise fail(node, "cannot handle this")

    gm = fx.symbolic_trace(TwoLayer())
    plan = resolve_plan(load_config(0.5), TwoLayer())
    pm = PassManager([SelectSparseParams(plan), Boom()])
    with pytest.raises(PassError) as info:
        pm(gm)
    msg = str(info.value)
    assert msg.startswith("boom failed on node %fc1 : [num_users=1] = call_module[target=fc1]")
    assert "cannot handle this" in msg and "passes run so far: select-sparse-params" in msg


def test_debug_verify_catches_a_bad_mask() -> None:
    class CorruptMask:
        name = "corrupt-mask"

        def __call__(self, gm: fx.GraphModule) -> PassResult:
            gm.fc1.weight_mask = gm.fc1.weight_mask.float()
            return PassResult(gm, True)

    gm = fx.symbolic_trace(TwoLayer())
    plan = resolve_plan(load_config(0.5), TwoLayer())
    pm = PassManager([SelectSparseParams(plan), InsertMasks(), RewriteSparseOps(), CorruptMask()], debug=True)
    with pytest.raises(
        PassError, match=r"corrupt-mask produced an invalid graph.*mask dtype is torch.float32"
    ):
        pm(gm)


class FunctionalZoo(nn.Module):
    """Weights consumed through every functional form the rewrite knows, and some it does not."""

    def __init__(self) -> None:
        super().__init__()
        self.w_lin = nn.Parameter(torch.randn(12, 10))
        self.w_rhs = nn.Parameter(torch.randn(12, 12))
        self.w_lhs = nn.Parameter(torch.randn(6, 12))
        self.w_addmm = nn.Parameter(torch.randn(6, 6))
        self.b_addmm = nn.Parameter(torch.randn(6))
        self.w_t = nn.Parameter(torch.randn(5, 6))
        self.conv1 = nn.Parameter(torch.randn(4, 3, 3))
        self.conv2 = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.reflect = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
        self.mha = nn.MultiheadAttention(6, 2, batch_first=True)

    def forward(self, x: torch.Tensor, s: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = F.linear(x, self.w_lin)  # [B, 12]
        h = h @ self.w_rhs  # weight on the right
        h = torch.matmul(self.w_lhs, h.t()).t()  # weight on the left: [B, 6]
        h = torch.addmm(self.b_addmm, h, self.w_addmm)
        out = h @ self.w_t.t()  # a use the rewrite has no named op for
        seq = self.mha(h.unsqueeze(1), h.unsqueeze(1), h.unsqueeze(1))[0]
        c1 = F.conv1d(s, self.conv1, padding=1)
        c2 = F.conv2d(img, self.conv2, stride=2)
        c3 = self.reflect(img)
        return out, seq, c1, c2, c3


def test_every_weight_use_is_masked_and_matches_reference() -> None:
    model = FunctionalZoo()
    config = {"sparsity": 0.6, "param_filter": ["w_*", "conv*", "reflect.weight", "mha.in_proj_weight"]}
    inputs = (torch.randn(4, 10), torch.randn(4, 3, 9), torch.randn(4, 3, 8, 8))
    sm = sparsefx.compile(model, config, inputs)
    targets = [n.target for n in sm.graph_module.graph.nodes if n.op == "call_function"]
    for op in (ops.masked_linear, ops.masked_matmul, ops.masked_addmm, ops.masked_conv1d, ops.masked_conv2d):
        assert op in targets, op.__name__
    assert ops.apply_mask in targets and ops.masked_module_call in targets
    assert len(sm.masks) == 9
    fresh = (torch.randn(3, 10), torch.randn(3, 3, 9), torch.randn(3, 3, 8, 8))
    assert_outputs_close(sm(*fresh), reference_forward(model, sm.masks, fresh, {}), atol=1e-5)
