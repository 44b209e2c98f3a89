"""The ``sparsefx`` command: validate a config, inspect a graph, lower, run a program, demo, finalize.

This module is the entry point: the parser, the global flags, logging and error handling. Each
subcommand lives in its own module of ``sparsefx.commands`` (listed in ``COMMANDS``).

    $ sparsefx validate 0.9 --model mlp
    $ sparsefx inspect --model gpt-tiny --config sparsity.yaml --format json
    $ sparsefx lower --model gpt-tiny --config 0.9 --mesh 64x64 -o model.sfxp
    $ sparsefx inspect model.sfxp --png mesh.png
    $ sparsefx run model.sfxp --heatmap busy.png --trace trace.json
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
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import sparsefx
from sparsefx.commands import bench, demo, finalize, inspect, lower, run, validate
from sparsefx.errors import SparseFXError

__all__ = ["main", "build_parser", "COMMANDS"]

# The subcommands in the order ``--help`` lists them; each module has ``add_parser(sub, common)``.
COMMANDS = (validate, inspect, lower, run, demo, finalize, bench)
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
    try:
        with _logging(args.log_level), _warnings_to_log(), _current_folder_first():
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
    """The argument parser; ``--debug`` and ``--log-level`` work before or after the subcommand.

    >>> build_parser().parse_args(["--debug", "validate", "0.9", "--model", "mlp"]).debug
    True
    """
    parser = _Parser(prog="sparsefx", description="Unstructured weight sparsity for PyTorch.")
    parser.add_argument("--version", action="version", version=f"sparsefx {sparsefx.__version__}")
    _global_flags(parser, default_debug=False, default_level="WARNING")
    common = _Parser(add_help=False)
    _global_flags(common, default_debug=argparse.SUPPRESS, default_level=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub, common)
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


@contextlib.contextmanager
def _logging(level: str) -> Iterator[None]:
    """Log ``sparsefx.*`` to stderr at ``level``, one line a record, while a command runs; the logger
    is as it was afterwards, so a caller that runs ``main`` in its own process keeps its logging."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter())
    kept = logger.handlers[:], logger.level, logger.propagate
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False
    try:
        yield
    finally:
        logger.handlers[:], logger.propagate = kept[0], kept[2]
        logger.setLevel(kept[1])


@contextlib.contextmanager
def _current_folder_first() -> Iterator[None]:
    """The current folder first on ``sys.path`` while a command runs, as ``python -m`` puts it: so
    ``--model mypkg.models:mlp`` finds ``./mypkg`` from the ``sparsefx`` script too (whose own folder
    is first otherwise)."""
    here = os.getcwd()
    if sys.path and sys.path[0] in ("", here):
        yield
        return
    sys.path.insert(0, here)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(here)


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


if __name__ == "__main__":
    sys.exit(main())
