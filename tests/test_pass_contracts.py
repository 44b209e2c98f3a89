"""Pass contracts: declared meta keys, requires/ensures checks, partial FLOP counts, generic manager."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensor

import sparsefx
from sparsefx import accounting
from sparsefx.compiler import resolve_plan
from sparsefx.config import load_config
from sparsefx.errors import PassError
from sparsefx.passes import PassManager, PassResult
from sparsefx.passes import meta as keys
from sparsefx.passes.count_flops import CountFlops
from sparsefx.passes.insert_masks import InsertMasks
from sparsefx.passes.rewrite_sparse_ops import RewriteSparseOps
from sparsefx.passes.select_params import SelectSparseParams
from sparsefx.passes.shape_prop import PropagateShapes
from sparsefx.report import flop_table


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def no_shapes(x: torch.Tensor) -> torch.Tensor:
    """Runs on real tensors only: every shape-propagation mode fails here (not an input error)."""
    if x.device.type == "meta" or isinstance(x, FakeTensor):
        raise NotImplementedError("no shape rule for no_shapes")
    return x * 2


torch.fx.wrap("no_shapes")


class Opaque(TwoLayer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(no_shapes(torch.relu(self.fc1(x))))


def _plan(model: nn.Module) -> Any:
    return resolve_plan(load_config(0.5), model)


def test_every_key_is_declared_once() -> None:
    values = [getattr(keys, name) for name in keys.__all__ if name != "KEYS"]
    assert sorted(values) == sorted(keys.KEYS) and len(set(values)) == len(values)
    assert all(v.startswith("sparsefx.") for v in values)


def test_builtin_passes_declare_contracts() -> None:
    plan = _plan(TwoLayer())
    assert PropagateShapes(None).ensures == (keys.SHAPES,)
    assert SelectSparseParams(plan).ensures == (keys.SELECTED,)
    assert InsertMasks().requires == RewriteSparseOps().requires == (keys.SELECTED,)
    assert CountFlops().requires == (keys.SHAPES,)
    assert set(CountFlops().ensures) == {keys.FLOPS, keys.UNCOUNTED}


def test_missing_requirement_names_pass_key_and_provider() -> None:
    plan = _plan(TwoLayer())
    pm = PassManager([InsertMasks(), SelectSparseParams(plan)])
    with pytest.raises(PassError) as info:
        pm(fx.symbolic_trace(TwoLayer()))
    msg = str(info.value)
    assert "insert-masks requires meta key 'sparsefx.selected'" in msg
    assert "select-sparse-params ensures it" in msg and "passes run so far: none" in msg


def test_count_flops_without_shapes_fails_loudly() -> None:
    with pytest.raises(PassError, match="count-flops requires meta key 'sparsefx.shapes'.*no pass in this"):
        PassManager([CountFlops()])(fx.symbolic_trace(TwoLayer()))


def test_unkept_promise_is_a_pass_error() -> None:
    @dataclass(frozen=True)
    class Liar:
        name: str = "liar"
        ensures: ClassVar[tuple[str, ...]] = (keys.SELECTED,)

        def __call__(self, gm: fx.GraphModule) -> PassResult:
            return PassResult(gm, False)

    with pytest.raises(PassError, match="liar did not set sparsefx.selected"):
        PassManager([Liar()])(fx.symbolic_trace(TwoLayer()))


def test_manager_is_generic_over_the_representation() -> None:
    class Program:
        def __init__(self, ops: list[str]) -> None:
            self.ops = ops
            self.meta: dict[str, Any] = {}

    @dataclass(frozen=True)
    class Append:
        op: str
        name: str = "append"
        requires: ClassVar[tuple[str, ...]] = ()
        ensures: ClassVar[tuple[str, ...]] = ("lowered",)

        def __call__(self, prog: Program) -> PassResult:
            out = Program([*prog.ops, self.op])
            out.meta["lowered"] = True
            return PassResult(out, True)  # type: ignore[arg-type]

    seen: list[Program] = []
    steps = [Append("a"), Append("b")]
    pm = PassManager(steps, debug=True, verify=seen.append, text=lambda p: " ".join(p.ops))
    out = pm(Program([]))
    assert out.modified and out.graph_module.ops == ["a", "b"]
    assert pm.history == [("append", "a"), ("append", "a b")] and len(seen) == 2


def test_fx_history_is_still_graph_code() -> None:
    gm = fx.symbolic_trace(TwoLayer())
    pm = PassManager([SelectSparseParams(_plan(TwoLayer()))])
    pm(gm)
    assert pm.history == [("select-sparse-params", gm.code)]


def test_recount_runs_under_a_pass_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    sm = sparsefx.compile(TwoLayer(), 0.5, (torch.randn(2, 8),))
    made: list[PassManager] = []

    class Recording(PassManager):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(accounting, "PassManager", Recording)
    report = sparsefx.flops(sm, torch.randn(3, 8))
    assert [name for name, _ in made[0].history] == ["propagate-shapes", "count-flops"]
    assert report.dense_forward == 2 * 3 * (8 * 16 + 16 * 4) and report.uncounted == ()


def test_failed_shapes_make_a_partial_count(caplog: pytest.LogCaptureFixture) -> None:
    model = Opaque()
    x = torch.randn(2, 8)
    sm = sparsefx.compile(model, 0.5, (x,))
    gm = sm.graphs[""]
    assert gm.meta[keys.SHAPES].startswith("failed: NotImplementedError")
    assert keys.INPUT_ERROR not in gm.meta
    (fc2,) = gm.meta[keys.UNCOUNTED]  # fc2's call, rewritten to a masked op
    assert fc2.startswith("masked_linear")
    with caplog.at_level(logging.WARNING, logger="sparsefx"):
        report = sparsefx.flops(sm)
    assert report.uncounted == (fc2,)
    assert report.partial is not None and "NotImplementedError" in report.partial
    assert report.dense_forward == 2 * 2 * 8 * 16  # fc1 only
    assert any(
        "partial" in r.message and fc2 in r.message and "NotImplementedError" in r.message
        for r in caplog.records
    )


def test_full_count_is_not_partial() -> None:
    report = sparsefx.flops(TwoLayer(), torch.randn(2, 8), config=0.5)
    assert report.uncounted == () and report.partial is None


def test_flop_table_shows_a_partial_count() -> None:
    from rich.console import Console

    report = sparsefx.FlopReport(1, 1, 3, 3, 1, 1, uncounted=("fc2",), partial="shapes failed: X")
    console = Console(width=200, record=True)
    console.print(flop_table(report))
    text = console.export_text()
    assert "partial" in text and "fc2" in text


def test_cli_inspect_shows_a_partial_count() -> None:
    from types import SimpleNamespace

    from rich.console import Console

    from sparsefx.commands import inspect

    x = torch.randn(2, 8)
    sm = sparsefx.compile(Opaque(), 0.5, (x,))
    data = inspect.inspect_data(sm, SimpleNamespace(name="opaque", args=(x,)))  # type: ignore[arg-type]
    assert len(data["uncounted"]) == 1 and "NotImplementedError" in data["partial"]
    console = Console(width=300, record=True)
    inspect._print_inspect(console, sm, data, show_graph=False)
    text = console.export_text()
    assert "partial: 1 node(s) not counted" in text and data["uncounted"][0] in text
