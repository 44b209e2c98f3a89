"""How much the emulated speedup rests on the cost model's assumptions: each assumed cost halved and doubled.

The pinned model (``BENCHMARKS.md``): GPT-2 small, untied (``sparsefx.models.gpt``, 12 layers, d_model
768, vocab 50257, seeded with 0, eval), every linear layer at 90% static sparsity (lm_head included),
1 x 128 token ids, lowered streaming onto 64x64 with balanced placement (``benchmarks/run.py``'s
builder). For the default ``HardwareSpec`` and for each assumed cost halved and doubled, the model is
lowered again with that hardware (the lowering's tuner times block sizes, widths and row cuts on the
clock, so its choices depend on the costs; ``sparsefx.lower(..., hardware=...)``) and run once with the
fast executor. Each variant reports its total sparse cycles, the dense baseline's cycles, the linear
layers' realized speedup (``stats.dense.linear_realized``) and its fraction of the ideal 1/(1-s), and
the whole model's speedup (``stats.dense.realized``) and its fraction of its FLOP ratio. The console
table adds the linear layers' data-movement ceiling (``benchmarks/run.py``'s: the dense linear cycles
over the least any mapping could take, which activations moving through the mesh's links set) and
their speedup's fraction of it; the JSON (``--json``) adds where the cycles go (``stats.dense.parts``).

The assumptions varied are the ``HardwareSpec`` fields that ``runtime/mesh.py`` and
``docs/machine-model.md`` mark "assumption":

* **task start**, ``task_start_cycles`` (8): paid once per task;
* **vector operation start**, ``vector_start_cycles`` (2): each AXPY, each SIMD operation of another
  kernel's task, each partial-sum add;
* **fp32 SIMD width**, ``simd_widths["float32"]`` (2): half the published fp16 width; the model runs in
  fp32, so the fp16 and bf16 widths (published) are not varied;
* **weight streaming rate**, ``weight_bytes_per_s`` (150 GB/s): assumed equal to the host I/O rate;
* **SRAM bandwidth**, ``sram_bytes_per_cycle`` (27.7 bytes a cycle): derived from the published 20 PB/s
  over 850,000 cores at 850 MHz, with reads and writes assumed to share it (``cost.vector_cycles``).

Integers halve and double exactly (8 -> 4 and 16, 2 -> 1 and 4). The operations per element of the
other kernels (6 for a layer norm, 5 for softmax, 4 for a transcendental function) are also an
assumption, but they are a table in ``runtime/cost.py`` (``ELEMENT_OPS``, ``TRANSCENDENTAL``), not one
``HardwareSpec`` knob, so they are not varied here. The partial-sum add and the norms' all-reduce are
rules built from the task and vector starts above, and move with them. Cited figures are not varied:
the hop (``hop_cycles``), the wavelet size and link rate, the SRAM size, the colors, the clock and the
host I/O rate.

Cycle counts are the same on every machine and thread count (one thread unless ``--threads N``).
Lowering dominates: 1.5-4 minutes per variant for the pinned model on a shared two-core machine,
20 minutes for the 11 (1,187 s, one thread, beside another benchmark). ``--from-json PATH`` prints
the table of an earlier ``--json`` run, and with ``--readme`` writes it, without measuring.
``--layers``, ``--vocab`` and ``--mesh`` shrink the run for development; the README table comes
from the pinned settings only (``--readme`` refuses others)::

    .venv/bin/python benchmarks/sensitivity.py --readme --json out/sensitivity.json   # about 5 minutes
    .venv/bin/python benchmarks/sensitivity.py --from-json out/sensitivity.json --readme  # seconds
    .venv/bin/python benchmarks/sensitivity.py --layers 2 --vocab 1000                # development
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import re
import shutil
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Only light imports here: tests/test_sensitivity_table.py imports this file for its variant list and
# table format without building a model. torch, sparsefx's lowering and the other benchmark scripts
# are imported where the measurement needs them.
from sparsefx.runtime.mesh import HardwareSpec

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- sensitivity:start -->", "<!-- sensitivity:end -->"
LAYERS, VOCAB, MESH, SPARSITY = 12, 50257, "64x64", 0.9
COMMAND = ".venv/bin/python benchmarks/sensitivity.py --readme"
HEADER = (
    "assumption",
    "field",
    "value",
    "linear layers (fraction of 1/(1-s))",
    "whole model (fraction of its FLOP ratio)",
)


@dataclass(frozen=True)
class Variant:
    """One hardware to lower and run on: the defaults, or one assumed cost scaled by ``factor``."""

    assumption: str  # what the cost is, in words
    field: str  # the HardwareSpec field, as the README shows it
    value: str  # the value used, as the README shows it
    factor: float  # 1 for the defaults, 0.5 halved, 2 doubled
    hardware: HardwareSpec

    def cells(self) -> tuple[str, str, str]:
        """The row's first three cells in the README table."""
        return self.assumption, self.field, self.value


