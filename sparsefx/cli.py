"""The ``sparsefx`` command: validate a config, inspect a compiled graph, run the demo, finalize.

    $ sparsefx validate 0.9 --model mlp
    $ sparsefx inspect --model gpt-tiny --config sparsity.yaml --format json
    $ sparsefx demo --steps 20
    $ sparsefx finalize -i sparse.pt -o dense.pt

Every :class:`~sparsefx.errors.SparseFXError` (and every bad command-line value) becomes one line
on stderr, ``sparsefx: error: <message>``, and exit code 2; ``--debug`` adds the traceback.
Unexpected errors exit 1 and Ctrl-C exits 130::

    >>> main(["validate", "1.5", "--model", "mlp"])
    2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import sparsefx
from sparsefx.errors import ConfigError, SparseFXError
from sparsefx.models.names import BUILTIN_MODELS

if TYPE_CHECKING:  # the handlers import these when they run: --help and --version stay light
    import rich.console
    from rich.table import Table

    from sparsefx.config import ParamDecision, SparsityConfig, SparsityPlan
    from sparsefx.model import SparseModel
    from sparsefx.models.registry import ModelSpec

__all__ = ["main", "build_parser", "inspect_data"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
logger = logging.getLogger("sparsefx")


class UsageError(Exception):
    """A bad command line, raised instead of argparse's print-usage-and-exit."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _fail(str(exc), None, debug=False, code=2)
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    _setup_logging(args.log_level)
    try:
        with _warnings_to_log():
            return args.handler(args)
    except SparseFXError as exc:
        return _fail(str(exc), exc, debug=args.debug, code=2)
    except KeyboardInterrupt:
        print("sparsefx: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        sys.stdout = None  # the reader went away (``| head``): nothing left to say
        return 1
    except Exception as exc:
        hint = "" if args.debug else " (run with --debug for the traceback)"
        return _fail(f"{type(exc).__name__}: {exc}{hint}", exc, debug=args.debug, code=1)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; ``--debug`` and ``--log-level`` work before or after the subcommand."""
    parser = _Parser(prog="sparsefx", description="Unstructured weight sparsity for PyTorch.")
    parser.add_argument("--version", action="version", version=f"sparsefx {sparsefx.__version__}")
    _global_flags(parser, default_debug=False, default_level="WARNING")
    common = _Parser(add_help=False)
    _global_flags(common, default_debug=argparse.SUPPRESS, default_level=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    models = ", ".join(BUILTIN_MODELS)

    validate = sub.add_parser(
        "validate",
        parents=[common],
        help="resolve a config against a model without allocating weights",
        description="Resolve CONFIG against MODEL built on the meta device: which parameters get which "
        "sparsity, and why the others stay dense (no weights are allocated).",
    )
    validate.add_argument("config", metavar="CONFIG", help="YAML file, YAML text or a float like 0.9")
    _model_args(validate, models)
    validate.set_defaults(handler=cmd_validate)

    inspect = sub.add_parser(
        "inspect",
        parents=[common],
        help="compile a model and show its rewritten graph with FLOPs",
        description="Compile MODEL with CONFIG on its example inputs and show every node that reads a "
        "weight or is counted for FLOPs.",
    )
    _model_args(inspect, models)
    inspect.add_argument("--config", help="YAML file, YAML text or a float; omit for the dense model")
    inspect.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    inspect.add_argument("--graph", action="store_true", help="also print the final graph code")
    inspect.set_defaults(handler=cmd_inspect)

    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="compile, check, train and account a built-in model end to end",
        description="Compile a built-in model with static sparsity, check it against the original, "
        "train it on a synthetic task and report FLOPs.",
    )
    demo.add_argument("--model", default="gpt-tiny", help="built-in model (default gpt-tiny)")
    demo.add_argument("--sparsity", type=float, default=0.9, help="static sparsity level (default 0.9)")
    demo.add_argument("--steps", type=_non_negative_int, default=60, help="training steps (default 60)")
    demo.add_argument("--seed", type=_non_negative_int, default=0, help="random seed (default 0)")
    demo.set_defaults(handler=cmd_demo)

    final = sub.add_parser(
        "finalize",
        parents=[common],
        help="turn a sparse checkpoint into a plain dense one",
        description="Read a sparsefx checkpoint, a NaN-sentinel checkpoint or a state dict (weights only), "
        "replace NaN by 0, apply and drop every mask, and write a plain dense checkpoint atomically "
        "(OUTPUT may equal INPUT).",
    )
    final.add_argument("-i", "--input", required=True, metavar="INPUT", help="checkpoint to read")
    final.add_argument("-o", "--output", required=True, metavar="OUTPUT", help="dense checkpoint to write")
    final.set_defaults(handler=cmd_finalize)
    return parser


def _global_flags(parser: argparse.ArgumentParser, default_debug: Any, default_level: Any) -> None:
    """``--debug`` and ``--log-level``; subcommands take them with a SUPPRESS default, so that
    a flag given before the subcommand is not reset by the subcommand's own default."""
    parser.add_argument(
        "--debug", action="store_true", default=default_debug, help="show tracebacks on errors"
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=default_level,
        help="logging level (DEBUG also lists every decision with its reason)",
    )


def _model_args(parser: argparse.ArgumentParser, models: str) -> None:
    parser.add_argument(
        "--model", required=True, metavar="SPEC", help=f"built-in name ({models}) or package.module:factory"
    )
    parser.add_argument(
        "--input-shape", type=_int_list, metavar="DIMS", help="example input shape, e.g. 8,64 (batch first)"
    )
    parser.add_argument("--batch", type=_positive_int, help="batch size of the example inputs")


# ---------------------------------------------------------------------------------------------------------
# validate


def cmd_validate(args: argparse.Namespace) -> int:
    """``sparsefx validate``: resolve the config against the model built on the meta device."""
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
    table = _table("sparse parameters", "parameter", "shape", "algorithm", "sparsity", "init", *groups)
    for d in plan.sparse.values():
        group = (cfg.groups[d.group].path if d.group is not None else "-",) if groups else ()
        table.add_row(d.name, str(d.shape), d.algorithm or "-", f"{d.sparsity:.1%}", _init(d), *group)
    return table


def _dense_table(plan: SparsityPlan) -> Table:
    table = _table("dense parameters", "parameter", "shape", "reason")
    for d in plan.dense.values():
        table.add_row(d.name, str(d.shape), d.reason)
    return table


def _decisions_table(plan: SparsityPlan) -> Table:
    table = _table("every decision", "parameter", "decision", "reason")
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


# ---------------------------------------------------------------------------------------------------------
# inspect


def cmd_inspect(args: argparse.Namespace) -> int:
    """``sparsefx inspect``: compile on the example inputs and show the rewritten graph with FLOPs."""
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
    rows = _graph_rows(sm)
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
            for r in sm.sparsity_report()
        ],
    }


