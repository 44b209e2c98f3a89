"""Inference forward of a sparsefx-compiled GPT next to dense eager and PyTorch's pruning tools.

The same four setups as ``train_step.py`` (``_train_variants``), in eval mode under
``torch.inference_mode()``: one forward of ``gpt-small-bench`` per call, for a few batch shapes.
``torch.nn.utils.prune`` multiplies every weight by its mask in a forward pre-hook and
``torch.ao.pruning`` does the same in a parametrization, on every call; a compiled model's masked
ops use its weights in place once they are known to be zero where pruned, so its forward should
cost what the dense one does. No target: the figures go next to ``train_step.py``'s.

    .venv/bin/python benchmarks/forward.py [--rounds 30] [--shapes 1x128,8x128] [--json PATH]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from _timing import (
    add_json_arg,
    console,
    environment,
    fmt_ratio,
    interleave,
    paired_ratios,
    print_table,
    summarize,
    write_json,
)
from _train_variants import AO, DENSE, PRUNE, SPARSEFX, build_variants

from sparsefx.models.registry import build_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30, help="timed round-robin rounds (default 30)")
    p.add_argument(
        "--calls-per-round", type=int, default=10, help="forwards per variant per round (default 10)"
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    p.add_argument("--model", default="gpt-small-bench", help="built-in GPT model (default gpt-small-bench)")
    p.add_argument(
        "--shapes", default="1x128,8x128", help="batch x tokens, comma-separated (default 1x128,8x128)"
    )
    p.add_argument("--sparsity", type=float, default=0.9, help="sparsity level (default 0.9)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and tokens (default 0)")
    add_json_arg(p)
    return p.parse_args(argv)


def _shape(text: str) -> tuple[int, int]:
    batch, _, seq = text.partition("x")
    return int(batch), int(seq)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one table per shape; returns 0."""
    args = parse_args(argv)
    shapes = [_shape(s) for s in args.shapes.split(",")]
    env = environment()
    spec = build_model(args.model, input_shape=shapes[0], seed=args.seed)
    vocab = spec.model.config.vocab_size
    gen = torch.Generator().manual_seed(args.seed)
    example = torch.randint(0, vocab, shapes[0], generator=gen)
    variants = build_variants(spec.model, example, args.sparsity)
    console.print(
        f"[bold]forward[/]: {args.model} in eval mode under inference_mode, sparsity {args.sparsity} | "
        f"{args.rounds} rounds x {args.calls_per_round} calls | torch {env['torch']}, "
        f"{env['threads']} threads"
    )
    results = {}
    for batch, seq in shapes:
        tokens = torch.randint(0, vocab, (batch, seq), generator=gen)

        def forward(model: torch.nn.Module, tokens: torch.Tensor = tokens) -> Callable[[], None]:
            model.eval()

            def call() -> None:
                with torch.inference_mode():
                    model(tokens)

            return call

        samples = interleave(
            {name: forward(v.model) for name, v in variants.items()},
            args.rounds,
            args.warmup,
            number=args.calls_per_round,
        )
        to_dense = {name: summarize(v) for name, v in paired_ratios(samples, DENSE).items()}
        rows = [
            [
                name,
                f"{summarize(samples[name]).median * 1e3:.2f} ms",
                "1" if name == DENSE else fmt_ratio(to_dense[name]),
            ]
            for name in variants
        ]
        print_table(
            f"Forward, {batch}x{seq} tokens (ratio: median of per-round ratios [IQR])",
            ["variant", "median", "÷ dense"],
            rows,
        )
        vs = {
            other: summarize(
                paired_ratios({SPARSEFX: samples[SPARSEFX], other: samples[other]}, other)[SPARSEFX]
            )
            for other in (PRUNE, AO)
        }
        console.print(f"sparsefx ÷ {PRUNE} {fmt_ratio(vs[PRUNE])}, ÷ {AO} {fmt_ratio(vs[AO])}")
        results[f"{batch}x{seq}"] = {
            "samples": samples,
            "ratio_to_dense": {k: v.as_dict() for k, v in to_dense.items()},
            "sparsefx_ratio_to": {k: v.as_dict() for k, v in vs.items()},
        }
    if args.json:
        write_json(
            args.json, {"benchmark": "forward", "args": vars(args), "environment": env, "shapes": results}
        )
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
