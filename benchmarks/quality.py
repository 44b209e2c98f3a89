"""Test accuracy of Static, SET, RigL and GMP at 90% sparsity next to a dense baseline, on digits.

Every method trains ``MLP(64, (256, 256), 10)`` on scikit-learn's ``load_digits`` (fixed 75/25
stratified split) for the same number of AdamW steps with the same batch size and learning rate;
each seed gives every method the same initial weights and the same mini-batches. Sparse methods
make all three Linear weights sparse at the same level (uniform), random initial masks:

* Static: fixed mask;
* SET and RigL: update every ``--update-freq`` steps until T_end = 75% of training, drop fraction
  0.3 decayed by cosine to 0 at T_end (RigL regrows by dense gradient, SET at random);
* GMP: cubic (Zhu-Gupta) schedule from dense to the target over the first 75% of training,
  magnitude pruning every ``--update-freq`` steps.

Nothing is tuned per method. The table gives mean ± std, min–max and per-seed test accuracy; the
last lines print the observed ordering next to the one the RigL paper (Evci et al., 2020) reports,
and paired per-seed differences for each expected relation.

    .venv/bin/python benchmarks/quality.py [--steps 3000] [--seeds 3] [--sparsity 0.9] [--json PATH]

Needs scikit-learn (the ``bench`` extra): without it, exits with status 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import _digits
import torch
from _timing import add_json_arg, console, environment, print_table, write_json

EXPECTED = "dense ≥ GMP ≈ RigL ≥ SET ≥ Static"
RELATIONS = (("dense", "GMP"), ("GMP", "RigL"), ("RigL", "SET"), ("SET", "Static"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3000, help="training steps per run (default 3000)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per method (default 3)")
    p.add_argument("--sparsity", type=float, default=0.9, help="target sparsity (default 0.9)")
    p.add_argument("--batch", type=int, default=64, help="mini-batch size (default 64)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--update-freq", type=int, default=100, help="mask update interval (default 100)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: small model)")
    add_json_arg(p)
    args = p.parse_args(argv)
    if args.seeds < 1 or args.steps < 1 or not 0.0 < args.sparsity < 1.0:
        p.error("need --seeds >= 1, --steps >= 1 and 0 < --sparsity < 1")
    return args


def method_configs(steps: int, sparsity: float, freq: int) -> dict[str, dict[str, Any] | None]:
    """The sparsefx config of every method (``None``: dense), in the expected order."""
    t_end = max(1, int(0.75 * steps))
    drop = {"type": "cosine", "init": 0.3, "half_period": t_end}
    update = {"freq": freq, "stop": t_end}
    cubic = {"type": "polynomial", "init": 0.0, "final": sparsity, "begin": 0, "end": t_end}
    return {
        "dense": None,
        "GMP": {"algorithm": "gmp", "sparsity": cubic, "update": {"freq": freq}},
        "RigL": {"algorithm": "rigl", "sparsity": sparsity, "update": update, "drop_fraction": drop},
        "SET": {"algorithm": "set", "sparsity": sparsity, "update": update, "drop_fraction": drop},
        "Static": {"algorithm": "static", "sparsity": sparsity},
    }


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def observed_order(means: dict[str, float]) -> str:
    """Methods sorted by mean accuracy, joined by '>' (or '=' for equal means)."""
    ranked = sorted(means, key=lambda m: -means[m])
    out = ranked[0]
    for prev, name in zip(ranked, ranked[1:]):
        out += f" {'=' if means[prev] == means[name] else '>'} {name}"
    return out


def report(
    acc: dict[str, list[float]], results: dict[str, list[_digits.RunResult]], seeds: int
) -> dict[str, Any]:
    """Print the accuracy table, the orderings and the paired differences; return the summary."""
    rows, summary = [], {}
    for name, values in acc.items():
        mean, std = statistics.fmean(values), _std(values)
        zero = statistics.fmean(r.weights_zero for r in results[name])
        secs = statistics.fmean(r.seconds for r in results[name])
        summary[name] = {"mean": mean, "std": std, "min": min(values), "max": max(values)}
        rows.append(
            [name, f"{100 * mean:.2f} ± {100 * std:.2f}", f"{100 * min(values):.2f}–{100 * max(values):.2f}"]
            + [" ".join(f"{100 * v:.2f}" for v in values), f"{100 * zero:.1f}%", f"{secs:.1f} s"]
        )
    print_table(
        f"Test accuracy (%) over {seeds} seed(s)",
        ["method", "mean ± std", "min–max", "per seed", "weights zero", "train time/run"],
        rows,
    )
    means = {name: s["mean"] for name, s in summary.items()}
    console.print(f"expected (RigL paper): {EXPECTED}")
    console.print(f"observed (mean):       {observed_order(means)}")
    diff_rows, diffs = [], {}
    for a, b in RELATIONS:
        d = [x - y for x, y in zip(acc[a], acc[b])]
        wins, ties = sum(v > 0 for v in d), sum(v == 0 for v in d)
        diffs[f"{a}-{b}"] = d
        diff_rows.append(
            [f"{a} − {b}", f"{100 * statistics.fmean(d):+.2f} ± {100 * _std(d):.2f}"]
            + [f"{wins} / {ties} / {len(d) - wins - ties}"]
        )
    print_table(
        "Paired per-seed differences (percentage points; same init and batches per seed)",
        ["expected relation", "mean ± std", "seeds > / = / <"],
        diff_rows,
    )
    test_n = results["dense"][0].test_size
    console.print(f"one test example = {100 / test_n:.2f} points ({test_n} test examples)")
    return {"summary": summary, "paired_differences": diffs, "observed_order": observed_order(means)}


def main(argv: list[str] | None = None) -> int:
    """Train every method on every seed; return 0 (2 when scikit-learn is missing)."""
    args = parse_args(argv)
    try:
        data = _digits.load()
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith(("sklearn", "scipy")):
            raise
        print(
            "quality.py needs scikit-learn: install the bench extra (pip install -e '.[bench]')",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(args.threads)
    env = environment()
    configs = method_configs(args.steps, args.sparsity, args.update_freq)
    console.print(
        f"[bold]quality[/]: digits {len(data.y_train)} train / {len(data.y_test)} test, MLP 64-256-256-10, "
        f"{args.steps} steps x batch {args.batch}, AdamW(lr={args.lr:g}, fused=True), sparsity "
        f"{args.sparsity:g}, update every {args.update_freq}, T_end {int(0.75 * args.steps)} | "
        f"torch {env['torch']}, {args.threads} thread(s), load {env['loadavg_at_start']}"
    )
    results: dict[str, list[_digits.RunResult]] = {name: [] for name in configs}
    for seed in range(args.seeds):
        for name, config in configs.items():
            r = _digits.train_once(data, config, steps=args.steps, batch=args.batch, lr=args.lr, seed=seed)
            results[name].append(r)
            console.print(
                f"  seed {seed} {name:6s} test acc {100 * r.test_accuracy:.2f}%  "
                f"final loss {r.final_loss:.4f}  ({r.seconds:.1f} s)"
            )
    acc = {name: [r.test_accuracy for r in rs] for name, rs in results.items()}
    summary = report(acc, results, args.seeds)
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "quality",
                "args": vars(args),
                "environment": env,
                "configs": configs,
                "expected_order": EXPECTED,
                "runs": {name: [r.as_dict() for r in rs] for name, rs in results.items()},
                **summary,
            },
        )
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
