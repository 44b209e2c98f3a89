"""Balanced placement at an earlier commit against the working tree's, side by side in one process.

Loads ``passes/lower/place_balanced.py`` as it was at ``--rev`` (``git show``) beside the current one,
checks that both give equal arrays, and times both over interleaved rounds on GPT-2 small's shapes at
``--sparsity`` (random masks): the ratio is new over old, per round, then its median.

    .venv/bin/python benchmarks/placement_versions.py --rev c946282^ [--rounds 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import torch
from _timing import add_json_arg, environment, fmt_seconds, interleave, paired_ratios, print_table, write_json

from sparsefx.passes.lower.place_balanced import place_balanced

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "passes/lower/place_balanced.py"
CASES = {  # name: ((out, in), region width, region height)
    "fc 3072x768 on 64x64": ((3072, 768), 64, 64),
    "qkv 2304x768 on 64x64": ((2304, 768), 64, 64),
    "fc 3072x768 on 189x996 (wse2 streaming)": ((3072, 768), 189, 996),
    "lm_head 50257x768 on 757x996 (wse2)": ((50257, 768), 757, 996),
}


def at_revision(rev: str) -> ModuleType:
    """``place_balanced.py`` as it was at ``rev``, loaded as a module of its own."""
    shown = subprocess.run(["git", "show", f"{rev}:{SOURCE}"], cwd=ROOT, check=True, capture_output=True)
    text = shown.stdout
    path = Path(tempfile.mkdtemp()) / "place_balanced_at_rev.py"
    path.write_bytes(text)
    spec = importlib.util.spec_from_file_location("place_balanced_at_rev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the commit whose placement is the baseline")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sparsity", type=float, default=0.9)
    add_json_arg(parser)
    args = parser.parse_args(argv)
    old = at_revision(args.rev).place_balanced
    torch.manual_seed(0)
    rows, out = [], []
    for name, (shape, width, height) in CASES.items():
        weight = torch.randn(shape)
        mask = torch.rand(shape) >= args.sparsity
        a, b = old(weight, mask, width, height), place_balanced(weight, mask, width, height)
        equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        placed = (weight, mask, width, height)
        both = {"old": lambda at=placed: old(*at), "new": lambda at=placed: place_balanced(*at)}
        times = interleave(both, args.rounds)
        ratios = paired_ratios(times, "old")["new"]
        ratio = statistics.median(ratios)
        rows.append(
            [
                name,
                "yes" if equal else "NO",
                fmt_seconds(statistics.median(times["old"])),
                fmt_seconds(statistics.median(times["new"])),
                f"{ratio:.3f} ({min(ratios):.3f}-{max(ratios):.3f})",
            ]
        )
        out.append({"case": name, "equal": equal, "times": times, "ratios": ratios})
    print_table(
        f"place_balanced at {args.rev} (old) and now (new), {args.rounds} interleaved rounds",
        ["weight on region", "arrays equal", "old", "new", "new/old, median (range)"],
        rows,
    )
    if args.json:
        write_json(args.json, {"environment": environment(), "rev": args.rev, "cases": out})
    return 0 if all(r["equal"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
