"""``sparsefx bench`` and ``sparsefx freeze``: a frozen model on this CPU, timed or written.

    $ sparsefx bench --model gpt-small-bench --config 0.9
    $ sparsefx bench --model gpt-tiny --config 0.9 --json bench.json
    $ sparsefx freeze --model gpt-tiny --config 0.9 -o frozen.pt

``bench`` compiles MODEL with CONFIG, freezes it (``sparsefx.freeze``, with a progress bar) and times
the dense eager forward of the model against the frozen one on its example inputs, interleaved, one
warm-up call each, the median of the per-round ratios; then each packed layer against its dense
product, at the tokens it sees on those inputs. ``freeze`` writes the frozen model's ``state_dict``
(``torch.load(path, weights_only=True)`` reads it; load it into ``sparsefx.freeze`` of the same
compiled model)::

    >>> from sparsefx.cli import build_parser
    >>> args = build_parser().parse_args(["bench", "--model", "mlp", "--config", "0.9", "--rounds", "3"])
    >>> args.model, args.config, args.rounds, args.threads, args.handler is cmd_bench
    ('mlp', '0.9', 3, 1, True)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from sparsefx.commands.args import model_args, positive_int

__all__ = ["add_parser", "cmd_bench", "cmd_freeze"]


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """Register ``bench --model SPEC --config CONFIG [--rounds N] [--threads N] [--backend] [--json]``
    and ``freeze --model SPEC --config CONFIG -o FILE``."""
    bench = sub.add_parser(
        "bench",
        parents=[common],
        help="time a frozen sparse model against dense on this CPU",
        description="Compile MODEL with CONFIG, freeze it onto sparse CPU kernels and time it against the "
        "dense eager model on its example inputs, whole and layer by layer.",
    )
    _model_and_config(bench)
    bench.add_argument("--rounds", type=positive_int, default=7, help="timed rounds (default 7)")
    bench.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    bench.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    bench.set_defaults(handler=cmd_bench)
    freeze = sub.add_parser(
        "freeze",
        parents=[common],
        help="freeze a compiled model onto sparse CPU kernels and write its state",
        description="Compile MODEL with CONFIG, freeze it onto sparse CPU kernels and write the frozen "
        "model's state_dict (torch.save; torch.load(weights_only=True) reads it).",
    )
    _model_and_config(freeze)
    freeze.add_argument("-o", "--output", required=True, metavar="FILE", help="file to write (.pt)")
    freeze.set_defaults(handler=cmd_freeze)
    return bench


def _model_and_config(parser: argparse.ArgumentParser) -> None:
    model_args(parser)
    parser.add_argument("--config", required=True, help="YAML file, YAML text or a float (the sparsity)")
    parser.add_argument("--backend", choices=("auto", "torch"), default="auto", help="kernels (default auto)")


def _frozen(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The model spec, its compiled form and the frozen model, with a progress bar while it packs."""
    import sparsefx
    from sparsefx.commands.progress import progress_line
    from sparsefx.config import load_config
    from sparsefx.errors import ConfigError
    from sparsefx.models.registry import build_model

    cfg = load_config(args.config)
    spec = build_model(args.model, input_shape=args.input_shape, batch=args.batch, device="cpu")
    if not spec.args and not spec.kwargs:
        raise ConfigError(f"model {spec.name!r} has no example inputs; pass --input-shape")
    sm = sparsefx.compile(spec.model, cfg, spec.args, example_kwargs=spec.kwargs).eval()
    with progress_line("freezing") as progress:
        task = progress.add_task("packing", total=max(len(sm.masks), 1))

        def on_layer(name: str, done: int, total: int) -> None:
            progress.update(task, description=name, completed=done)

        fast = sparsefx.freeze(sm, backend=args.backend, on_layer=on_layer)
    return spec, sm, fast


