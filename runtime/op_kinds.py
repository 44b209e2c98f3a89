"""The kinds of kernels and the machine rules that follow from the kind: one table.

A kernel's ``op`` names its kind. ``KINDS`` holds one ``OpKind`` row per kind: what it computes, its
SIMD operations per element, whether it computes row by row, moves data across lanes, all-reduces
statistics or skips the tasks that make only zeros. The cost rules (``runtime/cost.py``), both clocks,
the routes (``passes/lower/connect.py``) and the checks read this table; the named sets below are
derived from it. This module is the bottom layer: it imports nothing from ``runtime/``.

    >>> KINDS["softmax"].element_ops, KINDS["softmax"].allreduces_stats
    (5, True)
    >>> sorted(STATS_ALLREDUCE), sorted(ZERO_SKIPPING)
    (['layer_norm', 'softmax'], ['elementwise', 'layout'])
    >>> row_wise("softmax", {"dim": 0}, rank=2), row_wise("sparse_matmul", {"kind": "linear"}, rank=2)
    (False, True)
    >>> op_kind("teleport")
    Traceback (most recent call last):
    ...
    sparsefx.errors.EmulationError: op kind 'teleport' is not a known kind; kinds are sparse_matmul, ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sparsefx.errors import EmulationError

__all__ = [
    "OpKind",
    "KINDS",
    "op_kind",
    "row_wise",
    "ROW_MATMULS",
    "ROW_WISE",
    "MATMULS",
    "REDUCING",
    "STATS_ALLREDUCE",
    "ZERO_SKIPPING",
]

RowRule = Literal["always", "never", "row_matmul", "last_dim"]
"""When a kind computes each row of its result from the same row of its inputs: always, never, when a
sparse matmul's ``attrs["kind"]`` is in ``ROW_MATMULS``, or when ``attrs["dim"]`` is the last dim."""

SkipRule = Literal["never", "zero_result", "no_input_zero_result"]
"""Which tasks a kind leaves out: none, those whose result is all zero, or those that also hear no data."""

ROW_MATMULS: tuple[str, ...] = ("linear", "addmm", "matmul")
"""Sparse matmul ``kind``s whose blocks are rows (a convolution's are whole images)."""


@dataclass(frozen=True)
class OpKind:
    """One op kind and the machine rules that depend on it."""

    name: str
    description: str
    element_ops: int
    """SIMD operations per result element (``cost.ops_per_element`` refines some)."""
    row_wise: RowRule = "never"
    moves_across_lanes: bool = False
    """Its kernels send data across lanes (partial sums, statistics, relayouts): two buses per column."""
    allreduces_stats: bool = False
    """It all-reduces statistics across lanes before it finishes a block."""
    skips_tasks: SkipRule = "never"
    matmul: bool = False
    """A product: weighed and counted by its multiply-accumulates."""

    @property
    def skips_zero_tasks(self) -> bool:
        """Whether it leaves out some tasks that make only zeros (``skips_tasks``)."""
        return self.skips_tasks != "never"


_ROWS = (
    OpKind(
        "sparse_matmul",
        "masked weight x activation: one AXPY per nonzero; CSC slices per PE (linear, conv)",
        1,  # unused: a sparse matmul costs one AXPY per nonzero
        row_wise="row_matmul",
        moves_across_lanes=True,
        matmul=True,
    ),
    OpKind(
        "matmul",
        "activation x activation (attention scores and context)",
        1,  # per multiply-accumulate; ops_per_element multiplies by the contraction length
        moves_across_lanes=True,
        matmul=True,
    ),
    OpKind(
        "elementwise",
        "a function of one or two values or scalars, element by element (add, relu, gelu ...)",
        1,
        row_wise="always",
        skips_tasks="no_input_zero_result",  # zero in, zero out (ReLU, a product; not exp)
    ),
    OpKind("reduce", "sum, mean or max over dims", 1, moves_across_lanes=True),
    OpKind("pool", "windowed max or average over spatial dims", 1, moves_across_lanes=True),
    OpKind(
        "softmax",
        "softmax over one dim",
        5,  # max, subtract, exp, sum, divide
        row_wise="last_dim",
        moves_across_lanes=True,
        allreduces_stats=True,
    ),
    OpKind(
        "layer_norm",
        "layer norm over the trailing dims, with its weight and bias",
        6,  # mean, centre, square, variance, normalize, scale and shift
        row_wise="always",
        moves_across_lanes=True,
        allreduces_stats=True,
    ),
    OpKind("embedding", "rows of a table picked by integer ids", 1, row_wise="always"),  # a copy each
    OpKind(
        "layout",
        "view, reshape, permute, transpose, slice, cat, expand ...: moves data, computes nothing",
        1,  # a copy per element
        moves_across_lanes=True,
        skips_tasks="zero_result",  # zeros moved are zeros
    ),
    OpKind("constant", "a tensor the program holds (position ids, attention masks, buffers)", 0),
)

KINDS: dict[str, OpKind] = {k.name: k for k in _ROWS}
"""Op kind -> its row."""


def op_kind(op: str) -> OpKind:
    """The row of op kind ``op``; an ``EmulationError`` naming the valid kinds if it has none."""
    row = KINDS.get(op)
    if row is None:
        raise EmulationError(f"op kind {op!r} is not a known kind; kinds are {', '.join(KINDS)}")
    return row


def row_wise(op: str, attrs: Mapping[str, Any], rank: int) -> bool:
    """Whether a kernel of kind ``op`` with ``attrs`` and a result of ``rank`` dims computes each row of
    its result from the same row of its inputs."""
    rule = op_kind(op).row_wise
    if rule == "row_matmul":
        return attrs.get("kind") in ROW_MATMULS
    if rule == "last_dim":
        dim = attrs.get("dim", -1)
        return isinstance(dim, int) and dim in (-1, rank - 1)
    return rule == "always"


ROW_WISE = frozenset(k.name for k in _ROWS if k.row_wise == "always")
"""Kinds that always compute row by row (others only by their attrs: ``row_wise``)."""
MATMULS = frozenset(k.name for k in _ROWS if k.matmul)
"""Products, weighed and counted by their multiply-accumulates."""
REDUCING = frozenset(k.name for k in _ROWS if k.moves_across_lanes)
"""Kinds whose kernels move data across lanes (partial sums, statistics, relayouts)."""
STATS_ALLREDUCE = frozenset(k.name for k in _ROWS if k.allreduces_stats)
"""Kinds that all-reduce statistics across lanes before they finish a block."""
ZERO_SKIPPING = frozenset(k.name for k in _ROWS if k.skips_zero_tasks)
"""Kinds whose task on all-zero data makes all zeros and can be left out (``cost.idle_tasks``): an
elementwise op whose result is zero where its inputs are (ReLU, a product; not ``exp``), and a layout
change (zeros moved are zeros). Norms, softmax, reductions and activation products run every task."""

CHAINED_LAYOUTS = ("reshape", "permute", "slice", "select", "index", "expand")
"""Layout functions of one input and no arrays: they compose, and a ``chain`` layout kernel applies a
list of them in order (``passes/lower/fuse_layouts.py``)."""
