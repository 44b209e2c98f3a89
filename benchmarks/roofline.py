"""The token roofline: what sparsity buys on the mesh as the tokens per step grow.

For each mesh and batch (``B x 128`` tokens) this lowers the pinned GPT-2 small (every linear layer at
90%, lm_head included; streaming; balanced placement) and runs it once on seeded token ids, then
prints, beside each figure's ideal:

* **linear layers**: ``stats.dense.linear_realized`` against ``1 / (1 - s)`` = 10x, and what binds them:
  the largest part of their cycles in the sparse run (``stats.dense.parts``, the sparse matmuls' share:
  *compute*, the busiest PE's AXPYs, imbalance and task starts; *activation movement*, the rest of their
  span, values arriving and partial sums and results leaving; *weight load*, waiting for their weights),
  with its share;
* **whole model**: ``stats.dense.realized`` against the FLOP ratio, and the largest part of the sparse
  run's cycles, those three or *dense ops* (every other kernel; results leaving for the host count as
  activation movement), with its share, and the dense ops' share beside it where another part is
  larger. ``load`` is the weight-load channel's busy share of the run: the
  loads are serial, so near 1 the weight stream binds however the kernels are mapped.

A batch whose values a streaming program cannot keep in SRAM between steps does not lower (each value
a later step reads waits on its producer's east column, ``runtime/held.py``): its row says so. A batch
that lowers with the lowering's warning that kept values overflow a PE (``held.held_peak``: the step,
the PE and the values) is measured, but its figures assume SRAM the mesh does not have: the last column
names the PE, the bytes it would need and the value kept there.

Nothing here is timed on the host: every figure is the emulator's cycles, so one run per case suffices.
``--readme`` rewrites the README's table between its markers; ``--from-json`` reuses a run::

    .venv/bin/python benchmarks/roofline.py --json out/roofline.json --readme     # 64x64 and wse2
    .venv/bin/python benchmarks/roofline.py --from-json out/roofline.json --readme
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from _timing import (
    add_json_arg,
    console,
    environment,
    markdown_table,
    print_table,
    write_between_markers,
    write_json,
)

import sparsefx
from sparsefx.errors import LoweringError
from sparsefx.runtime.cost import load_cycles
from sparsefx.runtime.held import held_peak
from sparsefx.runtime.layout import weight_bytes

sys.path.insert(0, os.path.dirname(__file__))
from run import LINEAR, gpt  # noqa: E402  (the pinned model and filter)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- roofline:start -->", "<!-- roofline:end -->"
PLOT = "docs/images/token_roofline.png"
SPARSITY, TOKENS = 0.9, 128
MESHES, BATCHES = ("64x64", "wse2"), (1, 4, 16, 64)
COMMAND = ".venv/bin/python benchmarks/roofline.py --readme"
PARTS = {  # stats.dense.parts -> the name the table gives it
    "mac": "compute",
    "imbalance": "compute",
    "task_overhead": "compute",
    "communication": "activation movement",
    "weight_load": "weight load",
    "dense_ops": "dense ops",
}


def measure(mesh: str, batch: int, layers: int, vocab: int) -> dict[str, Any]:
    """Lower and run one case; its figures (module docstring)."""
    model, _ = gpt(layers, vocab)
    torch.manual_seed(batch)
    ids = torch.randint(0, vocab, (batch, TOKENS))
    config = {"algorithm": "static", "sparsity": SPARSITY, "param_filter": LINEAR}
    sm = sparsefx.compile(model, config, (ids,))
    what = f"{mesh}, batch {batch}"
    t0 = time.perf_counter()
    with console.status(f"lowering {what}") as status:

        def on_kernel(name: str, done: int, total: int) -> None:
            status.update(f"lowering {what}: timing {name} ({done + 1}/{total})")

        try:
            with warnings.catch_warnings():  # an overflow is the table's last column, not a warning
                warnings.filterwarnings("ignore", "sparsefx.lower: streaming step")
                program = sparsefx.lower(sm, (ids,), mesh=mesh, mode="streaming", on_kernel=on_kernel)
        except LoweringError as e:  # a row of the table too: where the mesh stops taking the model
            console.print(f"  {what}: does not lower: {e}")
            return {"mesh": mesh, "batch": batch, "tokens": batch * TOKENS, "error": _short(str(e))}
        lowered = time.perf_counter() - t0
        status.update(f"running {what}")
        fresh = torch.randint(0, vocab, (batch, TOKENS))
        stats = sparsefx.run(program, (fresh,)).stats
    d = stats.dense
    assert d is not None, stats.dense_unavailable
    loads = sum(load_cycles(weight_bytes(program, k), program.hardware) for k in program.kernels)
    parts: dict[str, int] = {}
    for part, name in PARTS.items():
        parts[name] = parts.get(name, 0) + int(d.parts[part]["sparse"])
    linear = {name: cycles for name, cycles in parts.items() if name != "dense ops"}
    linear_binds = max(linear, key=linear.__getitem__)
    whole_binds = max(parts, key=parts.__getitem__)
    row = {
        "mesh": mesh,
        "batch": batch,
        "tokens": batch * TOKENS,
        "linear": d.linear_realized,
        "linear_ideal": d.layers_ideal,
        "linear_binds": linear_binds,
        "linear_binds_share": linear[linear_binds] / max(sum(linear.values()), 1),
        "whole": d.realized,
        "whole_ideal": d.flop_ratio,
        "whole_binds": whole_binds,
        "whole_binds_share": parts[whole_binds] / max(sum(parts.values()), 1),
        "parts": parts,
        "load_share": loads / stats.cycles,
        "bytes_per_nonzero": stats.bytes_per_nonzero,
        "cycles": d.sparse_cycles,
        "dense_cycles": d.dense_cycles,
        "lower_s": lowered,
        "overflow": _overflow(program),
    }
    console.print(
        f"  {what}: linear {row['linear']:.2f}x, whole {row['whole']:.2f}x "
        f"(lowered in {lowered:.0f} s, {time.perf_counter() - t0:.0f} s in all)"
    )
    return row


def _overflow(program: sparsefx.DataflowProgram) -> str | None:
    """Where kept values and a step's own data overflow a PE's SRAM (``held.held_peak``), in a few
    words; None where every step fits."""
    if not program.meta.get("kept_overflow"):
        return None
    peak = held_peak(program)
    assert peak is not None
    kept = ", ".join(peak.values[:2]) + (f" and {len(peak.values) - 2} more" if len(peak.values) > 2 else "")
    return (
        f"no: {peak.total / 1024:.0f} KB on PE ({peak.x}, {peak.y}) in step {peak.step} ({kept} kept), "
        f"{program.hardware.sram_bytes / 1024:.0f} KB a PE"
    )


def _short(why: str) -> str:
    """The lowering's reason, without the kernel list: ``kernels [...] do not fit their SRAM ...``."""
    if why.startswith("kernels [") and "] " in why:
        names = why[len("kernels [") : why.index("] ")].count(",") + 1
        return f"{names} kernels{why[why.index('] ') + 1 :]}"
    return why


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """One line per case: tokens, then the linear layers' and the whole model's figures."""
    out = []
    for r in rows:
        tokens = f"{r['batch']} x {TOKENS} = {r['tokens']:,}"
        if "error" in r:
            out.append([r["mesh"], tokens, f"does not lower: {r['error']}", "-", "-", "-"])
            continue
        binds = f"{r['linear_binds']} {r['linear_binds_share']:.0%}"
        linear = f"{_x(r['linear'])} of {r['linear_ideal']:.0f}x ({binds})"
        largest = f"{r['whole_binds']} {r['whole_binds_share']:.0%}"
        if r["whole_binds"] != "dense ops":  # the dense ops' share beside the largest part
            largest += f"; dense ops {r['parts']['dense ops'] / max(sum(r['parts'].values()), 1):.0%}"
        whole = f"{_x(r['whole'])} of {r['whole_ideal']:.2f}x ({largest})"
        fits = r.get("overflow") or "yes"
        out.append([r["mesh"], tokens, linear, whole, f"{r['load_share']:.2f}", fits])
    return out


