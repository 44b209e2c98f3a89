"""``sparsefx demo``: compile, check, train and account a built-in model end to end (``sparsefx.demo``).

    $ sparsefx demo --model mlp --steps 20

    >>> from sparsefx.cli import build_parser
    >>> args = build_parser().parse_args(["demo", "--steps", "5"])
    >>> args.model, args.sparsity, args.steps, args.handler is cmd_demo
    ('gpt-tiny', 0.9, 5, True)
"""

from __future__ import annotations

import argparse

from sparsefx.commands.args import non_negative_int

__all__ = ["add_parser", "cmd_demo"]


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """Register ``demo [--model NAME] [--sparsity S] [--steps N] [--seed N]``."""
    parser = sub.add_parser(
        "demo",
        parents=[common],
        help="compile, check, train and account a built-in model end to end",
        description="Compile a built-in model with static sparsity, check it against the original, "
        "train it on a synthetic task and report FLOPs.",
    )
    parser.add_argument("--model", default="gpt-tiny", help="built-in model (default gpt-tiny)")
    parser.add_argument("--sparsity", type=float, default=0.9, help="static sparsity level (default 0.9)")
    parser.add_argument("--steps", type=non_negative_int, default=60, help="training steps (default 60)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default 0)")
    parser.set_defaults(handler=cmd_demo)
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    """Run ``sparsefx.demo.run_demo`` with the parsed options."""
    from sparsefx.demo import run_demo

    run_demo(model=args.model, sparsity=args.sparsity, steps=args.steps, seed=args.seed)
    return 0
