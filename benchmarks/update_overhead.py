"""What RigL's periodic mask update adds to the average training step, next to Static sparsity.

Target: with a RigL update every ``--freq`` (100) steps, the average step time is at most 1.05x
that of a Static run of the same model at the same sparsity. Both are ``sparsefx.compile``d deep
copies of one model (same weights, same initial masks) with ``AdamW(fused=True)``, trained on the
same pool of ``--freq`` distinct batches (a learnable task, so gradients do not vanish). They run in one
process in interleaved blocks of ``--freq`` steps, rotating which goes first each round; every
RigL block contains exactly one mask update (checked). The ratio is the median of per-round ratios
of the two blocks' times. The time of each RigL update itself is measured by wrapping the
instance's ``update`` (and ``update_mask``, the drop-and-grow part).

Default model: MLP 1024-1024-1024-1024-10 (3.1M sparse weights), batch 128, on one thread, so a
step takes tens of ms and a round about 15 s on a quiet 2-core machine. ``--model
gpt-small-bench`` (batch 8x128 by default) takes about 0.4 s per step: use few rounds.

    .venv/bin/python benchmarks/update_overhead.py [--rounds 10] [--model mlp] [--json PATH]
"""

from __future__ import annotations

import argparse

import torch
from _overhead_variants import MODELS, Run, build_run, build_task
from _timing import (
    Summary,
    add_json_arg,
    console,
    environment,
    fmt_ratio,
    fmt_seconds,
    interleave,
    paired_ratios,
    print_table,
    summarize,
    verdict,
    write_json,
)

STATIC, RIGL = "static", "rigl"
ADAMW_NOTE = (
    "AdamW(fused=True) for both: the default (foreach) AdamW on CPU runs sqrt over exact-zero "
    "exp_avg_sq (every pruned entry) on a slow path, which would inflate both sides."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, default="mlp", help="model (default mlp)")
    p.add_argument("--batch", type=int, help="batch rows (default: 128 for mlp, 8 sequences for GPT)")
    p.add_argument("--seq-len", type=int, default=128, help="GPT tokens per sequence (default 128)")
    p.add_argument("--sparsity", type=float, default=0.9, help="sparsity level (default 0.9)")
    p.add_argument("--freq", type=int, default=100, help="RigL update interval = block length (default 100)")
    p.add_argument("--rounds", type=int, default=10, help="timed rounds (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--max-ratio", type=float, default=1.05, help="target: RigL / Static (default 1.05)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and data (default 0)")
    p.add_argument(
        "--flush-denormal",
        action="store_true",
        help="flush denormal floats to zero (diagnosis: regrown weights start at 0, and arithmetic on the "
        "tiny values that follow is slow on some CPUs)",
    )
    add_json_arg(p)
    args = p.parse_args(argv)
    if args.batch is None:
        args.batch = 128 if args.model == "mlp" else 8
    return args


def _time_rows(per_step: dict[str, Summary], ratios: dict[str, Summary]) -> list[list[str]]:
    rows = []
    for name, s in per_step.items():
        ratio = "1" if name == STATIC else fmt_ratio(ratios[name])
        rows.append(
            [name, fmt_seconds(s.median), f"{fmt_seconds(s.p25)}–{fmt_seconds(s.p75)}"]
            + [f"{fmt_seconds(s.min)}–{fmt_seconds(s.max)}", ratio]
        )
    return rows


