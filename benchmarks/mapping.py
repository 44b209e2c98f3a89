"""The mapping the lowering chose for each kernel of one GPT-2 small layer, and what each costs.

Lowers the pinned GPT-2 small (every linear layer at 90%, lm_head included; 1 x 128 tokens; 64x64;
streaming; balanced placement), times the program and its dense baseline on the fast clock, and lists
the kernels of its first layer: op, region, the mapping (``summary.mapping``: rows a block, row tiles,
the balanced placement's drift, packed indices) and each kernel's cycles, sparse and dense: its span
from its first task to its end, and, for the sparse program, its step, from the end of the kernel
before it (a streaming step also waits for its weights and for its first inputs to arrive). Nothing is
timed on the host: the figures are the emulator's cycles. ``--readme`` rewrites the README's table::

    .venv/bin/python benchmarks/mapping.py --readme
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch
from _timing import add_json_arg, environment, markdown_table, print_table, write_between_markers, write_json

import sparsefx
from sparsefx.runtime.baseline import dense_program
from sparsefx.runtime.fast import simulate
from sparsefx.runtime.summary import mapping

sys.path.insert(0, os.path.dirname(__file__))
from run import LINEAR, gpt  # noqa: E402  (the pinned model and filter)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- mapping:start -->", "<!-- mapping:end -->"
COLUMNS = ("kernel", "op", "region", "mapping", "sparse cycles", "dense cycles", "sparse step")
MESH, TOKENS, SPARSITY = "64x64", 128, 0.9


def measure(layers: int, vocab: int) -> list[dict[str, Any]]:
    """One row per kernel of the first layer (module docstring)."""
    model, _ = gpt(layers, vocab)
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (1, TOKENS))
    config = {"algorithm": "static", "sparsity": SPARSITY, "param_filter": LINEAR}
    sm = sparsefx.compile(model, config, (ids,))
    program = sparsefx.lower(sm, (ids,), mesh=MESH, mode="streaming")
    baseline = dense_program(program)
    assert baseline is not None, program.meta.get("dense_unavailable")
    timed = simulate(program, None).kernels
    spans = {t.name: t.end - t.start for t in timed}
    steps = {t.name: t.end - (timed[i - 1].end if i else 0) for i, t in enumerate(timed)}
    dense: dict[str, int] = {}
    for t in simulate(baseline, None).kernels:  # a dense pass <name>.dense<i> counts for <name>
        name = t.name.rsplit(".dense", 1)[0]
        dense[name] = dense.get(name, 0) + t.end - t.start
    names = [k.name for k in program.kernels]
    first = names.index("blocks_0_ln_1")
    last = names.index("blocks_1_ln_1") if "blocks_1_ln_1" in names else len(names)
    rows = []
    for k in program.kernels[first:last]:
        r = k.region
        rows.append(
            {
                "kernel": k.name,
                "op": k.op if k.op != "layout" else f"layout {k.attrs.get('fn')}",
                "region": f"{r.width}x{r.height}",
                "mapping": mapping(k) or "-",
                "sparse": spans.get(k.name, 0),
                "dense": dense.get(k.name, 0),
                "step": steps.get(k.name, 0),
            }
        )
    return rows


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            r["kernel"],
            r["op"],
            r["region"],
            r["mapping"],
            f"{r['sparse']:,}",
            f"{r['dense']:,}",
            f"{r['step']:,}",
        ]
        for r in rows
    ]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README's text between the markers: the settings, then the table."""
    intro = (
        f"GPT-2 small's first layer at {SPARSITY:.0%} (1 x {TOKENS} tokens, {MESH}, streaming, balanced "
        "placement); each kernel's span on the fast clock (first task to end), in the sparse program and in "
        "the dense baseline, and its step in the sparse program (from the previous kernel's end: the wait "
        "for its weights and first inputs included); `.venv/bin/python benchmarks/mapping.py --readme` "
        "measures it again."
    )
    return markdown_table(intro, COLUMNS, table_rows(rows))


def write_readme(rows: list[dict[str, Any]], path: Path = README) -> None:
    """Rewrite the table between the README's markers, atomically."""
    write_between_markers(path, START, END, markdown(rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--readme", action="store_true", help="rewrite the README's table (pinned model only)")
    p.add_argument("--layers", type=int, default=12, help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, default=50257, help=argparse.SUPPRESS)
    add_json_arg(p)
    args = p.parse_args(argv)
    if args.readme and (args.layers, args.vocab) != (12, 50257):
        p.error("--readme takes the pinned model only")
    rows = measure(args.layers, args.vocab)
    print_table("The mapping of GPT-2 small's first layer (90%, 64x64, streaming)", COLUMNS, table_rows(rows))
    if args.json:
        write_json(args.json, {"rows": rows, "environment": environment()})
    if args.readme:
        write_readme(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
