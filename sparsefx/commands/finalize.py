"""``sparsefx finalize``: turn a sparse checkpoint into a plain dense one (``sparsefx.checkpoint.finalize``).

$ sparsefx finalize -i sparse.pt -o dense.pt

>>> from sparsefx.cli import build_parser
>>> args = build_parser().parse_args(["finalize", "-i", "sparse.pt", "-o", "dense.pt"])
>>> args.input, args.output, args.handler is cmd_finalize
('sparse.pt', 'dense.pt', True)
"""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "cmd_finalize"]


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """Register ``finalize -i INPUT -o OUTPUT``."""
    parser = sub.add_parser(
        "finalize",
        parents=[common],
        help="turn a sparse checkpoint into a plain dense one",
        description="Read a sparsefx checkpoint, a NaN-sentinel checkpoint or a state dict (weights only), "
        "replace NaN by 0, apply and drop every mask, and write a plain dense checkpoint atomically "
        "(OUTPUT may equal INPUT).",
    )
    parser.add_argument("-i", "--input", required=True, metavar="INPUT", help="checkpoint to read")
    parser.add_argument("-o", "--output", required=True, metavar="OUTPUT", help="dense checkpoint to write")
    parser.set_defaults(handler=cmd_finalize)
    return parser


def cmd_finalize(args: argparse.Namespace) -> int:
    """Write the dense checkpoint and print one line of what changed."""
    from sparsefx.checkpoint import finalize

    stats = finalize(args.input, args.output)
    print(f"finalized {args.input} -> {args.output} ({stats.layout}): {stats.summary()}")
    return 0
