"""``torch.sqrt`` of exact zeros next to ``sqrt`` of nonzero values, the cost every masking method pays.

The default (for-loop) ``AdamW`` takes ``exp_avg_sq.sqrt()`` of every state entry at every step. A
masking method keeps the pruned entries' state at exactly 0, so at 90% sparsity 90% of those
entries are zeros. With some CPU builds (MKL's vector ``sqrt``, seen on AMD EPYC) a zero costs
several times a nonzero. This times both, and a 90%-zeros tensor, interleaved, on tensors of one
``exp_avg_sq``'s size, and prints ns per entry and the per-round ratios to the nonzero tensor.
``AdamW(fused=True)`` computes its square roots in its own kernel and does not pay this.

    .venv/bin/python benchmarks/sqrt_zeros.py [--numel 262144] [--rounds 30] [--calls 20]
"""

from __future__ import annotations

import argparse

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", type=int, default=262_144, help="entries per tensor (default 262144)")
    p.add_argument("--rounds", type=int, default=30, help="timed round-robin rounds (default 30)")
    p.add_argument("--calls", type=int, default=20, help="calls per candidate per round (default 20)")
    p.add_argument("--sparsity", type=float, default=0.9, help="share of zeros in the mixed tensor")
    add_json_arg(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Time ``sqrt`` of nonzeros, zeros and a mixed tensor; print ns per entry and ratios."""
    args = parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    nonzero = torch.rand(args.numel, generator=gen) + 0.1
    mixed = torch.where(torch.rand(args.numel, generator=gen) < args.sparsity, 0.0, nonzero)
    tensors = {"nonzero": nonzero, "zeros": torch.zeros(args.numel), f"{args.sparsity:.0%} zeros": mixed}
    fns = {name: (lambda t=t: t.sqrt()) for name, t in tensors.items()}
    samples = interleave(fns, args.rounds, warmup=2, number=args.calls)
    ratios = paired_ratios(samples, "nonzero")
    rows = []
    for name, values in samples.items():
        ns = 1e9 * summarize(values).median / args.numel
        rows.append([name, f"{ns:.2f}", "1" if name == "nonzero" else fmt_ratio(summarize(ratios[name]))])
    env = environment()
    console.print(
        f"[bold]sqrt_zeros[/]: {args.numel} float32 entries | torch {env['torch']}, {env['threads']} threads"
    )
    print_table("torch.sqrt per entry (median of rounds)", ["values", "ns / entry", "÷ nonzero"], rows)
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "sqrt_zeros",
                "args": vars(args),
                "environment": env,
                "samples": samples,
                "ratio_to_nonzero": {k: summarize(v).as_dict() for k, v in ratios.items()},
            },
        )
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