# (what, how the README names the field, how to read it, how to set it, how to show a value)
ASSUMPTIONS: tuple[tuple[str, str, Any, Any, Any], ...] = (
    (
        "task start",
        "`task_start_cycles`",
        lambda hw: hw.task_start_cycles,
        lambda hw, v: dataclasses.replace(hw, task_start_cycles=v),
        lambda v: f"{v} cycle{'s' * (v != 1)}",
    ),
    (
        "vector operation start",
        "`vector_start_cycles`",
        lambda hw: hw.vector_start_cycles,
        lambda hw, v: dataclasses.replace(hw, vector_start_cycles=v),
        lambda v: f"{v} cycle{'s' * (v != 1)}",
    ),
    (
        "fp32 SIMD width",
        '`simd_widths["float32"]`',
        lambda hw: hw.simd_widths["float32"],
        lambda hw, v: dataclasses.replace(hw, simd_widths={**hw.simd_widths, "float32": v}),
        lambda v: f"{v} lane{'s' * (v != 1)}",
    ),
    (
        "weight streaming rate",
        "`weight_bytes_per_s`",
        lambda hw: hw.weight_bytes_per_s,
        lambda hw, v: dataclasses.replace(hw, weight_bytes_per_s=v),
        lambda v: f"{v / 1e9:g} GB/s",
    ),
    (
        "SRAM bandwidth",
        "`sram_bytes_per_cycle`",
        lambda hw: hw.sram_bytes_per_cycle,
        lambda hw, v: dataclasses.replace(hw, sram_bytes_per_cycle=v),
        lambda v: f"{v:.1f} bytes/cycle",
    ),
)
"""The assumed costs varied, in table order (module docstring)."""


def _scaled(value: int | float, factor: float) -> int | float:
    """``value`` halved or doubled; an integer stays an integer (2 -> 1, 8 -> 4) and at least 1."""
    if isinstance(value, int):
        return max(1, int(value * factor))
    return value * factor


def variants(base: HardwareSpec | None = None) -> list[Variant]:
    """The defaults, then each assumption halved and doubled."""
    base = base or HardwareSpec()
    out = [Variant("none: the defaults", "-", "`HardwareSpec()`", 1.0, base)]
    for what, name, get, put, show in ASSUMPTIONS:
        for factor, word in ((0.5, "halved"), (2.0, "doubled")):
            value = _scaled(get(base), factor)
            out.append(Variant(what, name, f"{show(value)} ({word})", factor, put(base, value)))
    return out


# -- the table -------------------------------------------------------------------------------------


def _speedup(x: float, fraction: float) -> str:
    return f"{x:.2f}x ({fraction:.3f})"


def table_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    """The README table's rows from the measured figures (``measure``'s dicts)."""
    return [
        [r["assumption"], r["field"], r["value"],
         _speedup(r["linear_realized"], r["linear_fraction"]), _speedup(r["realized"], r["efficiency"])]
        for r in results
    ]  # fmt: skip


