"""What a pipelined program's throughput gains from sparsity, and how even its stages are.

Targets (issue: "pipelined mode that uses the mesh"), on the demo's model, gpt-tiny, at 90% with
every linear layer sparse (its LM head too), pipelined on 64x64, balanced placement:

* the throughput speedup (the dense baseline's steady-state interval over the sparse program's,
  each program with its own columns shared by its own measurements) is at least half the whole
  model's ideal, its dense/sparse FLOP ratio;
* no kernel's busy time (its busiest PE's cycles an input) exceeds twice the mean over the kernels.

The sparse program and its dense baseline are lowered together and run on the same inputs in this
process; the figures are the emulator's cycles, so nothing is timed on the host::

    .venv/bin/python benchmarks/pipeline.py [--json PATH]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from _timing import add_json_arg, environment, print_table, verdict, write_json

import sparsefx
from sparsefx.models.registry import build_model
from sparsefx.runtime.baseline import dense_program
from sparsefx.runtime.fast import simulate

MODEL, MESH, SPARSITY = "gpt-tiny", "64x64", 0.9
LINEAR = ["*.attn.*.weight", "*.mlp.*.weight", "lm_head.weight"]  # every linear layer of the GPT


def measure() -> dict[str, Any]:
    """The pipelined program and its dense baseline: intervals, the speedups and each kernel's busy time."""
    spec = build_model(MODEL, seed=0)
    config = {"algorithm": "static", "sparsity": SPARSITY, "param_filter": LINEAR}
    sm = sparsefx.compile(spec.model, config, spec.args)
    program = sparsefx.lower(sm, spec.args, mesh=MESH, mode="pipelined")
    torch.manual_seed(1)
    result = sparsefx.run(program, spec.args)
    torch.testing.assert_close(result.outputs, sm.eval()(*spec.args), rtol=1e-4, atol=1e-5)
    c = result.stats.dense
    assert c is not None, result.stats.dense_unavailable
    baseline = dense_program(program)
    assert baseline is not None
    dense_busy = {kt.name: kt.busy_sums()[0] for kt in simulate(baseline).kernels}
    kernels = [
        {
            "kernel": k.name,
            "op": k.op,
            "columns": k.region.width,
            "dense columns": baseline.kernel(k.name).region.width,
            "busy": kt.busy_sums()[0],
            "dense busy": dense_busy[k.name],
        }
        for k, kt in zip(program.kernels, simulate(program).kernels)
    ]
    busy = [r["busy"] for r in kernels]
    return {
        "sparse_interval": c.sparse_interval,
        "dense_interval": c.dense_interval,
        "throughput": c.throughput_realized,
        "flop_ratio": c.flop_ratio,
        "latency_speedup": c.realized,
        "busiest_over_mean": max(busy) / (sum(busy) / len(busy)),
        "kernels": kernels,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_json_arg(p)
    args = p.parse_args(argv)
    r = measure()
    print_table(
        f"{MODEL} at {SPARSITY:.0%} (LM head too), pipelined on {MESH}: each kernel's busiest PE an input",
        ["kernel", "op", "columns", "busy", "dense columns", "dense busy"],
        [
            [
                k["kernel"],
                k["op"],
                str(k["columns"]),
                f"{k['busy']:,}",
                str(k["dense columns"]),
                f"{k['dense busy']:,}",
            ]
            for k in r["kernels"]
        ],
    )
    half, spread = r["flop_ratio"] / 2, r["busiest_over_mean"]
    intervals = f"{r['sparse_interval']:,} / {r['dense_interval']:,} cycles"
    rows = [
        ["steady-state interval, sparse / dense", intervals, "", ""],
        ["throughput speedup", f"{r['throughput']:.2f}x", f">= {half:.2f}x (half of {r['flop_ratio']:.2f}x)",
         verdict(r["throughput"] >= half)],
        ["latency speedup", f"{r['latency_speedup']:.2f}x", "info", ""],
        ["busiest kernel over the mean", f"{spread:.2f}", "<= 2", verdict(spread <= 2)],
    ]  # fmt: skip
    print_table("Pipelined throughput", ["what", "figure", "target", ""], rows)
    if args.json:
        write_json(args.json, {**r, "environment": environment()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
