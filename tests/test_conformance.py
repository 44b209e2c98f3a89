"""Lowering conformance: every op the lowering rules claim gives eager's numbers on the mesh.

For each sample of ``op_samples.SAMPLES`` (non-default arguments, broadcast shapes, int and bool values,
two dtypes), the model is captured both ways (``fx`` and ``export``), lowered (pipelined or streaming on
a small mesh), run (fast or reference executor) on fresh inputs and compared, output by output, with
the compiled model and the original module (whose pruned weights compile zeroed). The (capture, mode,
executor, dtype) of each of a sample's two runs are drawn with a fixed seed so that every sample runs
both captures, both modes and both executors. Every op in ``RULES`` must have a sample, and every op a
sample claims must reach its rule under both captures (or be listed in ``ONE_PATH`` with the reason).
"""

from __future__ import annotations

import contextlib
import copy
import random
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from op_samples import ONE_PATH, SAMPLES, Sample
from torch import nn
from torch.utils import _pytree as pytree

import sparsefx
from sparsefx.errors import LoweringError
from sparsefx.passes.lower.arguments import bind, method_target
from sparsefx.passes.lower.rules import RULES

SEED = 22
MESH = (48, 4)  # (width, height): pipelined mode needs a column per kernel
TOLERANCE = {  # (rtol, atol) by dtype; integer and bool outputs must be equal
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-9, 1e-10),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (5e-3, 5e-3),
}


def plan(sample: Sample) -> list[tuple[str, str, str, torch.dtype]]:
    """The sample's two runs: each capture once (the one it takes twice if it takes one), the two modes
    and the two executors in a seeded order, and its dtypes in a seeded order."""
    rng = random.Random(f"{SEED}:{sample.name}")
    captures = [c for c in ("fx", "export") if c not in sample.not_captured]
    captures = captures * (2 // len(captures))
    modes, executors, dtypes = ["pipelined", "streaming"], ["fast", "reference"], list(sample.dtypes)
    for order in (modes, executors, dtypes):
        rng.shuffle(order)
    return [(captures[i], modes[i], executors[i], dtypes[i % len(dtypes)]) for i in range(2)]


@contextlib.contextmanager
def rules_reached() -> Iterator[set[str]]:
    """The names of the rules that lowering calls inside the block (the real rules still run)."""
    seen: set[str] = set()
    originals = dict(RULES)

    def recording(name: str) -> Any:
        def rule(b: Any, c: Any) -> Any:
            seen.add(name)
            return originals[name](b, c)

        return rule

    RULES.update({name: recording(name) for name in originals})
    try:
        yield seen
    finally:
        RULES.update(originals)


def _inputs(sample: Sample, dtype: torch.dtype, seed: int) -> tuple:
    return sample.inputs(torch.Generator().manual_seed(seed), dtype)


def _model(sample: Sample, dtype: torch.dtype) -> nn.Module:
    model = sample.build()
    if dtype.is_floating_point:
        model = model.to(dtype)
    return model.eval()


def _assert_close(got: Any, want: Any, where: str) -> None:
    got_leaves, want_leaves = pytree.tree_leaves(got), pytree.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves), (
        f"{where}: {len(got_leaves)} outputs, eager has {len(want_leaves)}"
    )
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        rtol, atol = TOLERANCE.get(w.dtype, (0, 0))
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=lambda m, i=i: f"{where}, output {i}: {m}")