def markdown(results: list[dict[str, Any]]) -> str:
    """The text between the README's markers: a caption (the settings and both ideals), then the table."""
    first = results[0]
    caption = (
        f"{first.get('model', 'GPT-2 small')} (untied, every linear layer at {first['sparsity']:.0%}, "
        f"lm_head included), 1 x 128 tokens, {first['mesh']} streaming, balanced placement; the linear "
        f"layers' ideal is {first['ideal']:.2f}x, the whole model's FLOP ratio {first['flop_ratio']:.2f}x."
    )
    lines = [
        *textwrap.wrap(caption, 105, break_long_words=False, break_on_hyphens=False),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---" for _ in HEADER) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    return "\n".join(lines)


def replace_between_markers(text: str, body: str) -> str:
    """``text`` with what lies between ``START`` and ``END`` replaced by ``body``; every byte outside
    kept. Exactly one pair of markers, in order, or a ``ValueError``."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"the README must hold {START} once, then {END} once")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n\n{body}\n\n{END}{tail}"  # blank lines: the table is a block of its own


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``,
    keeping the file's permissions."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        if path.exists():
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_readme(results: list[dict[str, Any]], path: Path = README) -> None:
    """Rewrite the table between the README's markers, atomically."""
    with open(path, encoding="utf-8", newline="") as f:  # newline="": every byte as it is, \r too
        text = f.read()
    _write_atomic(path, replace_between_markers(text, markdown(results)))


def table_in(text: str) -> list[list[str]]:
    """The data rows of the table between the markers of ``text``, as lists of cells."""
    inside = text.split(START, 1)[1].split(END, 1)[0]
    rows = [line for line in inside.splitlines() if line.startswith("|")]
    if len(rows) < 2:
        return []
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows[2:]]


SPEEDUP = re.compile(r"^(\d+\.\d+)x \((\d+\.\d+)\)$")
"""A speedup cell: ``5.37x (0.537)``, the speedup and its fraction of the ideal."""


# -- the measurement -------------------------------------------------------------------------------


