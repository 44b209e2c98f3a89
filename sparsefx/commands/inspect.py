"""``sparsefx inspect``: a compiled model's rewritten graph with FLOPs, or a program file's summary.

    $ sparsefx inspect --model gpt-tiny --config sparsity.yaml --format json
    $ sparsefx inspect model.sfxp [--dot model.dot] [--png mesh.png] [--heat nnz|sram] [--all]

Every node that reads a weight or is counted for FLOPs is one row::

    >>> from types import SimpleNamespace
    >>> x = torch.ones(2, 8)
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 4)), 0.5, (x,))
    >>> data = inspect_data(sm, SimpleNamespace(name="linear", args=(x,)))
    >>> [(r["op"], r["param"], r["dense_flops"], r["sparse_flops"]) for r in data["rows"]]
    [('masked_linear', '0.weight', 128, 64)]
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import TYPE_CHECKING, Any

import sparsefx
from sparsefx.commands.args import model_args
from sparsefx.commands.tables import make_table
from sparsefx.errors import ConfigError

if TYPE_CHECKING:
    import rich.console
    from rich.table import Table

    from sparsefx.model import SparseModel
    from sparsefx.models.registry import ModelSpec

__all__ = ["add_parser", "cmd_inspect", "inspect_data"]

logger = logging.getLogger("sparsefx")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """Register ``inspect --model SPEC [--config CONFIG] [--format table|json] [--graph]``."""
    parser = sub.add_parser(
        "inspect",
        parents=[common],
        help="compile a model and show its rewritten graph with FLOPs",
        description="Compile MODEL with CONFIG on its example inputs and show every node that reads a "
        "weight or is counted for FLOPs.",
    )
    parser.add_argument("program", nargs="?", help="a program file (.sfxp) to summarize instead of a model")
    model_args(parser, required=False)
    parser.add_argument("--config", help="YAML file, YAML text or a float; omit for the dense model")
    parser.add_argument("--dot", metavar="FILE", help="program: write a Graphviz DOT of kernels and routes")
    parser.add_argument("--png", metavar="FILE", help="program: draw the mesh (needs the plot extra)")
    parser.add_argument("--heat", choices=("nnz", "sram"), default="nnz", help="program: --png heatmap")
    parser.add_argument("--all", action="store_true", help="program: list every kernel (default: 40)")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    parser.add_argument("--graph", action="store_true", help="also print the final graph code")
    parser.set_defaults(handler=cmd_inspect)
    return parser


def cmd_inspect(args: argparse.Namespace) -> int:
    """Compile on the example inputs and print the graph rows, totals and sparsity as a table or JSON."""
    if args.program is not None:
        return _inspect_program(args)
    if args.model is None:
        raise ConfigError("inspect needs --model SPEC (a model to compile) or a program file (.sfxp)")
    from sparsefx.config import load_config
    from sparsefx.models.registry import build_model
    from sparsefx.report import make_console

    cfg = load_config(args.config) if args.config is not None else None
    spec = build_model(args.model, input_shape=args.input_shape, batch=args.batch, device="cpu")
    if not spec.args and not spec.kwargs:
        raise ConfigError(f"model {spec.name!r} has no example inputs; pass --input-shape")
    sm = sparsefx.compile(spec.model, cfg, spec.args, example_kwargs=spec.kwargs)
    logger.info("captured %s with %s: %s", spec.name, sm.capture_method, " | ".join(sm.capture_log) or "ok")
    data = inspect_data(sm, spec)
    if args.format == "json":
        if args.graph:
            data["graph"] = sm.final_code()
        print(json.dumps(data, indent=2))
        return 0
    _print_inspect(make_console(), sm, data, show_graph=args.graph)
    return 0


def inspect_data(sm: SparseModel, spec: ModelSpec) -> dict[str, Any]:
    """Rows, totals, FLOP formulas and capture notes of a compiled model, as plain JSON-able data."""
    import torch

    report = sparsefx.flops(sm, symbolic=True)
    params = sm.sparsity_report()
    rows = _graph_rows(sm, {r.name: r.actual for r in params})
    symbols: dict[str, int] = {}
    for _, _, env in sm.flop_rows():
        symbols.update({str(k): int(v) for k, v in env.items()})
    return {
        "model": spec.name,
        "capture_method": sm.capture_method,
        "capture_log": list(sm.capture_log),
        "inputs": [list(t.shape) for t in spec.args if isinstance(t, torch.Tensor)],
        "rows": rows,
        "totals": {
            "dense_forward": report.dense_forward,
            "sparse_forward": report.sparse_forward,
            "dense_train": report.dense_train,
            "sparse_train": report.sparse_train,
            "dense_params": report.dense_params,
            "sparse_params": report.sparse_params,
        },
        "reductions": {
            "forward": report.forward_reduction,
            "train": report.train_reduction,
            "params": report.param_reduction,
        },
        "expressions": {
            "dense_forward": str(report.forward_expr[0]),
            "sparse_forward": str(report.forward_expr[1]),
        },
        "symbols": symbols,
        "uncounted": list(report.uncounted),
        "partial": report.partial,
        "sparsity": [
            {"name": r.name, "target": r.target, "actual": r.actual, "nnz": r.nnz, "numel": r.numel}
            for r in params
        ],
    }


def _graph_rows(sm: SparseModel, actual: dict[str, float]) -> list[dict[str, Any]]:
    """One row per graph node that reads a parameter or is counted for FLOPs, in graph order.

    Counted nodes come from ``sm.flop_rows()``; a node that only reads a weight (a norm's, a bias)
    is found with ``weight_read``. ``actual`` is each sparse parameter's actual sparsity.
    """
    from sparsefx.passes.count_flops import op_name, weight_read
    from sparsefx.symbolic import evaluate

    counted = {(path, row.node): (row, env) for path, row, env in sm.flop_rows()}
    rows = []
    for path, gm in sm.graphs.items():
        prefix = f"{path}." if path else ""
        for node in gm.graph.nodes:
            row, env = counted.get((path, node.name), (None, {}))
            local = weight_read(gm, node) if row is None else None
            param = row.param if row is not None else (prefix + local if local else None)
            if row is None and param is None:
                continue
            decision = sm.plan[param] if param is not None and param in sm.plan else None
            sparse = decision is not None and decision.sparse
            rows.append(
                {
                    "node": f"{path}:{node.name}" if path else node.name,
                    "op": row.op if row is not None else op_name(node),
                    "param": param,
                    "sparse": sparse,
                    "shape": list(sm.get_parameter(param).shape) if param is not None else None,
                    "target": decision.sparsity if sparse else 0.0,
                    "actual": actual.get(param, 0.0) if sparse else 0.0,
                    "dense_flops": evaluate(row.dense, env) if row is not None else None,
                    "sparse_flops": evaluate(row.sparse, env) if row is not None else None,
                }
            )
    return rows


def _print_inspect(console: rich.console.Console, sm: SparseModel, data: dict, show_graph: bool) -> None:
    """The node table (compact when it does not fit), the totals, the formulas and the sparsity table."""
    from sparsefx.report import fits, flop_table, is_ascii, sparsity_table

    log = " | ".join(data["capture_log"]) or "ok"
    console.print(f"[bold]{data['model']}[/]: captured with {data['capture_method']} ({log})", markup=True)
    table = _node_table(data, compact=False)
    if not fits(table, console.width):
        table = _node_table(data, compact=True)
    console.print(table)
    report = _report(data["totals"], data.get("uncounted", ()), data.get("partial"))
    console.print(flop_table(report, title="totals per call on the example inputs"))
    symbols = ", ".join(f"{k}={v}" for k, v in data["symbols"].items()) or "no symbols"
    exprs = data["expressions"]
    console.print(
        f"forward FLOPs as formulas ({symbols}): dense = {exprs['dense_forward']}; "
        f"sparse = {exprs['sparse_forward']}",
        markup=False,
    )
    if sm.plan.sparse:
        console.print(sparsity_table(sm, ascii_only=is_ascii(console), width=console.width))
    else:
        console.print("no sparse parameters (dense model)")
    if show_graph:
        console.print("final graph:", markup=False)
        console.print(sm.final_code(), markup=False, highlight=False, soft_wrap=True)


def _node_table(data: dict, compact: bool) -> Table:
    """The graph nodes with their parameters and FLOPs. ``compact`` (for narrow terminals) drops the
    node and op columns and names each row by its parameter, or its node where it reads none."""
    columns = ("parameter", "shape", "target", "actual", "dense FLOPs", "sparse FLOPs")
    names = ("parameter or node",) if compact else ("node", "op", "parameter")
    table = make_table("graph nodes that read a weight or count FLOPs", *names, *columns[1:])
    for row in data["rows"]:
        counted = row["dense_flops"] is not None
        label = (row["param"] or row["node"],) if compact else (row["node"], row["op"], row["param"] or "-")
        table.add_row(
            *label,
            str(tuple(row["shape"])) if row["shape"] is not None else "-",
            f"{row['target']:.1%}" if row["sparse"] else ("dense" if row["param"] else "-"),
            f"{row['actual']:.1%}" if row["sparse"] else "-",
            f"{row['dense_flops']:,}" if counted else "-",
            f"{row['sparse_flops']:,}" if counted else "-",
        )
    totals = data["totals"]
    table.add_section()
    blanks = [""] * (len(names) + 2)
    table.add_row("total", *blanks, f"{totals['dense_forward']:,}", f"{totals['sparse_forward']:,}")
    return table


def _report(totals: dict[str, int], uncounted: Any = (), partial: str | None = None) -> sparsefx.FlopReport:
    """A ``FlopReport`` from the JSON totals, for ``report.flop_table``."""
    return sparsefx.FlopReport(**totals, uncounted=tuple(uncounted), partial=partial)


def _inspect_program(args: argparse.Namespace) -> int:
    """Load, verify and summarize a program file; optionally write its DOT graph and mesh picture."""
    from sparsefx.report import make_console
    from sparsefx.runtime.draw import draw_mesh, write_dot
    from sparsefx.runtime.summary import kernel_table, summary, totals_table

    if args.model is not None:
        raise ConfigError("give either a program file or --model, not both")
    program = sparsefx.load_program(args.program)
    program.verify()
    if args.dot:
        write_dot(program, args.dot)
    if args.png:
        draw_mesh(program, args.png, what=args.heat)
    if args.format == "json":
        print(json.dumps(summary(program), indent=2))
        return 0
    console = make_console()
    console.print(kernel_table(program, limit=None if args.all else 40))
    console.print(totals_table(program))
    for path, what in ((args.dot, "DOT graph"), (args.png, "mesh picture")):
        if path:
            console.print(f"wrote the {what} to {path}")
    return 0
