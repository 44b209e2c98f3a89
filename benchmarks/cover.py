"""Which (column, output) pairs a sparse matmul's PEs hold, and their first and last rows: the clock's
``cover`` against expanding every (PE, output) pair, side by side.

The clock needs this for each partial-sum route. The default is GPT-2 small's LM head (50257 x 768 at
90%), placed balanced on ``wse2``'s 996 rows at some of the widths the streaming search tries. Both
give the same pairs and rows (checked); the table gives each one's median and the per-round ratio.

    .venv/bin/python benchmarks/cover.py [--widths 18 47 189] [--rounds 5]
"""

from __future__ import annotations

import argparse

import torch
from _timing import (
    add_json_arg,
    console,
    environment,
    fmt_ratio,
    fmt_seconds,
    interleave,
    paired_ratios,
    print_table,
    summarize,
    write_json,
)

from sparsefx.passes.lower.place_sparse import place_sparse
from sparsefx.runtime.intervals import cover
from sparsefx.runtime.layout import Layout
from sparsefx.runtime.sparse_eval import read_slices


def expanded(s: Layout, width: int, height: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The baseline: every (PE, output) pair spelled out, the rows reduced over a ``width * out`` grid."""
    out_f = s.out_features
    span = s.span.clamp(max=out_f)
    pe = torch.repeat_interleave(torch.arange(width * height), span)
    offset = torch.arange(len(pe)) - (torch.cumsum(span, 0) - span)[pe]
    key = pe % width * out_f + (s.out_lo[pe] + offset) % out_f
    ymin = torch.full((width * out_f,), height, dtype=torch.int64).scatter_reduce(0, key, pe // width, "amin")
    ymax = torch.full((width * out_f,), -1, dtype=torch.int64).scatter_reduce(0, key, pe // width, "amax")
    held = (ymax >= 0).nonzero().squeeze(1)
    return held, ymin[held], ymax[held]


def main(argv: list[str] | None = None) -> int:
    """Place the weight at each width, check both agree, time them interleaved, print the table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=int, default=50257, help="output features (default 50257)")
    p.add_argument("--in", dest="in_f", type=int, default=768, help="input features (default 768)")
    p.add_argument("--height", type=int, default=996, help="region rows (default 996, wse2)")
    p.add_argument("--widths", type=int, nargs="+", default=[18, 47, 189])
    p.add_argument("--rounds", type=int, default=5, help="timed round-robin rounds (default 5)")
    add_json_arg(p)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    weight = torch.randn(args.out, args.in_f)
    mask = torch.rand(args.out, args.in_f) > 0.9
    rows, figures = [], {}
    for w in args.widths:
        arrays = place_sparse(weight, mask, w, args.height, "balanced")
        sl = read_slices(arrays, args.in_f, args.out, w, args.height, "benchmark")
        s = Layout(args.in_f, args.out, sl.in_lo, sl.in_hi, sl.out_lo, sl.span, sl.col_ptr)
        new, old = cover(s, w, args.height), expanded(s, w, args.height)
        if not all(torch.equal(a, b) for a, b in zip(new, old)):
            console.print(f"width {w}: cover and the expansion disagree")
            return 1
        fns = {
            "expanded": lambda s=s, w=w: expanded(s, w, args.height),
            "cover": lambda s=s, w=w: cover(s, w, args.height),
        }
        samples = interleave(fns, args.rounds, warmup=1)
        ratio = summarize(paired_ratios(samples, "expanded")["cover"])
        pairs = int(sl.span.clamp(max=args.out).sum())
        medians = [fmt_seconds(summarize(samples[n]).median) for n in fns]
        rows.append([str(w), f"{pairs:,}", f"{len(new[0]):,}", *medians, fmt_ratio(ratio)])
        figures[w] = {"samples": samples, "ratio": ratio.as_dict()}
    env = environment()
    shape = f"{args.out} x {args.in_f} at 90%, {args.height} rows"
    console.print(f"[bold]cover[/]: {shape} | torch {env['torch']}, {env['threads']} threads")
    print_table(
        f"held (column, output) pairs and their rows ({args.rounds} rounds)",
        ["width", "(PE, output) pairs", "held pairs", "expanded", "cover", "÷ expanded"],
        rows,
    )
    if args.json:
        write_json(args.json, {"environment": env, "widths": figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