def measure(args: argparse.Namespace, variant: Variant, sm: Any, ids: Any) -> dict[str, Any]:
    """Lower ``sm`` with the variant's hardware, run it once; its figures."""
    from _timing import console
    from run import MODE, _floor

    import sparsefx

    what = f"lowering for {variant.assumption} = {variant.value}"
    t0 = time.perf_counter()
    with console.status(what) as status:

        def on_step(name: str) -> None:  # a line per step where no status line shows (a log file)
            if not console.is_terminal:
                console.print(f"  {what}: {name} ({time.perf_counter() - t0:.0f} s)")

        def on_kernel(name: str, done: int, total: int) -> None:
            status.update(f"{what}: timing {name} ({done + 1}/{total})")

        program = sparsefx.lower(
            sm, (ids,), mesh=args.mesh, mode=MODE, hardware=variant.hardware, on_step=on_step,
            on_kernel=on_kernel,
        )  # fmt: skip
    lowered = time.perf_counter() - t0
    t1 = time.perf_counter()
    stats = sparsefx.run(program, (ids,)).stats
    ran = time.perf_counter() - t1
    d = stats.dense
    if d is None:
        raise SystemExit(f"no dense baseline for {variant.assumption} = {variant.value}: "
                         f"{stats.dense_unavailable}")  # fmt: skip
    ceiling = d.linear_dense_cycles / max(_floor(program), 1)
    small = f"GPT-2 small's shape with {args.layers} layers, vocab {args.vocab}"
    out = {
        "model": "GPT-2 small" if (args.layers, args.vocab) == (LAYERS, VOCAB) else small,
        "assumption": variant.assumption,
        "field": variant.field,
        "value": variant.value,
        "factor": variant.factor,
        "hardware": variant.hardware.to_json(),
        "mesh": str(program.mesh),
        "placement": program.placement,
        "sparsity": d.sparsity,
        "sparse_cycles": d.sparse_cycles,
        "dense_cycles": d.dense_cycles,
        "linear_sparse_cycles": d.linear_sparse_cycles,
        "linear_dense_cycles": d.linear_dense_cycles,
        "ideal": d.ideal,
        "linear_realized": d.linear_realized,
        "linear_fraction": d.linear_realized / d.ideal,
        "ceiling": ceiling,
        "flop_ratio": d.flop_ratio,
        "realized": d.realized,
        "efficiency": d.efficiency,
        "parts": d.parts,
        "lower_s": lowered,
        "run_s": ran,
    }
    del program, stats
    gc.collect()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH", help="also write every figure to this JSON file (atomically)")
    p.add_argument("--readme", action="store_true", help="rewrite the README's table (pinned settings only)")
    p.add_argument("--layers", type=int, default=LAYERS, help=f"transformer blocks (default {LAYERS})")
    p.add_argument("--vocab", type=int, default=VOCAB, help=f"vocabulary (default {VOCAB})")
    p.add_argument("--mesh", default=MESH, help=f"mesh WxH (default {MESH})")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1; cycles do not vary)")
    p.add_argument("--from-json", metavar="PATH", help="print (or with --readme write) the table of an "
                   "earlier --json run instead of measuring")  # fmt: skip
    args = p.parse_args(argv)
    if args.from_json:
        return _from_json(p, args)
    pinned = (args.layers, args.vocab, args.mesh) == (LAYERS, VOCAB, MESH)
    if args.readme and not pinned:
        p.error(f"--readme takes the pinned settings only (--layers {LAYERS} --vocab {VOCAB} --mesh {MESH})")

    import torch
    from _timing import console, environment, print_table, write_json
    from run import LINEAR, MODE, gpt

    import sparsefx

    torch.set_num_threads(args.threads)
    env = environment()
    todo = variants()
    console.print(
        f"GPT{args.layers}x768, vocab {args.vocab}, untied, every linear layer at {SPARSITY:g} static "
        f"(seed 0), 1 x 128 tokens, {args.mesh} {MODE}, balanced placement; {len(todo)} variants; "
        f"torch {env['torch']}, {env['threads']} threads, load average {env['loadavg_at_start']}"
    )
    start = time.perf_counter()
    model, ids = gpt(args.layers, args.vocab)
    config = {"algorithm": "static", "sparsity": SPARSITY, "param_filter": LINEAR}
    sm = sparsefx.compile(model, config, (ids,))
    console.print(f"compiled in {time.perf_counter() - start:.0f} s")
    results = []
    for i, variant in enumerate(todo):
        r = measure(args, variant, sm, ids)
        results.append(r)
        console.print(
            f"[{i + 1}/{len(todo)}] {variant.assumption} = {variant.value}: sparse {r['sparse_cycles']:,} "
            f"cycles, dense {r['dense_cycles']:,}; linear {r['linear_realized']:.2f}x "
            f"({r['linear_fraction']:.3f} of ideal), whole {r['realized']:.2f}x ({r['efficiency']:.3f} of "
            f"FLOP ratio); lowered in {r['lower_s']:.0f} s, ran in {r['run_s']:.0f} s, "
            f"{time.perf_counter() - start:.0f} s elapsed"
        )
    elapsed = time.perf_counter() - start
    print_table(
        f"Realized speedup at {SPARSITY:g} with each assumed cost halved and doubled (GPT{args.layers}, "
        f"vocab {args.vocab}, {args.mesh}, {MODE}, balanced)",
        ["assumption", "value", "sparse cycles", "dense cycles", "linear", "of 1/(1-s)", "ceiling",
         "of ceiling", "whole", "of FLOP ratio"],
        [
            [r["assumption"], r["value"].replace("`", ""),
             f"{r['sparse_cycles']:,}", f"{r['dense_cycles']:,}",
             f"{r['linear_realized']:.2f}x", f"{r['linear_fraction']:.3f}", f"{r['ceiling']:.2f}x",
             f"{r['linear_realized'] / r['ceiling']:.3f}", f"{r['realized']:.2f}x", f"{r['efficiency']:.3f}"]
            for r in results
        ],
    )  # fmt: skip
    console.print(f"ideal 1/(1-s) {results[0]['ideal']:.2f}x, FLOP ratio {results[0]['flop_ratio']:.2f}x; "
                  f"{len(results)} variants in {elapsed:.0f} s")  # fmt: skip
    if args.json:
        write_json(args.json, {"environment": env, "args": vars(args), "pinned": pinned,
                               "elapsed_s": elapsed, "variants": results})  # fmt: skip
        console.print(f"figures: {args.json}")
    if args.readme:
        write_readme(results)
        console.print(f"README table rewritten ({README.name}, between {START} and {END})")
    else:
        console.print(markdown(results))
    return 0


def _from_json(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The table of an earlier ``--json`` run; ``--readme`` writes it where that run was pinned and its
    variants are this script's."""
    import json

    data = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
    results = data["variants"]
    if args.readme:
        if not data.get("pinned"):
            p.error(f"{args.from_json} was not measured with the pinned settings; --readme takes those only")
        have, want = [tuple(r[k] for k in ("assumption", "field", "value")) for r in results], [
            v.cells() for v in variants()
        ]
        if have != want:
            p.error(f"{args.from_json} holds other variants than this script's; measure again")
        write_readme(results)
        print(f"README table rewritten from {args.from_json}")
    else:
        print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