def lower_and_compare(sample: Sample, capture: str, mode: str, executor: str, dtype: torch.dtype) -> set[str]:
    """One run of ``sample``: the rules it reached; fails when an output differs from eager."""
    model = _model(sample, dtype)
    example, fresh = _inputs(sample, dtype, 1), _inputs(sample, dtype, 2)
    with warnings.catch_warnings(), rules_reached() as reached:
        warnings.simplefilter("ignore")
        sm = sparsefx.compile(model, 0.5, example, capture_method=capture)
        program = sparsefx.lower(sm, example, mesh=MESH, mode=mode)
    assert program.meta["capture"] == capture
    where = f"{sample.name} ({capture}, {mode}, {executor}, {dtype})"
    outputs = sparsefx.run(program, fresh, executor=executor).outputs
    with torch.no_grad():
        _assert_close(outputs, sm.eval()(*fresh), f"{where} against the compiled model")
        _assert_close(outputs, model(*fresh), f"{where} against the original module")
    return reached


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.name)
def test_sample_lowers_to_eager_numbers(sample: Sample) -> None:
    reached = {}
    for capture, mode, executor, dtype in plan(sample):
        reached.setdefault(capture, set()).update(lower_and_compare(sample, capture, mode, executor, dtype))
    for op in sample.ops:
        paths = sorted(c for c, ops in reached.items() if op in ops)
        assert paths, f"{sample.name} claims {op!r}, but no capture reached its rule ({reached})"
        assert len(paths) == 2 or op in ONE_PATH or sample.not_captured, (
            f"{sample.name}: {op!r} reached its rule only under {paths}; list it in ONE_PATH with the reason"
        )
        assert len(paths) == 1 or op not in ONE_PATH, (
            f"{op!r} reached its rule under both captures: not ONE_PATH"
        )


def test_every_rule_has_a_sample() -> None:
    claimed = {op for s in SAMPLES for op in s.ops}
    missing = sorted(set(RULES) - claimed)
    assert not missing, f"lowering rules without a conformance sample in tests/op_samples.py: {missing}"
    assert not sorted(claimed - set(RULES)), "samples claim ops that have no rule"
    assert set(ONE_PATH) <= set(RULES)


def test_the_plan_covers_both_captures_modes_and_executors() -> None:
    for sample in SAMPLES:
        runs = plan(sample)
        assert {m for _, m, _, _ in runs} == {"pipelined", "streaming"}, sample.name
        assert {e for _, _, e, _ in runs} == {"fast", "reference"}, sample.name
        assert {c for c, _, _, _ in runs} == {"fx", "export"} - set(sample.not_captured), sample.name
    dtypes = {d for s in SAMPLES for *_, d in plan(s)}
    assert {torch.float32, torch.float64, torch.bfloat16, torch.float16} <= dtypes


