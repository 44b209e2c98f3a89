"""How evenly ``block`` and ``balanced`` placement spread a weight's nonzeros, and how long placing takes.

For the GPT-2-small linear layers (``[out, in]``: qkv 2304x768, proj 768x768, fc 3072x768, proj2
768x3072; random masks at ``--sparsity``) on three regions each:

* ``64x64``;
* ``wse2 streaming``: the region ``sparsefx.lower`` gives a matmul on a wse2 mesh (757x996) in
  streaming mode: 996 lanes (the mesh height; GPT-2's widest value is its 50257 logits), and
  one column per output up to the mesh width;
* ``wse2 pipelined``: the widths ``sparsefx.lower`` gave these layers of gpt2-small at 90% on wse2
  in pipelined mode (qkv 2, proj 1, fc 3, proj2 3 columns of 996 lanes; the lm_head takes 390).

Imbalance is the most nonzeros on one PE over the mean per PE of the region. ``balanced`` holds
the same count on every PE to within one. ``block`` cannot even out the rows: a region taller than
the layer's inputs has empty lanes (996 lanes for 768 inputs leave 228 rows with nothing, a floor of
996 / 768 = 1.297), and one input per lane leaves each row with one input column's nonzero count.

Then ``place_sparse`` on the dense 50257x768 lm_head on a 757x768 region, and the lm_head at
``--sparsity`` on the whole wse2 mesh. Times are medians of ``--rounds`` interleaved rounds.

    .venv/bin/python benchmarks/placement.py [--rounds 5] [--big-rounds 3] [--sparsity 0.9] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
from typing import Any

import torch
from _timing import (
    add_json_arg,
    console,
    environment,
    fmt_seconds,
    interleave,
    paired_ratios,
    print_table,
    summarize,
    write_json,
)

from sparsefx.passes.lower.place_sparse import place_sparse
from sparsefx.runtime.csc import imbalance
from sparsefx.runtime.mesh import PRESETS
from sparsefx.runtime.program import PLACEMENTS, lane_bounds

LAYERS = {"qkv": (2304, 768), "proj": (768, 768), "fc": (3072, 768), "proj2": (768, 3072)}
PIPELINED_WIDTHS = {"qkv": 2, "proj": 1, "fc": 3, "proj2": 3}  # sparsefx.lower, gpt2-small 90%, wse2
LM_HEAD = (50257, 768)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per layer (default 5)")
    p.add_argument("--big-rounds", type=int, default=3, help="interleaved rounds per lm_head (default 3)")
    p.add_argument("--sparsity", type=float, default=0.9, help="share of pruned weights (default 0.9)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random masks (default 0)")
    add_json_arg(p)
    return p.parse_args(argv)


def masked(out: int, inp: int, keep: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random ``[out, in]`` weight, zero off a random mask that keeps about ``keep`` of it."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(out, inp, generator=gen) < keep if keep < 1 else torch.ones(out, inp, dtype=torch.bool)
    return torch.randn(out, inp, generator=gen) * mask, mask


def regions(name: str, nnz: int) -> dict[str, tuple[int, int]]:
    """The regions a layer is measured on: ``{label: (width, height)}``."""
    mesh = PRESETS["wse2"][0]
    out = LAYERS[name][0]
    lanes = mesh.height
    streaming = max(1, min(mesh.width, out))
    return {
        "64x64": (64, 64),
        "wse2 streaming": (streaming, lanes),
        "wse2 pipelined": (PIPELINED_WIDTHS[name], lanes),
    }


def measure(
    label: str, weight: torch.Tensor, mask: torch.Tensor, width: int, height: int, rounds: int
) -> dict[str, Any]:
    """Imbalance and placement time of both placements, interleaved."""
    fns = {pl: (lambda pl=pl: place_sparse(weight, mask, width, height, pl)) for pl in PLACEMENTS}
    figures: dict[str, Any] = {"case": label, "region": [width, height], "shape": list(weight.shape)}
    for pl, fn in fns.items():
        figures[f"imbalance_{pl}"] = imbalance(fn()["nz_ptr"])
    samples = interleave(fns, rounds, warmup=0, before_each=gc.collect)
    for pl in PLACEMENTS:
        figures[f"seconds_{pl}"] = summarize(samples[pl]).as_dict()
    figures["balanced_over_block_time"] = summarize(paired_ratios(samples, "block")["balanced"]).median
    bounds = lane_bounds(weight.shape[1], height)
    figures["empty_lanes"] = int((bounds[1:] == bounds[:-1]).sum())
    figures["nnz"] = int(mask.sum())
    return figures


def row(f: dict[str, Any]) -> list[str]:
    """One table row."""
    w, h = f["region"]
    per_pe = f["nnz"] / (w * h)
    return [
        f["case"],
        f"{w}x{h}",
        f"{f['empty_lanes']}/{h}",
        f"{per_pe:.1f}",
        f"{f['imbalance_block']:.3f}",
        f"{f['imbalance_balanced']:.3f}",
        fmt_seconds(f["seconds_block"]["median"]),
        fmt_seconds(f["seconds_balanced"]["median"]),
    ]


COLUMNS = [
    "layer [out, in]",
    "region",
    "empty lanes",
    "nnz / PE",
    "block",
    "balanced",
    "t block",
    "t balanced",
]


def peak_rss_gb() -> float:
    """The process's peak resident memory so far, GB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**30 if sys.platform == "darwin" else 2**20)


