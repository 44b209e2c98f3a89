"""``sparsefx lower``: compile a model, lower it onto a mesh, verify the program and save it.

    $ sparsefx lower --model gpt-tiny --config 0.9 --mesh 64x64 -o model.sfxp
    $ sparsefx lower --model gpt2-small --config 0.9 --mesh wse2 --mode streaming -o gpt2.sfxp

The steps show on a progress line while they run (on a terminal); the program's totals print at the end.
"""

from __future__ import annotations

import argparse
import json
import logging

import sparsefx
from sparsefx.commands.args import model_args
from sparsefx.errors import ConfigError

__all__ = ["add_parser", "cmd_lower"]

logger = logging.getLogger("sparsefx")
STEPS = ("walk-graph", "size-regions", "place-data", "connect", "verify-program")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """Register ``lower --model SPEC --config CONFIG --mesh WxH [--mode] [--placement] -o FILE``."""
    parser = sub.add_parser(
        "lower",
        parents=[common],
        help="lower a compiled model to a dataflow program file (.sfxp)",
        description="Compile MODEL with CONFIG, lower it onto a mesh of PEs, verify the program and write "
        "it to a program file.",
    )
    model_args(parser)
    parser.add_argument("--config", required=True, help="YAML file, YAML text or a float (the sparsity)")
    parser.add_argument(
        "--mesh",
        default="64x64",
        help="WIDTHxHEIGHT or a preset (wse2, wse3, tiny, small, medium); default 64x64",
    )
    parser.add_argument("--mode", choices=("pipelined", "streaming"), default="pipelined")
    parser.add_argument("--placement", choices=("block", "balanced"), default="balanced")
    parser.add_argument("--hardware", help="hardware preset (default: the mesh preset's, else wse2)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="program file to write")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="summary format")
    parser.set_defaults(handler=cmd_lower)
    return parser


def cmd_lower(args: argparse.Namespace) -> int:
    """Compile, lower with a progress line, verify, save, and print the totals."""
    from sparsefx.config import load_config
    from sparsefx.models.registry import build_model
    from sparsefx.report import make_console
    from sparsefx.runtime.mesh import mesh_spec
    from sparsefx.runtime.summary import summary, totals_table

    mesh_spec(args.mesh)  # a bad or too large mesh fails before the model is built
    console = make_console()
    cfg = load_config(args.config)
    spec = build_model(args.model, input_shape=args.input_shape, batch=args.batch, device="cpu")
    if not spec.args and not spec.kwargs:
        raise ConfigError(f"model {spec.name!r} has no example inputs; pass --input-shape")
    sm = sparsefx.compile(spec.model, cfg, spec.args, example_kwargs=spec.kwargs)
    inputs = spec.kwargs if spec.kwargs and not spec.args else spec.args
    program = _lower_with_progress(sm, inputs, args)
    program.save(args.output)
    if args.format == "json":
        print(json.dumps({"output": args.output, **summary(program)}, indent=2))
        return 0
    console.print(totals_table(program))
    console.print(f"wrote {args.output}")
    return 0


def _lower_with_progress(sm: sparsefx.SparseModel, inputs: object, args: argparse.Namespace) -> object:
    from sparsefx.commands.progress import progress_line

    with progress_line("lowering") as progress:
        task = progress.add_task("capture", total=len(STEPS))

        def on_step(name: str) -> None:
            progress.update(task, description=name, completed=STEPS.index(name) if name in STEPS else 0)

        def on_kernel(name: str, done: int, total: int) -> None:  # plan-blocks times kernels one by one
            progress.update(task, description=f"plan-blocks: {name} ({done + 1}/{total})")

        program = sparsefx.lower(
            sm,
            inputs,
            mesh=args.mesh,
            mode=args.mode,
            placement=args.placement,
            hardware=args.hardware,
            on_step=on_step,
            on_kernel=on_kernel,
        )
        progress.update(task, completed=len(STEPS))
    return program