class _Calls(nn.Module):
    """A module whose forward is ``fn(self, x)``: one op under test."""

    def __init__(self, fn: Any, **children: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        for name, child in children.items():
            self.add_module(name, child)

    def forward(self, x: torch.Tensor) -> Any:
        return self.fn(self, x)


UNKNOWN = [  # (id, module, input shape, capture, the error must name)
    ("function", _Calls(lambda m, x: torch.cumsum(x, 1)), (2, 3), "fx", "'cumsum'"),
    ("aten-op", _Calls(lambda m, x: torch.cumsum(x, 1)), (2, 3), "export", "'cumsum'"),
    ("aten-call", _Calls(lambda m, x: torch.ops.aten.logit.default(x, 1e-3)), (2, 3), "fx", "'logit'"),
    ("module", _Calls(lambda m, x: m.act(x), act=nn.PReLU()), (2, 3), "fx", "PReLU"),
    ("module-aten", _Calls(lambda m, x: m.act(x), act=nn.PReLU()), (2, 3), "export", "'prelu'"),
]


@pytest.mark.parametrize(
    ("module", "shape", "capture", "name"), [u[1:] for u in UNKNOWN], ids=[u[0] for u in UNKNOWN]
)
def test_an_op_without_a_rule_is_a_lowering_error_naming_it(
    module: nn.Module, shape: tuple, capture: str, name: str
) -> None:
    x = torch.randn(shape)
    sm = sparsefx.compile(module.eval(), 0.5, (x,), capture_method=capture)
    with pytest.raises(LoweringError, match=f"{name}.*no lowering rule|no lowering rule.*{name}"):
        sparsefx.lower(sm, x, mesh=(8, 4))


def _qkv_gqa(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    q, kv = x, x[:, :2]  # 4 query heads, 2 key/value heads
    return F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)


REFUSED = [  # (id, module, example input, captures, the error must say): arguments a rule cannot honour
    ("softmax-no-dim", _Calls(lambda m, x: F.softmax(x)), torch.randn(2, 3), ("fx",), "without dim"),
    ("active-dropout", _Calls(lambda m, x: F.dropout(x, 0.5)), torch.randn(2, 3), ("fx", "export"),
     "dropout is active"),
    ("embedding-max-norm", _Calls(lambda m, x: m.e(x), e=nn.Embedding(5, 3, max_norm=1.0)),
     torch.tensor([[1, 4, 0]]), ("fx",), "max_norm=1.0"),
    ("embedding-renorm", _Calls(lambda m, x: m.e(x), e=nn.Embedding(5, 3, max_norm=1.0)),
     torch.tensor([[1, 4, 0]]), ("export",), "embedding_renorm"),
    ("batch-statistics", _Calls(lambda m, x: m.bn(x), bn=nn.BatchNorm1d(3, track_running_stats=False)),
     torch.randn(4, 3), ("fx", "export"), "batch's own statistics"),
    ("grouped-query-attention", _Calls(_qkv_gqa), torch.randn(1, 4, 3, 2), ("fx", "export"), "grouped-query"),
    ("conv-same-even-kernel", _Calls(lambda m, x: m.c(x), c=nn.Conv2d(2, 2, 2, padding="same")),
     torch.randn(1, 2, 5, 5), ("fx", "export"), "padding='same'"),
    ("avg-pool-divisor", _Calls(lambda m, x: F.avg_pool2d(x, 2, divisor_override=3)), torch.randn(1, 2, 4, 4),
     ("fx", "export"), "divisor_override"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("module", "x", "captures", "why"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_arguments_a_rule_cannot_honour_are_refused_by_name(
    module: nn.Module, x: torch.Tensor, captures: tuple[str, ...], why: str
) -> None:
    for capture in captures:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sm = sparsefx.compile(copy.deepcopy(module).eval(), 0.5, (x,), capture_method=capture)
            with pytest.raises(LoweringError, match=why):
                sparsefx.lower(sm, x, mesh=(8, 4))


def test_arguments_are_read_by_name_whatever_the_spelling() -> None:
    """``F.batch_norm`` puts the running statistics before the weight, aten and ``torch.batch_norm`` after."""
    x, (mean, var, weight, bias) = torch.randn(2, 3), (torch.randn(3) for _ in range(4))
    spellings = [
        bind(F.batch_norm, (x, mean, var, weight, bias, False, 0.1, 1e-3), {}),
        bind(torch.ops.aten.batch_norm.default, (x, weight, bias, mean, var, False, 0.1, 1e-3, False), {}),
        bind(torch.batch_norm, (x, weight, bias, mean, var, False, 0.1, 1e-3, False), {}),
    ]
    for bound in spellings:
        assert bound["running_mean"] is mean and bound["weight"] is weight and bound["eps"] == 1e-3
    assert bind(torch.ops.aten.sum.default, (x,), {"dtype": torch.float64}) == {
        "input": x,
        "dtype": torch.float64,
    }
    assert bind(torch.sum, (x, 1), {})["dim"] == 1
    assert bind(torch.ops.aten.amax.default, (x,), {})["dim"] == []
    ids = torch.tensor([0, 2])
    assert bind(torch.ops.aten.embedding.default, (x, ids), {})["indices"] is ids
    assert bind(F.embedding, (ids, x), {})["weight"] is x
    where = bind(method_target("where"), (x, x > 0, 0.0), {}, method=True)  # x.where(c, y): where(c, x, y)
    assert where["input"] is x and where["other"] == 0.0 and where["condition"].dtype == torch.bool
    assert bind(torch.concatenate, ([x, x],), {"axis": 1})["dim"] == 1
