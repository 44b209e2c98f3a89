"""The ``sparsefx`` subcommands, one module each; ``sparsefx.cli`` is the entry point that runs them.

Each command module has ``add_parser(sub, common)``, which registers its subparser (``common`` is the
parent parser with the global flags) and sets ``handler`` to its ``cmd_<name>(args) -> int``. A module
imports torch, rich and the rest only inside its handler, so ``sparsefx --help`` stays light::

    >>> import argparse
    >>> from sparsefx.commands import finalize
    >>> sub = argparse.ArgumentParser(prog="sparsefx").add_subparsers()
    >>> parser = finalize.add_parser(sub, argparse.ArgumentParser(add_help=False))
    >>> parser.parse_args(["-i", "a.pt", "-o", "b.pt"]).handler is finalize.cmd_finalize
    True

Adding a command is one module here and one name in ``sparsefx.cli.COMMANDS``.
"""
