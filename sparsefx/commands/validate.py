"""``sparsefx validate``: resolve a config against a model built on the meta device (no weights).

    $ sparsefx validate 0.9 --model mlp

It prints the sparse and the dense parameters, a summary, and with ``--log-level debug`` every
decision with its reason::

    >>> from sparsefx.config import load_config
    >>> from sparsefx.sparse.select import resolve_plan
    >>> _plan_summary(resolve_plan(load_config(0.5), torch.nn.Linear(4, 4)))
    '1 sparse / 1 dense parameters; selected params 50.0% sparse (16 entries); ...'
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from sparsefx.commands.args import model_args
from sparsefx.commands.tables import make_table

if TYPE_CHECKING:
    from rich.table import Table

    from sparsefx.config import ParamDecision, SparsityConfig, SparsityPlan

__all__ = ["add_parser", "cmd_validate"]

logger = logging.getLogger("sparsefx")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """Register ``validate CONFIG --model SPEC [--input-shape DIMS] [--batch N]``."""
    parser = sub.add_parser(
        "validate",
        parents=[common],
        help="resolve a config against a model without allocating weights",
        description="Resolve CONFIG against MODEL built on the meta device: which parameters get which "
        "sparsity, and why the others stay dense (no weights are allocated).",
    )
    parser.add_argument("config", metavar="CONFIG", help="YAML file, YAML text or a float like 0.9")
    model_args(parser)
    parser.set_defaults(handler=cmd_validate)
    return parser


def cmd_validate(args: argparse.Namespace) -> int:
    """Resolve the config against the model built on the meta device and print the plan."""
    from sparsefx.config import load_config
    from sparsefx.models.registry import build_model
    from sparsefx.report import make_console
    from sparsefx.sparse.select import resolve_plan

    cfg = load_config(args.config)
    logger.info("config: %s grammar, %d group(s)", cfg.grammar, len(cfg.groups))
    spec = build_model(args.model, input_shape=args.input_shape, batch=args.batch, device="meta")
    logger.info("built %s on the meta device (no weights allocated)", spec.name)
    plan = resolve_plan(cfg, spec.model)
    console = make_console()
    console.print(f"[bold]{spec.name}[/]: {len(plan)} parameters, config grammar {cfg.grammar}")
    console.print(_sparse_table(plan, cfg))
    console.print(_dense_table(plan))
    console.print(_plan_summary(plan))
    if logger.isEnabledFor(logging.DEBUG):
        console.print(_decisions_table(plan))
    return 0


def _sparse_table(plan: SparsityPlan, cfg: SparsityConfig) -> Table:
    """The sparse parameters; the group column only when the config has more than one group."""
    groups = ("group",) if len(cfg.groups) > 1 else ()
    table = make_table("sparse parameters", "parameter", "shape", "algorithm", "sparsity", "init", *groups)
    for d in plan.sparse.values():
        group = (cfg.groups[d.group].path if d.group is not None else "-",) if groups else ()
        table.add_row(d.name, str(d.shape), d.algorithm or "-", f"{d.sparsity:.1%}", _init(d), *group)
    return table


def _dense_table(plan: SparsityPlan) -> Table:
    """The dense parameters and why each stays dense."""
    table = make_table("dense parameters", "parameter", "shape", "reason")
    for d in plan.dense.values():
        table.add_row(d.name, str(d.shape), d.reason)
    return table


def _decisions_table(plan: SparsityPlan) -> Table:
    """Every parameter's decision with its reason (``--log-level debug``)."""
    table = make_table("every decision", "parameter", "decision", "reason")
    for d in plan:
        table.add_row(d.name, f"sparse {d.sparsity:.1%}" if d.sparse else "dense", d.reason)
    return table


def _plan_summary(plan: SparsityPlan) -> str:
    """``3 sparse / 3 dense parameters; selected params 90.0% sparse; total params 85,002 -> 8,968``."""
    from sparsefx.sparse.init import keep_count

    numels = {d.name: _numel(d.shape) for d in plan}
    selected = sum(numels[name] for name in plan.sparse)
    pruned = sum(numels[n] - keep_count(numels[n], d.sparsity) for n, d in plan.sparse.items())
    total = sum(numels.values())
    level = pruned / selected if selected else 0.0
    return (
        f"{len(plan.sparse)} sparse / {len(plan.dense)} dense parameters; selected params {level:.1%} "
        f"sparse ({selected:,} entries); total params {total:,} dense -> {total - pruned:,} sparse "
        f"({total / max(1, total - pruned):.2f}x fewer)"
    )


def _init(d: ParamDecision) -> str:
    method = d.init_method
    if method is None or isinstance(method, str):
        return method or "-"
    return getattr(method, "__qualname__", type(method).__name__)


def _numel(shape: tuple[int, ...]) -> int:
    size = 1
    for dim in shape:
        size *= dim
    return size