def _update_rows(
    rigl: Run, warmup: int, static_step: float, freq: int
) -> tuple[list[list[str]], dict[str, Summary]]:
    """Rows for the updates made in timed blocks: whole update, drop-and-grow, the rest."""
    assert rigl.timer is not None
    skip = sum(rigl.updates_per_block[:warmup])
    total, mask = rigl.timer.update_seconds[skip:], rigl.timer.mask_seconds[skip:]
    parts = {
        "update() (one RigL update)": summarize(total),
        "  update_mask: drop_and_grow, all weights": summarize(mask),
        "  rest: clone, regrown-state reset, prune, finite check": summarize(
            [t - m for t, m in zip(total, mask)]
        ),
    }
    rows = [
        [name, fmt_seconds(s.median), f"{fmt_seconds(s.p25)}–{fmt_seconds(s.p75)}"]
        + [f"{fmt_seconds(s.min)}–{fmt_seconds(s.max)}", str(s.n), f"{s.median / static_step:.2f}"]
        + [f"{100 * s.median / (freq * static_step):.2f}%"]
        for name, s in parts.items()
    ]
    return rows, parts


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 when the target passes, 1 otherwise."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    flushed = args.flush_denormal and torch.set_flush_denormal(True)  # this thread: all work at 1 thread
    env = environment()
    task = build_task(args.model, args.batch, args.seq_len, args.seed, pool=args.freq)
    configs = {
        STATIC: {"algorithm": "static", "sparsity": args.sparsity},
        RIGL: {"algorithm": "rigl", "sparsity": args.sparsity, "update": {"freq": args.freq}},
    }
    runs = {name: build_run(name, task, cfg) for name, cfg in configs.items()}
    rigl = runs[RIGL]
    n_sparse = sum(int(m.numel()) for m in rigl.model.masks.values())
    console.print(
        f"[bold]update_overhead[/]: {task.describe}, sparsity {args.sparsity:g} on {n_sparse / 1e6:.2f}M "
        f"weights | blocks of {args.freq} steps over {args.freq} distinct batches, {args.rounds} rounds "
        f"after {args.warmup} warm-up, RigL update every {args.freq} (drop fraction 0.3) | torch "
        f"{env['torch']}, {args.threads} thread(s), load {env['loadavg_at_start']}"
        + (", denormals flushed to zero" if flushed else "")
    )
    console.print(f"note: {ADAMW_NOTE}")
    fns = {name: run.block_fn(task, args.freq) for name, run in runs.items()}
    samples = interleave(fns, args.rounds, args.warmup)
    steps = {name: [t / args.freq for t in v] for name, v in samples.items()}
    timed = slice(args.warmup, None)
    updates = rigl.updates_per_block[timed]
    outside = [b - u for b, u in zip(samples[RIGL], rigl.update_seconds_per_block[timed])]
    steps["rigl outside its update"] = [t / args.freq for t in outside]
    per_step = {name: summarize(v) for name, v in steps.items()}
    ratios = {name: summarize(v) for name, v in paired_ratios(steps, STATIC).items()}
    print_table(
        f"Per-step time (block of {args.freq} steps / {args.freq}; ratio: median of per-round ratios [IQR])",
        ["variant", "median step", "IQR", "min–max", "÷ static"],
        _time_rows(per_step, ratios),
    )
    static_step = per_step[STATIC].median
    rows, parts = _update_rows(rigl, args.warmup, static_step, args.freq)
    print_table(
        f"RigL update cost (÷ static step: in median static steps; per step: spread over {args.freq} steps)",
        ["part", "median", "IQR", "min–max", "n", "÷ static step", "per step"],
        rows,
    )
    ok_blocks = all(n == 1 for n in updates)
    ratio = ratios[RIGL]
    ok = ratio.median <= args.max_ratio and ok_blocks
    console.print(f"updates per timed RigL block: {sorted(set(updates))} (must be [1])")
    console.print(
        f"last loss: static {runs[STATIC].last_loss:.4f}, rigl {rigl.last_loss:.4f}; "
        f"RigL steps taken {rigl.model.sparsity.step}"
    )
    console.print(f"{verdict(ok)}  rigl ÷ static per step: {fmt_ratio(ratio)} <= {args.max_ratio:g}×")
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "update_overhead",
                "args": vars(args),
                "environment": env,
                "task": task.describe,
                "sparse_weights": n_sparse,
                "configs": configs,
                "block_seconds": samples,
                "step_seconds": {k: v.as_dict() for k, v in per_step.items()},
                "ratio_to_static": {k: v.as_dict() for k, v in ratios.items()},
                "update_seconds": {k.strip(): v.as_dict() for k, v in parts.items()},
                "update_seconds_raw_incl_warmup": rigl.timer.update_seconds if rigl.timer else [],
                "updates_per_timed_block": updates,
                "target": {"limit": args.max_ratio, "pass": ok},
            },
        )
        console.print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