def _graph_rows(sm: SparseModel) -> list[dict[str, Any]]:
    """One row per graph node that reads a parameter or is counted for FLOPs, in graph order."""
    from sparsefx.passes.count_flops import op_name, weight_read

    counted = {(path, row.node): (row, env) for path, row, env in sm.flop_rows()}
    masks = sm.masks
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
            mask = masks.get(param) if sparse else None
            rows.append(
                {
                    "node": f"{path}:{node.name}" if path else node.name,
                    "op": row.op if row is not None else op_name(node),
                    "param": param,
                    "sparse": sparse,
                    "shape": list(sm.get_parameter(param).shape) if param is not None else None,
                    "target": decision.sparsity if sparse else 0.0,
                    "actual": 1.0 - float(mask.float().mean()) if mask is not None else 0.0,
                    "dense_flops": _value(row.dense, env) if row is not None else None,
                    "sparse_flops": _value(row.sparse, env) if row is not None else None,
                }
            )
    return rows


def _value(expr: Any, env: dict) -> int:
    import sympy

    return int(sympy.sympify(expr).subs(env))


def _print_inspect(console: rich.console.Console, sm: SparseModel, data: dict, show_graph: bool) -> None:
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
    table = _table("graph nodes that read a weight or count FLOPs", *names, *columns[1:])
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
    return sparsefx.FlopReport(**totals, uncounted=tuple(uncounted), partial=partial)


# ---------------------------------------------------------------------------------------------------------
# demo


def cmd_demo(args: argparse.Namespace) -> int:
    """``sparsefx demo``: the end-to-end job on a built-in model."""
    from sparsefx.demo import run_demo

    run_demo(model=args.model, sparsity=args.sparsity, steps=args.steps, seed=args.seed)
    return 0


# ---------------------------------------------------------------------------------------------------------
# finalize


def cmd_finalize(args: argparse.Namespace) -> int:
    """``sparsefx finalize``: a plain dense checkpoint with no trace of sparsity."""
    from sparsefx.checkpoint import finalize

    stats = finalize(args.input, args.output)
    print(f"finalized {args.input} -> {args.output} ({stats.layout}): {stats.summary()}")
    return 0


# ---------------------------------------------------------------------------------------------------------
# Shared helpers


# Columns of figures and short codes: never wrapped nor cut; every other column folds when narrow.
_FIGURES = (
    "shape",
    "algorithm",
    "sparsity",
    "init",
    "decision",
    "target",
    "actual",
    "dense FLOPs",
    "sparse FLOPs",
)


def _table(title: str, *columns: str) -> Table:
    from rich.table import Table

    from sparsefx.report import number_column, text_column

    table = Table(title=title, title_justify="left")
    for column in columns:
        if column not in _FIGURES:
            text_column(table, column)
        elif column.endswith("FLOPs"):  # the header may take two lines
            number_column(table, column.replace(" ", "\n"))
        else:
            number_column(table, column, justify="left")
    return table


def _fail(message: str, exc: BaseException | None, *, debug: bool, code: int) -> int:
    if debug and exc is not None:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    one_line = " | ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"sparsefx: error: {one_line}", file=sys.stderr)
    return code


class _OneLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = " | ".join(line.strip() for line in record.getMessage().splitlines() if line.strip())
        return f"sparsefx: {record.levelname.lower()}: {text}"


def _setup_logging(level: str) -> None:
    """Log ``sparsefx.*`` to stderr at ``level``, one line a record."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter())
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False


@contextlib.contextmanager
def _warnings_to_log() -> Iterator[None]:
    """Show Python warnings as one-line ``sparsefx: warning: ...`` log records while a command runs."""

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None):
        logger.warning("%s", message)

    previous = warnings.showwarning
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous


def _int_list(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(part) for part in text.split(","))
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of positive ints (e.g. 8,64)"
        )
    return dims


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive int")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative int")
    return value


if __name__ == "__main__":
    sys.exit(main())
