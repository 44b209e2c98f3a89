"""``sparsefx demo``: compile, train, lower and emulate a built-in model end to end (``sparsefx.demo``).

$ sparsefx demo --model mlp --steps 20 --out demo-files

>>> from sparsefx.cli import build_parser
>>> args = build_parser().parse_args(["demo", "--steps", "5"])
>>> args.model, args.sparsity, args.steps, args.out, args.handler is cmd_demo
('gpt-tiny', 0.9, 5, 'sparsefx-demo', True)
"""

from __future__ import annotations

import argparse

from sparsefx.commands.args import non_negative_int

__all__ = ["add_parser", "cmd_demo", "OUT"]

OUT = "sparsefx-demo"  # the output folder, in the current directory
STEPS = 300  # sparsefx.demo.STEPS (not imported here: that would import torch for --help)


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """Register ``demo [--model NAME] [--sparsity S] [--steps N] [--seed N] [--out DIR]``."""
    parser = sub.add_parser(
        "demo",
        parents=[common],
        help="compile, train, lower and emulate a built-in model end to end",
        description="Compile a built-in model with static sparsity, check it against the original, "
        "train it on a synthetic task, report FLOPs, lower it onto a 64x64 mesh, run the program on the "
        "emulated mesh, check its outputs and report the speedup over dense and where the gap to the "
        "ideal goes. Writes the program, a heatmap, a Chrome trace and a JSON report to --out.",
    )
    parser.add_argument("--model", default="gpt-tiny", help="built-in model (default gpt-tiny)")
    parser.add_argument("--sparsity", type=float, default=0.9, help="static sparsity level (default 0.9)")
    parser.add_argument(
        "--steps", type=non_negative_int, default=STEPS, help=f"training steps (default {STEPS})"
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default 0)")
    parser.add_argument("--out", default=OUT, metavar="DIR", help=f"folder for the files (default {OUT})")
    parser.set_defaults(handler=cmd_demo)
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    """Run ``sparsefx.demo.run_demo`` with the parsed options."""
    from sparsefx.demo import run_demo

    run_demo(model=args.model, sparsity=args.sparsity, steps=args.steps, seed=args.seed, out=args.out)
    return 0