def _layer_rows(fast: Any, spec: Any, rounds: int) -> list[dict[str, Any]]:
    """Each packed layer at the tokens it sees on the example inputs, against ``F.linear``."""
    import torch
    import torch.nn.functional as F

    from sparsefx.frozen.sparse_linear import SparseLinear
    from sparsefx.frozen.timing import speedup_rounds

    seen: dict[str, int] = {}
    layers = {name: m for name, m in fast.module.named_modules() if isinstance(m, SparseLinear)}

    def count(name: str) -> Any:
        def hook(m: Any, args: tuple) -> None:  # returns None: the call's arguments stay as they are
            seen.setdefault(name, args[0].numel() // m.in_features)

        return hook

    hooks = [m.register_forward_pre_hook(count(name)) for name, m in layers.items()]
    try:
        fast(*spec.args, **spec.kwargs)
    finally:
        for h in hooks:
            h.remove()
    rows = []
    for name, layer in layers.items():
        tokens = seen.get(name, 1)
        x = torch.randn(tokens, layer.in_features)
        weight = layer.packed.dense()
        ratios = speedup_rounds(
            lambda x=x, w=weight, b=layer.bias: F.linear(x, w, b), lambda x=x, layer=layer: layer(x), rounds
        )
        rows.append(
            {
                "layer": name,
                "shape": [layer.out_features, layer.in_features],
                "density": layer.packed.density,
                "tokens": tokens,
                "kernel": layer.kernel(tokens),
                "speedup": statistics.median(ratios),
            }
        )
    return rows


def cmd_bench(args: argparse.Namespace) -> int:
    """Freeze, time whole and per layer, print the tables (and write ``--json``)."""
    import torch
    from rich.table import Table

    from sparsefx.frozen.timing import speedup_rounds
    from sparsefx.report import make_console

    torch.set_num_threads(args.threads)
    console = make_console()
    spec, sm, fast = _frozen(args)
    with torch.inference_mode():
        whole = speedup_rounds(
            lambda: spec.model(*spec.args, **spec.kwargs),
            lambda: fast(*spec.args, **spec.kwargs),
            args.rounds,
        )
        layers = _layer_rows(fast, spec, args.rounds)
    table = Table(
        title=f"{spec.name}: frozen against dense, {args.threads} thread(s), median of {args.rounds}"
    )
    for column in ("layer", "out x in", "density", "tokens", "kernel", "frozen / dense"):
        table.add_column(column, justify="left" if column in ("layer", "kernel") else "right")
    for r in layers:
        shape = "x".join(map(str, r["shape"]))
        table.add_row(
            r["layer"], shape, f"{r['density']:.3f}", str(r["tokens"]), r["kernel"], f"{r['speedup']:.2f}x"
        )
    console.print(table)
    dense_left = [r.weight for r in fast.freeze_report if not r.kernels]
    console.print(
        f"whole model: {statistics.median(whole):.2f}x the dense eager forward "
        f"(rounds {', '.join(f'{v:.2f}' for v in whole)}); frozen in {fast.freeze_seconds:.1f} s; "
        f"sparse weights {fast.frozen_bytes / 1e6:.1f} MB against {fast.dense_bytes / 1e6:.1f} MB dense"
    )
    if dense_left:
        console.print(f"left dense: {', '.join(dense_left)} (freeze_report says why)")
    if args.json:
        payload = {
            "model": spec.name,
            "threads": args.threads,
            "whole": {"speedup": statistics.median(whole), "rounds": whole},
            "layers": layers,
            "freeze_seconds": fast.freeze_seconds,
            "frozen_bytes": fast.frozen_bytes,
            "dense_bytes": fast.dense_bytes,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


def cmd_freeze(args: argparse.Namespace) -> int:
    """Freeze and write the frozen model's state atomically."""
    import torch

    from sparsefx.atomic import atomic_write
    from sparsefx.errors import FreezeError

    _, _, fast = _frozen(args)
    state = fast.state_dict()
    atomic_write(Path(args.output), lambda f: torch.save(state, f), FreezeError, "frozen model")
    print(
        f"wrote {args.output}: {fast.frozen_bytes / 1e6:.1f} MB of sparse weights "
        f"(dense {fast.dense_bytes / 1e6:.1f} MB)"
    )
    return 0
