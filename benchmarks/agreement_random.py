"""How closely the fast clock agrees with the event-driven reference, on seeded random cases.

The cases come from ``tests/agreement_cases.py``, whose first 24 (and known gaps past them)
``tests/test_agreement_random.py`` runs: small random models (MLPs of 2-3 linear layers, with or
without a LayerNorm; Conv2d nets; a one-layer GPT with tiny dimensions), sparsities in [0.5, 0.95],
meshes from 4x4 to 18x16 (a pipelined GPT 30-32 wide), both modes and placements, random batches and
input zero patterns. Each case is lowered and run on fresh inputs by both executors; the table gives
each case's fast / reference total cycles and whether both executors' outputs equal PyTorch's, then
how many cases are within 5% and 10%, and the worst (cases outside 10% are starred).

    .venv/bin/python benchmarks/agreement_random.py --cases 100      # ~3-5 minutes
    .venv/bin/python benchmarks/agreement_random.py --cases 20 --seed 1 --json out/agreement_random.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch
from _timing import console, environment, print_table, write_json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))

from agreement_cases import TOLERANCE, draw_cases, gap, run_case  # noqa: E402


def _row(r: dict[str, Any]) -> list[str]:
    outputs = "ok" if r["fast_ok"] and r["reference_ok"] else "DIFFER"
    mark = " *" if gap(r) > TOLERANCE else ""
    return [str(r["index"]), r["described_model"], f"{r['mesh'][0]}x{r['mesh'][1]}", r["mode"],
            r["placement"], f"{r['sparsity']:.2f}", r["described_zeros"], str(r["fast"]), str(r["reference"]),
            f"{r['ratio']:.3f}{mark}", outputs]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=100, help="how many cases to draw (default 100)")
    p.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0, the test's)")
    p.add_argument("--json", metavar="PATH", help="also write every case to this JSON file")
    args = p.parse_args()
    torch.set_num_threads(1)
    console.print(f"settings: {args.cases} cases from seed {args.seed}; fast / reference total cycles")
    results = []
    start = time.perf_counter()
    for case in draw_cases(args.cases, args.seed):
        r = run_case(case)
        results.append(r)
        line = f"{r['label']}: {r['fast']} / {r['reference']} = {r['ratio']:.3f}, {r['seconds']:.1f} s"
        console.print(line)
    columns = ["case", "model", "mesh", "mode", "placement", "sparsity", "zeros", "fast", "reference",
               "ratio", "outputs"]  # fmt: skip
    print_table("fast vs reference (* outside 10%)", columns, [_row(r) for r in results])
    gaps = sorted(gap(r) for r in results)
    n = len(results)
    worst = max(results, key=gap)
    differ = [r["label"] for r in results if not (r["fast_ok"] and r["reference_ok"])]
    console.print(
        f"within 5%: {sum(g <= 0.05 for g in gaps)} of {n}; within 10%: {sum(g <= TOLERANCE for g in gaps)} "
        f"of {n}; median gap {gaps[n // 2]:.3f}; ratios {min(r['ratio'] for r in results):.3f} to "
        f"{max(r['ratio'] for r in results):.3f}"
    )
    console.print(f"worst: {worst['ratio']:.3f} ({worst['label']}, {worst['kernels']} kernels)")
    console.print(f"outputs equal to PyTorch's in both executors: {n - len(differ)} of {n}"
                  + (f" (not: {', '.join(differ)})" if differ else ""))  # fmt: skip
    console.print(f"{time.perf_counter() - start:.0f} s")
    if args.json:
        write_json(args.json, {"seed": args.seed, "cases": results, "environment": environment()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
