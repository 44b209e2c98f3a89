"""One op-kind table (``runtime/op_kinds.py``): every kind the lowering emits has a row, the named sets
and the old tables agree with the rows, and a kind missing from it is an ``EmulationError``."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_import_layers import import_graph

from sparsefx.errors import EmulationError
from sparsefx.passes.lower import blocks, connect
from sparsefx.runtime import cost, op_kinds, program, timeline
from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
from sparsefx.runtime.op_kinds import KINDS, OpKind, op_kind, row_wise
from sparsefx.runtime.program import Kernel, ProgramData, Region
from sparsefx.runtime.semantics import RULES

LOWER = Path(__file__).resolve().parent.parent / "passes" / "lower"


def _emitted_kinds() -> set[str]:
    """The op kinds written as literals in the lowering's ``emit(name, kind, ...)`` calls."""
    kinds = set()
    for path in LOWER.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "emit":
                op = node.args[1] if len(node.args) > 1 else None
                if isinstance(op, ast.Constant) and isinstance(op.value, str):
                    kinds.add(op.value)
    return kinds


def test_every_kind_the_lowering_emits_or_the_evaluator_knows_has_a_row() -> None:
    emitted = _emitted_kinds()
    assert {"sparse_matmul", "matmul", "elementwise", "softmax", "layout", "constant"} <= emitted
    assert emitted <= set(KINDS)
    assert set(RULES) == set(KINDS)
    assert all(name == row.name for name, row in KINDS.items())


def _names(has: Callable[[OpKind], bool]) -> frozenset[str]:
    return frozenset(k.name for k in KINDS.values() if has(k))


def test_the_named_sets_and_the_old_tables_are_the_rows() -> None:
    assert _names(lambda k: k.moves_across_lanes) == op_kinds.REDUCING
    assert _names(lambda k: k.allreduces_stats) == op_kinds.STATS_ALLREDUCE
    assert _names(lambda k: k.skips_tasks != "never") == op_kinds.ZERO_SKIPPING
    assert _names(lambda k: k.row_wise == "always") == op_kinds.ROW_WISE
    assert _names(lambda k: k.matmul) == op_kinds.MATMULS
    # the facts the tables held before they were one table
    assert sorted(op_kinds.STATS_ALLREDUCE) == ["layer_norm", "softmax"]
    assert sorted(op_kinds.ZERO_SKIPPING) == ["elementwise", "layout"]
    assert sorted(op_kinds.MATMULS) == ["matmul", "sparse_matmul"]
    assert set(KINDS) - op_kinds.REDUCING == {"elementwise", "embedding", "constant"}
    # the names other modules and tests import
    assert {k.name: k.description for k in KINDS.values()} == program.OPS
    assert {k.name: k.element_ops for k in KINDS.values() if k.name != "sparse_matmul"} == cost.ELEMENT_OPS
    assert cost.ZERO_SKIPPING is op_kinds.ZERO_SKIPPING
    assert timeline.REDUCING_STATS is op_kinds.STATS_ALLREDUCE
    assert connect.REDUCING is op_kinds.REDUCING
    assert blocks.ROWWISE == op_kinds.ROW_MATMULS == ("linear", "addmm", "matmul")


@pytest.mark.parametrize(
    ("op", "attrs", "rank", "want"),
    [
        ("sparse_matmul", {"kind": "linear"}, 2, True),
        ("sparse_matmul", {"kind": "conv2d"}, 4, False),
        ("softmax", {"dim": -1}, 3, True),
        ("softmax", {"dim": 2}, 3, True),
        ("softmax", {"dim": 1}, 3, False),
        ("softmax", {}, 2, True),
        ("elementwise", {}, 2, True),
        ("layer_norm", {}, 2, True),
        ("embedding", {}, 2, True),
        ("matmul", {}, 2, False),
        ("reduce", {}, 2, False),
        ("layout", {}, 2, False),
        ("constant", {}, 2, False),
    ],
)
def test_row_wise_follows_the_kinds_rule(op: str, attrs: dict, rank: int, want: bool) -> None:
    assert row_wise(op, attrs, rank) is want


def test_a_kind_missing_from_the_table_is_an_emulation_error_where_it_is_read() -> None:
    with pytest.raises(
        EmulationError, match="op kind 'teleport' is not a known kind; kinds are sparse_matmul, "
    ):
        op_kind("teleport")
    p = ProgramData(MeshSpec(4, 4), HardwareSpec(), "pipelined", "block")
    k = Kernel("k", "teleport", Region(0, 0, 1, 1), (), (2, 3), "float32")
    p.kernels.append(k)
    heard = torch.zeros(1, 3, dtype=torch.bool)
    for read in (
        lambda: cost.row_streaming_op(k),
        lambda: cost.block_rows(k),
        lambda: cost.ops_per_element(p, k),
        lambda: cost.idle_tasks("teleport", heard, heard),
    ):
        with pytest.raises(EmulationError, match="'teleport'"):
            read()


def test_the_table_is_the_bottom_layer() -> None:
    deps = import_graph(lazy=True)["sparsefx.runtime.op_kinds"]
    assert not {d for d in deps if d.startswith("sparsefx.runtime")}, deps
