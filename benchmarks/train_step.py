"""Training-step time of a sparsefx-compiled GPT next to dense eager and PyTorch's pruning tools.

Targets: one training step (zero_grad, forward, next-token cross-entropy, backward, AdamW step) of
``sparsefx.compile(model, 0.9)`` on ``gpt-small-bench`` (4 layers, d_model 256, batch 8 x 128
tokens) takes at most 1.05x the dense eager model's step, and (with ``--floor``) at most 1.01x the
select floor: an eager model with one in-place select per sparse gradient and no hooks, the least
any select-based method can spend. Both hold for the compiled model alone and with its optimizer
handed to ``sm.sparsity.apply``. ``torch.nn.utils.prune.global_unstructured`` and
``torch.ao.pruning.WeightNormSparsifier`` at the same sparsity on the same weights are timed beside
them for reference (on this class of machine they all sit at the floor). All variants run in one
process, round-robin (rotating order), each on its own deep copy with its own AdamW; ratios are
medians of per-round ratios with a distribution-free 95% confidence interval.

    .venv/bin/python benchmarks/train_step.py [--rounds 60] [--steps-per-round 2] [--json PATH]
"""

from __future__ import annotations

import argparse

from _timing import (
    Summary,
    add_json_arg,
    console,
    environment,
    fmt_ci,
    fmt_ratio,
    fmt_seconds,
    interleave,
    paired_ratios,
    print_table,
    summarize,
    verdict,
    write_json,
)
from _train_variants import (
    AO,
    DENSE,
    FLOOR,
    PRUNE,
    SPARSEFX,
    SPARSEFX_APPLIED,
    add_setup_args,
    setup_from_args,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=60, help="timed round-robin rounds (default 60)")
    p.add_argument("--steps-per-round", type=int, default=2, help="steps per variant per round (default 2)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    p.add_argument("--max-ratio", type=float, default=1.05, help="target: sparsefx / dense (default 1.05)")
    p.add_argument(
        "--max-floor-ratio",
        type=float,
        default=1.01,
        help="target with --floor: sparsefx / floor (default 1.01)",
    )
    add_setup_args(p)
    p.add_argument(
        "--floor",
        action="store_true",
        help="also time the select floor: eager, one in-place select per sparse gradient, no hooks",
    )
    add_json_arg(p)
    return p.parse_args(argv)


def report(
    times: dict[str, Summary],
    to_dense: dict[str, Summary],
    sparsity: dict[str, float],
    loss: dict[str, float],
) -> None:
    """Per-variant table: step time, spread, ratio to dense, effective sparsity, last loss."""
    rows = []
    for name, s in times.items():
        ratio = "1" if name == DENSE else fmt_ratio(to_dense[name])
        spread = f"{fmt_seconds(s.p25)}–{fmt_seconds(s.p75)}"
        rows.append(
            [name, fmt_seconds(s.median), spread, f"{fmt_seconds(s.min)}–{fmt_seconds(s.max)}", ratio]
            + [f"{100 * sparsity[name]:.1f}%", f"{loss[name]:.4f}"]
        )
    print_table(
        "Training step (per-step mean within a round; ratio: median of per-round ratios [IQR])",
        ["variant", "median step", "IQR", "min–max", "÷ dense", "weights zero", "last loss"],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 when both targets pass, 1 otherwise."""
    args = parse_args(argv)
    env = environment()
    variants, x, y = setup_from_args(args, floor=args.floor)
    n_sparse = len(variants[SPARSEFX].model.masks)
    opt_args = "fused=True" if args.adamw_fused else ""
    console.print(
        f"[bold]train_step[/]: {args.model}, batch {args.batch}x{args.seq_len}, sparsity {args.sparsity} on "
        f"{n_sparse} Linear weights | {args.rounds} rounds x {args.steps_per_round} steps after "
        f"{args.warmup} warm-up rounds, AdamW({opt_args}) | torch {env['torch']}, {env['threads']} threads, "
        f"load {env['loadavg_at_start']}"
    )
    fns = {name: v.step_fn(x, y) for name, v in variants.items()}
    samples = interleave(fns, args.rounds, args.warmup, number=args.steps_per_round)

    times = {name: summarize(v) for name, v in samples.items()}
    to_dense = {name: summarize(v) for name, v in paired_ratios(samples, DENSE).items()}
    sparsity = {name: v.sparsity() for name, v in variants.items()}
    loss = {name: v.losses[-1] for name, v in variants.items()}
    report(times, to_dense, sparsity, loss)

    ours = (SPARSEFX, SPARSEFX_APPLIED)
    vs = {
        (mine, other): summarize(paired_ratios({mine: samples[mine], other: samples[other]}, other)[mine])
        for mine in ours
        for other in (PRUNE, AO)
    }
    if args.floor:
        floor_vs = {
            other: summarize(paired_ratios({FLOOR: samples[FLOOR], other: samples[other]}, other)[FLOOR])
            for other in (*ours, PRUNE, AO)
        }
        console.print(
            "select floor (what a select-based method cannot go below): "
            + ", ".join(f"÷ {k} {fmt_ratio(v)}" for k, v in floor_vs.items())
        )
    to_floor = (
        {
            mine: summarize(paired_ratios({mine: samples[mine], FLOOR: samples[FLOOR]}, FLOOR)[mine])
            for mine in ours
        }
        if args.floor
        else {}
    )
    ok_dense = all(to_dense[mine].median <= args.max_ratio for mine in ours)
    ok_floor = all(s.median <= args.max_floor_ratio for s in to_floor.values())
    for mine in ours:
        ok = to_dense[mine].median <= args.max_ratio
        console.print(f"{verdict(ok)}  {mine} ÷ dense: {fmt_ci(to_dense[mine])} <= {args.max_ratio:g}×")
    for mine, summary in to_floor.items():
        ok = summary.median <= args.max_floor_ratio
        console.print(f"{verdict(ok)}  {mine} ÷ select floor: {fmt_ci(summary)} <= {args.max_floor_ratio:g}×")
    if not args.floor:
        console.print("(the select-floor target needs --floor)")
    for (mine, other), summary in vs.items():
        console.print(f"info  {mine} ÷ {other}: {fmt_ci(summary)}")
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "train_step",
                "args": vars(args),
                "environment": env,
                "sparse_weights": n_sparse,
                "step_seconds": {k: v.as_dict() for k, v in times.items()},
                "samples": samples,
                "ratio_to_dense": {k: v.as_dict() for k, v in to_dense.items()},
                "ratio_to_baselines": {f"{m} / {o}": v.as_dict() for (m, o), v in vs.items()},
                "select_floor_ratio_to": (
                    {k: v.as_dict() for k, v in floor_vs.items()} if args.floor else None
                ),
                "weights_zero_fraction": sparsity,
                "last_loss": loss,
                "targets": {
                    "sparsefx_vs_dense": {"limit": args.max_ratio, "pass": ok_dense},
                    "sparsefx_vs_select_floor": (
                        {"limit": args.max_floor_ratio, "pass": ok_floor} if args.floor else None
                    ),
                },
            },
        )
        console.print(f"wrote {args.json}")
    return 0 if ok_dense and ok_floor else 1


if __name__ == "__main__":
    raise SystemExit(main())
