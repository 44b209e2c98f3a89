"""``sparsefx run``: run a program file on the emulated mesh and report what the sparsity buys.

    $ sparsefx run model.sfxp
    $ sparsefx run model.sfxp --format json --heatmap busy.png --trace trace.json
    $ sparsefx run model.sfxp --inputs inputs.safetensors --json report.json

The inputs are fresh random tensors of the shapes and dtypes the program records (ids within the
embedding tables they index; ``runtime/random_inputs.py``), or the tensors of a safetensors file,
one per program input by name::

    >>> from sparsefx.cli import build_parser
    >>> args = build_parser().parse_args(["run", "model.sfxp", "--trace", "t.json"])
    >>> args.program, args.executor, args.format, args.trace, args.handler is cmd_run
    ('model.sfxp', 'fast', 'table', 't.json', True)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sparsefx.commands.args import non_negative_int

if TYPE_CHECKING:
    import torch

    from sparsefx.runtime.program import ProgramData

__all__ = ["add_parser", "cmd_run", "load_inputs"]


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """Register ``run PROGRAM [--inputs FILE] [--executor] [--device] [--format] [--json] [--heatmap]
    [--trace]``."""
    parser = sub.add_parser(
        "run",
        parents=[common],
        help="run a program file on the emulated mesh and report cycles and speedup",
        description="Load a program file (.sfxp), run it on fresh random inputs of the shapes it records "
        "(or on --inputs), and report cycles, time, utilization, traffic and the speedup over the dense "
        "baseline with where the gap to the ideal goes.",
    )
    parser.add_argument("program", metavar="PROGRAM", help="program file (.sfxp) written by sparsefx lower")
    parser.add_argument(
        "--inputs", metavar="FILE", help="safetensors file with one tensor per program input, by name"
    )
    parser.add_argument("--executor", choices=("fast", "reference"), default="fast", help="default fast")
    parser.add_argument(
        "--device",
        help="where the fast executor's values are computed (its clock runs on the host): cpu, cuda...",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table", help="stdout format")
    parser.add_argument("-o", "--json", metavar="PATH", help="also write the JSON report to PATH")
    parser.add_argument("--heatmap", metavar="PNG", help="draw busy cycles per PE (needs the plot extra)")
    parser.add_argument("--trace", metavar="JSON", help="write a Chrome trace (Perfetto, chrome://tracing)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of the random inputs")
    parser.add_argument("--all", action="store_true", help="list every kernel (default: the first 40)")
    parser.set_defaults(handler=cmd_run)
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    """Load, verify, run, write the files asked for, and print the report as tables or JSON."""
    import sparsefx
    from sparsefx.report import make_console
    from sparsefx.runtime.random_inputs import random_inputs
    from sparsefx.runtime.report import report_data, tables, write_heatmap, write_json
    from sparsefx.runtime.trace import write_trace

    with _status("loading the program") as status:
        program = sparsefx.load_program(args.program)
        program.verify()
        inputs = load_inputs(args.inputs) if args.inputs else random_inputs(program, args.seed)
        status(f"running {args.program} ({args.executor} executor)")
        result = sparsefx.run(program, inputs, executor=args.executor, device=args.device)
        stats = result.stats
        data = report_data(stats, program) | {"program_file": args.program}
        written = []
        if args.json:
            status("writing the JSON report")
            write_json(data, args.json)
            written.append(("JSON report", args.json))
        if args.heatmap:
            status("drawing the heatmap")
            write_heatmap(program, stats, args.heatmap)
            written.append(("heatmap", args.heatmap))
        if args.trace:
            status("writing the trace")
            write_trace(stats, args.trace, _title(program, args.program))
            written.append(("Chrome trace", args.trace))
    if args.format == "json":
        print(json.dumps(data, indent=2, allow_nan=False))
        return 0
    console = make_console()
    console.print(f"[bold]{_title(program, args.program)}[/]: {_describe(inputs, args)}")
    for table in tables(stats, limit=None if args.all else 40):
        console.print(table)
    for what, path in written:
        console.print(f"wrote the {what} to {path}", markup=False)
    return 0


def load_inputs(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, by name (``sparsefx.run`` checks them against the program)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from sparsefx.errors import EmulationError

    try:
        return load_file(path)
    except (OSError, SafetensorError) as exc:
        raise EmulationError(f"cannot read the inputs file {path}: {exc}") from exc


def _title(program: ProgramData, path: str) -> str:
    model = program.meta.get("model") or "program"
    return f"{path}: {model} on a {program.mesh} mesh ({program.mode}, {program.placement})"


def _describe(inputs: Any, args: argparse.Namespace) -> str:
    """``idx [2, 64] int64`` for each input, and where they came from."""
    shapes = ", ".join(
        f"{name} {list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for name, t in inputs.items()
    )
    source = f"from {args.inputs}" if args.inputs else f"random, seed {args.seed}"
    where = f" on {args.device}" if args.device else ""
    return f"{args.executor} executor{where}, inputs {shapes} ({source})"


@contextlib.contextmanager
def _status(text: str) -> Iterator[Any]:
    """A transient spinner on stderr (a terminal only, so piped and JSON output stay clean).

    Yields a function that changes the spinner's text.
    """
    if not sys.stderr.isatty():
        yield lambda text: None
        return
    from rich.console import Console

    with Console(stderr=True).status(text) as status:
        yield lambda text: status.update(text)
