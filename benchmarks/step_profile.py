"""Where each masking method's training step spends time beyond the dense step.

Wall-clock ratios (``train_step.py``) say how much slower a step is; this says why. It runs the same
setups as ``train_step.py`` under ``torch.profiler`` in interleaved blocks (rotating order), sums
each op's self CPU time per step, and tabulates the events whose work differs between methods:

* ``sqrt``: the default (for-loop) AdamW takes ``sqrt`` of every ``exp_avg_sq`` entry; every masking
  method keeps the pruned ones at exactly 0, and with MKL on some CPUs ``sqrt(0)`` is far slower.
* ``mask kernels``: ``mul`` (prune and ao multiply weight by mask, forward and backward; AdamW's own
  ``mul`` is in-place ``mul_`` and not counted), ``bitwise_and_`` (sparsefx's and the floor's select).
* ``grad hooks``: the autograd engine's AccumulateGrad step, where tensor hooks on parameters run
  (sparsefx's gradient select runs there).
* ``optimizer Python``: the optimizer's own Python, with any optimizer-step hooks (sparsefx's step
  trust).

    .venv/bin/python benchmarks/step_profile.py [--blocks 6] [--steps 5] [--top 6] [--adamw-fused]

Self times under the profiler are larger than without it, and large kernels (mm, addmm, attention)
vary from block to block with the machine's load: compare the columns, not the wall times.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable

import torch
from _timing import add_json_arg, console, environment, print_table, write_json
from _train_variants import DENSE, FLOOR, add_setup_args, setup_from_args
from torch.profiler import ProfilerActivity, profile


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=6, help="profiled blocks per variant (default 6)")
    p.add_argument("--steps", type=int, default=5, help="steps per block (default 5)")
    p.add_argument("--top", type=int, default=0, help="also list the N ops that differ most from dense")
    add_setup_args(p)
    add_json_arg(p)
    return p.parse_args(argv)


# Profiler events whose time differs between masking methods, by what they are.
COLUMNS: dict[str, tuple[str, ...]] = {
    "sqrt": ("aten::sqrt", "aten::_foreach_sqrt"),
    "mask kernels": (
        "aten::mul",
        "aten::bitwise_and_",
        "aten::bitwise_and",
        "aten::where",
        "aten::masked_fill_",
    ),
    "grad hooks": ("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",),
    "optimizer Python": ("Optimizer.step#AdamW.step", "Optimizer.zero_grad#AdamW.zero_grad"),
}


def profile_variants(
    steps: dict[str, Callable[[], None]], blocks: int, per_block: int
) -> tuple[dict[str, collections.Counter[str]], dict[str, float]]:
    """``({variant: {op: self CPU µs per step}}, {variant: wall ms per step})``, blocks interleaved."""
    names = list(steps)
    self_us = {name: collections.Counter() for name in names}
    wall = collections.Counter()
    for block in range(blocks):
        shift = block % len(names)
        for name in names[shift:] + names[:shift]:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                for _ in range(per_block):
                    steps[name]()
                wall[name] += time.perf_counter() - start
            for event in prof.key_averages():
                self_us[name][event.key] += event.self_cpu_time_total
    n = blocks * per_block
    per_step = {}
    for name, ops in self_us.items():
        per_step[name] = collections.Counter({key: total / n for key, total in ops.items()})
    return per_step, {name: 1e3 * wall[name] / n for name in names}


def main(argv: list[str] | None = None) -> int:
    """Profile every setup and print the ops that differ most from the dense step."""
    args = parse_args(argv)
    variants, x, y = setup_from_args(args, floor=True)
    steps = {name: v.step_fn(x, y) for name, v in variants.items()}
    for step in steps.values():  # warm-up: optimizer state, caches, allocator
        for _ in range(2):
            step()
    console.print(
        f"[bold]step_profile[/]: {args.model}, batch {args.batch}x{args.seq_len}, sparsity {args.sparsity}, "
        f"AdamW({'fused=True' if args.adamw_fused else ''}) | {args.blocks} blocks x {args.steps} steps "
        f"per variant | torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    per_step, wall = profile_variants(steps, args.blocks, args.steps)
    columns = {
        name: {col: sum(ops[k] for k in keys) for col, keys in COLUMNS.items()}
        for name, ops in per_step.items()
    }
    rows = []
    for name, ops in per_step.items():
        total = sum(ops.values())
        shown = sum(columns[name].values())
        rows.append(
            [name, f"{wall[name]:.1f}"]
            + [f"{columns[name][col] / 1e3:.2f}" for col in COLUMNS]
            + [f"{(total - shown) / 1e3:.1f}"]
        )
    print_table(
        "ms per training step, self CPU time under the profiler (wall includes the profiler's overhead)",
        ["variant", "wall", *COLUMNS, "all other ops"],
        rows,
    )
    dense = per_step[DENSE]
    report: dict[str, list[dict[str, float | str]]] = {}
    for name, ops in per_step.items():
        deltas = sorted(((ops[k] - dense[k], k) for k in set(ops) | set(dense)), reverse=True)
        report[name] = [{"op": k, "delta_ms": d / 1e3, "ms": ops[k] / 1e3} for d, k in deltas[: args.top]]
        if name != DENSE and args.top:
            console.print(
                f"{name}, largest differences from dense: "
                + ", ".join(f"{k} {d / 1e3:+.2f}" for d, k in deltas[: args.top])
            )
    if FLOOR in wall:
        console.print(
            "The select floor is the eager model with one in-place select per sparse gradient after "
            "backward and no hooks: what any select-based method must at least spend. Large kernels "
            "(mm, addmm, attention) vary from block to block with the machine's load; the columns "
            "above are the work that differs between methods."
        )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "step_profile",
                "args": vars(args),
                "environment": environment(),
                "wall_ms_per_step": wall,
                "columns_ms": {n: {c: v / 1e3 for c, v in cols.items()} for n, cols in columns.items()},
                "largest_differences_from_dense": report,
            },
        )
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
