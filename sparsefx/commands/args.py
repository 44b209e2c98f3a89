"""Argument helpers the commands share: the model arguments and argparse ``type=`` checks.

A bad value becomes argparse's error, which ``sparsefx.cli`` prints as one line with exit code 2::

    >>> int_list("8,64"), positive_int("3"), non_negative_int("0")
    ((8, 64), 3, 0)
    >>> positive_int("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: '0' is not a positive int
"""

from __future__ import annotations

import argparse

from sparsefx.models.names import BUILTIN_MODELS

__all__ = ["model_args", "int_list", "positive_int", "non_negative_int"]


def model_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """``--model``, ``--input-shape`` and ``--batch``: which model to build, on what inputs."""
    models = ", ".join(BUILTIN_MODELS)
    parser.add_argument(
        "--model",
        required=required,
        metavar="SPEC",
        help=f"built-in name ({models}) or package.module:factory",
    )
    parser.add_argument(
        "--input-shape", type=int_list, metavar="DIMS", help="example input shape, e.g. 8,64 (batch first)"
    )
    parser.add_argument("--batch", type=positive_int, help="batch size of the example inputs")


def int_list(text: str) -> tuple[int, ...]:
    """``"8,64"`` -> ``(8, 64)``; every entry must be a positive int."""
    try:
        dims = tuple(int(part) for part in text.split(","))
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of positive ints (e.g. 8,64)"
        )
    return dims


def positive_int(text: str) -> int:
    """An int > 0."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive int")
    return value


def non_negative_int(text: str) -> int:
    """An int >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative int")
    return value