def main(argv: list[str] | None = None) -> int:
    """Measure every case, print the tables, optionally write JSON."""
    args = parse_args(argv)
    env = environment()
    keep = 1.0 - args.sparsity
    console.print(
        f"[bold]placement[/]: sparsity {args.sparsity:g}, seed {args.seed} | torch {env['torch']}, "
        f"{env['threads']} threads, {env['cpus']} CPUs, load {env['loadavg_at_start']}"
    )
    layers = []
    for i, (name, (out, inp)) in enumerate(LAYERS.items()):
        weight, mask = masked(out, inp, keep, args.seed + i)
        for label, (w, h) in regions(name, int(mask.sum())).items():
            layers.append(measure(f"{name} [{out}, {inp}] {label}", weight, mask, w, h, args.rounds))
    print_table(
        f"GPT-2-small linear layers, random {args.sparsity:g} masks: imbalance (max / mean nnz per PE) "
        f"and placement time (median of {args.rounds} rounds)",
        COLUMNS,
        [row(f) for f in layers],
    )
    big = []
    rss_before = peak_rss_gb()
    weight, mask = masked(*LM_HEAD, 1.0, args.seed)
    big.append(measure("lm_head dense", weight, mask, 757, 768, args.big_rounds))
    rss_dense = peak_rss_gb()
    del weight, mask
    gc.collect()
    mesh = PRESETS["wse2"][0]
    weight, mask = masked(*LM_HEAD, keep, args.seed)
    big.append(measure(f"lm_head {args.sparsity:g}", weight, mask, mesh.width, mesh.height, args.big_rounds))
    del weight, mask
    print_table(f"lm_head [50257, 768] (median of {args.big_rounds} rounds)", COLUMNS, [row(f) for f in big])
    for f in big:
        rate = f["nnz"] / f["seconds_balanced"]["median"] / 1e6
        console.print(
            f"{f['case']}: {f['nnz'] / 1e6:.1f} M nonzeros, balanced places {rate:.0f} M nonzeros/s"
        )
    console.print(
        f"peak RSS {rss_dense:.2f} GB after the dense lm_head ({rss_before:.2f} GB before it; "
        f"its weight and mask take {(LM_HEAD[0] * LM_HEAD[1] * 5) / 2**30:.2f} GB)"
    )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "placement",
                "args": vars(args),
                "environment": env,
                "layers": layers,
                "lm_head": big,
                "peak_rss_gb": {"before_lm_head": rss_before, "after_dense_lm_head": rss_dense},
            },
        )
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
