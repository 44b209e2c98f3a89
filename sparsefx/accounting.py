"""FLOP and parameter counting: dense versus sparse, per call on given inputs.

Forward FLOPs are 2 x MACs of the matmul-like ops (see ``passes/count_flops.py``); a training
step costs 3 x forward for dense and static sparse models alike; RigL layers cost the average over
an update interval, ``(3 f_s dT + 2 f_s + f_d) / (dT + 1)``. Works on a model built on
``torch.device("meta")``: no weights are allocated and nnz comes from the configured levels, by the
same exact ``keep_count`` rule the masks use (0.9 of 10000 weights keeps 1000)::

    >>> mlp = torch.nn.Sequential(torch.nn.Linear(100, 100))
    >>> r = flops(mlp, torch.randn(4, 100), config=0.9)
    >>> r.dense_forward, r.sparse_forward, r.dense_params, r.sparse_params
    (80000, 8000, 10100, 1100)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import sympy
import torch
from torch import nn

from .compiler import compile, normalize_inputs
from .masks import mask_name
from .model import SparseModel
from .passes.count_flops import CountFlops, mask_nnz
from .passes.manager import PassManager
from .passes.meta import SHAPES, UNCOUNTED
from .passes.shape_prop import PropagateShapes
from .record_inputs import Inputs, record_inputs
from .symbolic import evaluate

__all__ = ["FlopReport", "flops", "TRAIN_FACTOR", "rigl_step_flops", "rigl_intervals"]

TRAIN_FACTOR = 3  # forward + backward (input and weight gradients) = 3 x forward

logger = logging.getLogger("sparsefx")


@dataclass(frozen=True)
class FlopReport:
    """Ints per call on the inputs given; ``forward_expr`` keeps the sympy forms in ``batch``/``seq``.

    ``uncounted`` names the matmul-like nodes (``<graph path>:<node>`` in a submodule graph) that
    could not be costed because shape propagation failed, and ``partial`` says why; the counts
    are then lower bounds. Both are empty when every node was counted.
    """

    dense_forward: int
    sparse_forward: int
    dense_train: int
    sparse_train: int
    dense_params: int
    sparse_params: int
    forward_expr: tuple[sympy.Expr, sympy.Expr] = field(default=(sympy.Integer(0), sympy.Integer(0)))
    uncounted: tuple[str, ...] = ()
    partial: str | None = None

    @property
    def forward_reduction(self) -> float:
        """Dense over sparse forward FLOPs (e.g. 3.0 means 3x fewer)."""
        return self.dense_forward / max(1, self.sparse_forward)

    @property
    def train_reduction(self) -> float:
        return self.dense_train / max(1, self.sparse_train)

    @property
    def param_reduction(self) -> float:
        return self.dense_params / max(1, self.sparse_params)


def flops(
    model: nn.Module,
    example_inputs: Any = None,
    *,
    config: Any = None,
    example_kwargs: Any = None,
    symbolic: bool = False,
) -> FlopReport:
    """FLOPs and parameters of a SparseModel, or of ``model`` compiled with ``config`` (dense if None).

    ``symbolic=True`` also fills ``forward_expr`` with formulas in ``batch`` and ``seq`` (slower).
    """
    args, kwargs = normalize_inputs(example_inputs, example_kwargs)
    if isinstance(model, SparseModel):
        sm = model
    else:
        inputs = (args if args else kwargs) or None
        sm = compile(model, config, inputs, example_kwargs=kwargs if args else None, bind=False)
    if symbolic or (sm is model and (args or kwargs)):
        _recount(sm, args, kwargs, symbolic)
    dense_expr = sympy.Integer(0)
    sparse_expr = sympy.Integer(0)
    dense_fwd = sparse_fwd = 0
    sparse_train = Fraction(0)
    intervals = rigl_intervals(sm.sparsity, sm.plan)
    for _, row, env in sm.flop_rows():
        dense_expr += row.dense
        sparse_expr += row.sparse
        f_d = evaluate(row.dense, env)
        f_s = evaluate(row.sparse, env)
        dense_fwd += f_d
        sparse_fwd += f_s
        interval = intervals.get(row.param) if row.param is not None else None
        sparse_train += rigl_step_flops(f_s, f_d, interval) if interval else TRAIN_FACTOR * f_s
    dense_params, sparse_params = _params(sm)
    uncounted, partial = _uncounted(sm)
    if uncounted:
        logger.warning(
            "sparsefx.flops: the count is partial: %d node(s) could not be costed (%s): %s",
            len(uncounted), ", ".join(uncounted[:5]) + (", ..." if len(uncounted) > 5 else ""), partial,
        )
    return FlopReport(
        dense_fwd,
        sparse_fwd,
        TRAIN_FACTOR * dense_fwd,
        round(sparse_train),
        dense_params,
        sparse_params,
        (sympy.simplify(dense_expr), sympy.simplify(sparse_expr)),
        uncounted,
        partial,
    )


def _uncounted(sm: SparseModel) -> tuple[tuple[str, ...], str | None]:
    """The nodes count-flops could not cost, over every graph, and why shapes were missing."""
    names: list[str] = []
    reasons: list[str] = []
    for path, gm in sm.graphs.items():
        missing = gm.meta.get(UNCOUNTED, ())
        if not missing:
            continue
        names += [f"{path}:{name}" if path else name for name in missing]
        shapes = gm.meta.get(SHAPES, "not propagated")
        reasons.append(f"graph {path!r}: shapes {shapes}" if path else f"shapes {shapes}")
    return tuple(names), "; ".join(reasons) or None


def rigl_step_flops(f_s: int, f_d: int, interval: int) -> Fraction:
    """Training FLOPs per step of a RigL layer, averaged over an update interval of ``interval`` steps.

    ``(3 f_s dT + 2 f_s + f_d) / (dT + 1)``: an update step also needs the dense weight gradient.

    >>> rigl_step_flops(10, 100, 100)
    Fraction(3120, 101)
    """
    return Fraction(3 * f_s * interval + 2 * f_s + f_d, interval + 1)


def rigl_intervals(sparsity: Any, plan: Any = None) -> dict[str, int]:
    """``{param name: update interval}`` of every parameter a RigL algorithm (or Group member) owns.

    An algorithm not bound to a model yet owns the sparse parameters ``plan`` gives its group.
    """
    algorithms = getattr(sparsity, "algorithms", None) or ([sparsity] if sparsity is not None else [])
    out: dict[str, int] = {}
    for index, alg in enumerate(algorithms):
        if not getattr(alg, "needs_dense_grad", False):
            continue
        schedule = alg.update_schedule
        if schedule.freq is not None:
            interval = schedule.freq
        else:
            steps = sorted(schedule.steps or ())
            interval = max(1, round((steps[-1] - steps[0]) / max(1, len(steps) - 1))) if len(steps) > 1 else 1
        planned = plan.sparse.values() if plan is not None else ()
        names = list(alg.params) or [d.name for d in planned if d.group == index]
        out.update({name: interval for name in names})
    return out


def _params(sm: SparseModel) -> tuple[int, int]:
    """All parameters, and the same with pruned entries of sparse weights taken out."""
    dense = sum(p.numel() for p in sm.parameters())
    pruned = 0
    for name, decision in sm.plan.sparse.items():
        mask = sm.get_buffer(mask_name(name))
        pruned += mask.numel() - mask_nnz(mask, decision)
    return dense, dense - pruned


def _recount(sm: SparseModel, args: tuple, kwargs: dict, symbolic: bool) -> None:
    """Re-run shape propagation and counting on new inputs (graph structure is untouched)."""
    if not (args or kwargs):
        inputs = sm.example_inputs
    elif "" in sm.graphs:
        inputs = {"": (args, kwargs)}
    else:
        inputs = _record_graph_inputs(sm, args, kwargs)
    for path, gm in sm.graphs.items():
        PassManager([PropagateShapes(inputs.get(path), symbolic=symbolic), CountFlops()], label=path)(gm)


def _record_graph_inputs(sm: SparseModel, args: tuple, kwargs: dict) -> dict[str, Inputs]:
    """Run ``sm`` once on new inputs and keep the first inputs each captured submodule received."""
    with record_inputs({path: sm.get_submodule(path) for path in sm.graphs}) as seen, torch.no_grad():
        sm(*args, **kwargs)
    return seen