COLUMNS = [
    "mesh",
    "tokens a step",
    "linear layers: realized of ideal (largest part of their cycles)",
    "whole model: realized of FLOP ratio (largest part)",
    "weight-load channel busy",
    "fits SRAM",
]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README's text between the markers: the settings, then the table."""
    intro = (
        f"GPT-2 small (untied, every linear layer at {SPARSITY:.0%}, lm_head included), streaming, balanced "
        "placement, batches of 128-token sequences; `.venv/bin/python benchmarks/roofline.py --readme` "
        "measures it again."
    )
    return markdown_table(intro, COLUMNS, table_rows(rows))


def write_readme(rows: list[dict[str, Any]], path: Path = README) -> None:
    """Rewrite the table between the README's markers, atomically."""
    write_between_markers(path, START, END, markdown(rows))


def table_in(text: str) -> list[list[str]]:
    """The body rows of the README's table, as cells."""
    inside = text.split(START, 1)[1].split(END, 1)[0]
    lines = [line for line in inside.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Realized speedup against tokens a step, a colour per mesh, with the ideals; a case that does not
    lower is a cross on the axis, and one whose kept values overflow SRAM is ringed in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    meshes = list(dict.fromkeys(r["mesh"] for r in rows))
    for i, (mesh, color) in enumerate(zip(meshes, ("tab:blue", "tab:green", "tab:purple"))):
        mine = [r for r in rows if r["mesh"] == mesh and "error" not in r]
        tokens = [r["tokens"] for r in mine]
        ax.plot(tokens, [r["linear"] for r in mine], "o-", color=color, label=f"linear layers, {mesh}")
        ax.plot(tokens, [r["whole"] for r in mine], "s--", color=color, label=f"whole model, {mesh}")
        over = [r for r in mine if r.get("overflow")]
        if over:  # figures that assume SRAM the mesh lacks: ringed
            ax.plot(
                [r["tokens"] for r in over for _ in (0, 1)],
                [v for r in over for v in (r["linear"], r["whole"])],
                "o",
                mfc="none",
                mec="tab:red",
                ms=13,
                label=f"overflows SRAM, {mesh}",
            )
        failed = [r["tokens"] for r in rows if r["mesh"] == mesh and "error" in r]
        if failed:
            nudge = 0.9 + 0.2 * i / max(len(meshes) - 1, 1)  # side by side where several fail
            ax.plot(
                [t * nudge for t in failed],
                [0] * len(failed),
                "x",
                color=color,
                ms=9,
                clip_on=False,
                label=f"does not lower, {mesh}",
            )
    done = [r for r in rows if "error" not in r]
    if done:
        ax.axhline(done[0]["linear_ideal"], color="grey", lw=0.8, ls="-", label="linear ideal 1/(1-s)")
        ax.axhline(done[0]["whole_ideal"], color="grey", lw=0.8, ls="--", label="whole-model FLOP ratio")
    ax.set_xscale("log", base=2)
    ax.set_xticks(
        sorted({r["tokens"] for r in rows}), [f"{r:,}" for r in sorted({r["tokens"] for r in rows})]
    )
    ax.set_ylim(bottom=0)
    ax.set_xlabel("tokens a step (batch x 128)")
    ax.set_ylabel("speedup over dense on the mesh")
    ax.set_title(f"GPT-2 small at {SPARSITY:.0%}, streaming: the token roofline")
    ax.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--meshes", nargs="+", default=list(MESHES))
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--readme", action="store_true", help="rewrite the README's table (pinned settings only)")
    p.add_argument("--from-json", metavar="PATH", help="take the figures of an earlier --json run")
    p.add_argument("--plot", default=PLOT, help=f"the picture (default {PLOT}; '': none)")
    p.add_argument("--layers", type=int, default=12, help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, default=50257, help=argparse.SUPPRESS)
    add_json_arg(p)
    args = p.parse_args(argv)
    pinned = args.layers == 12 and args.vocab == 50257
    if args.readme and (not pinned or tuple(args.meshes) != MESHES or tuple(args.batches) != BATCHES):
        p.error("--readme takes the pinned model, meshes and batches only")
    if args.from_json:
        rows = json.loads(Path(args.from_json).read_text())["rows"]
    else:
        rows = [measure(m, b, args.layers, args.vocab) for m in args.meshes for b in args.batches]
    print_table("The token roofline (GPT-2 small at 90%, streaming)", COLUMNS, table_rows(rows))
    if args.json and not args.from_json:
        write_json(args.json, {"rows": rows, "environment": environment()})
    if args.plot:
        plot(rows, args.plot)
    if args.readme:
        write_readme(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
