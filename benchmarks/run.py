"""What the emulator costs to run, and what sparsity buys on the emulated mesh.

Targets:

* **fast executor**: ``sparsefx.run(program, inputs)`` of a GPT-2-small-shaped model (benchmarks/lower.py's
  builder: 12 layers, d_model 768, vocab 50257, 1x128 token ids) at 90% static sparsity on a 64x64 mesh
  takes at most 3x the dense PyTorch eager forward of the same model (the original ``nn.Module``, eval,
  ``torch.inference_mode``); the same model lowered onto ``wse2`` (757x996) runs in at most 2x the 64x64
  time (the cost grows with the work, not with idle PEs). Medians of per-round ratios, interleaved.
  Every call draws new token ids. GPT-2's GELU leaves no exact zeros, so from the second run on each
  kernel meets the situation of the first (the same departures, no input vector filtered) and the
  clock reuses its timing (``runtime/reuse.py``); the line "timed afresh" switches that off and times
  every kernel again, to show what a run whose zero pattern changes (a ReLU model) costs.
  ``--tensor-form`` adds the same afresh run without the clock's compiled loops
  (``runtime/compiled.py``; ``SPARSEFX_NUMBA=0``), interleaved with the others, and prints its ratio
  to the afresh run with them.
* **reference executor**: an MLP 256-1024-256 at 90%, batch 4, on a 16x16 mesh, in at most 60 s.
* **realized speedup**: at 90% the linear layers' emulated speedup over the dense baseline
  (``stats.dense.linear_realized``) is at least 0.8x the ideal ``1 / (1 - s)``; the table goes over
  sparsity 0.5 to 0.99 with the whole model's figure (balanced placement, as ``sparsefx.lower``'s default),
  plus the 90% model with ``placement="block"`` for comparison, and where the cycles go at 90% and 99%.
  Its *data-movement ceiling* is the dense baseline's linear cycles over the least any mapping of the
  same kernels could take on the mesh (``_floor``: each kernel's busiest lane must carry its inputs and
  its busiest column its outputs, ``in / lanes`` and ``out / columns`` messages of all rows, and its PEs
  their evenly spread AXPYs over all rows at once): on 64x64, activations alone cap GPT-2 small's
  linear layers below 8x. ``--sweep-mesh WxH`` runs the table on another mesh, one that holds the
  resident 50257x768 token embedding (32x32 does not: the lowering says it needs 111 columns).

Lowering mode: streaming. A pipelined GPT-2 small needs 521 columns of 64 PEs (every kernel resident at
once), so on 64x64 only the streaming lowering exists; wse2 uses the same mode, so that both meshes
run the same kernels. ``--pipelined-wse2`` also times the pipelined wse2 program (no target).

Sparsity: every linear layer, the 50257x768 lm_head included. The default filter keeps lm_head dense;
it would then hold 82% of the program's weights at 90% (38.6M of 47.1M), its cycles would be the same
in the sparse run and the baseline, and "the linear layers" of ``stats.dense`` (every sparse_matmul
kernel) would mix it in. The dense forward is the same either way (lm_head is about a sixth of it).

Lowering a 12-layer model takes 30 s to 3 minutes here (64x64); ``--programs DIR`` keeps the lowered
programs (one file per mesh, mode, sparsity and placement) and loads them on the next run instead
(delete them after changing the lowering). Setup (compile, lower, load) is not timed. Threads: torch's
default unless ``--threads N``; on a shared two-core machine one thread can be several times faster
for both sides.

    .venv/bin/python benchmarks/run.py [--rounds N] [--json PATH] [--plot PATH] [--programs DIR]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from _timing import (
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

import sparsefx
from sparsefx.errors import EmulationError
from sparsefx.models.gpt import GPT, GPTConfig
from sparsefx.runtime import reuse
from sparsefx.runtime.cost import axpy_cycles, rows_of, wavelets

MAX_RUN_OVER_DENSE, MAX_WSE2_OVER_64, MAX_REFERENCE_S, MIN_EFFICIENCY = 3.0, 2.0, 60.0, 0.8
SPARSITIES = (0.5, 0.75, 0.9, 0.95, 0.99)
TARGET_SPARSITY = 0.9
LINEAR = ["*.attn.*.weight", "*.mlp.*.weight", "lm_head.weight"]  # every nn.Linear of the GPT
MODE = "streaming"
PLOT = "docs/images/realized_speedup.png"


def gpt(layers: int, vocab: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """benchmarks/lower.py's model and input, seeded."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=layers, n_head=12, d_model=768, vocab_size=vocab, max_seq_len=1024)
    return GPT(config).eval(), torch.randint(0, vocab, (1, 128))


def program_for(
    args: argparse.Namespace, sparsity: float, mesh: str, mode: str = MODE, placement: str = "balanced"
) -> sparsefx.DataflowProgram:
    """The GPT lowered at ``sparsity`` onto ``mesh``, from ``--programs`` if kept there."""
    suffix = "" if placement == "balanced" else f"-{placement}"
    name = f"gpt{args.layers}x768-v{args.vocab}-s{sparsity}-{mesh}-{mode}{suffix}.sfxp"
    if name in _LOWERED:
        return _LOWERED[name]
    path = os.path.join(args.programs, name) if args.programs else None
    if path and os.path.exists(path):
        _LOWERED[name] = sparsefx.load_program(path)
        return _LOWERED[name]
    model, ids = gpt(args.layers, args.vocab)
    config = {"algorithm": "static", "sparsity": sparsity, "param_filter": LINEAR}
    t0 = time.perf_counter()
    sm = sparsefx.compile(model, config, (ids,))
    what = f"lowering s={sparsity} onto {mesh}"
    with console.status(what) as status:  # plan-blocks times each layer on the clock: minutes on wse2

        def on_kernel(name: str, done: int, total: int) -> None:
            status.update(f"{what}: timing {name} ({done + 1}/{total})")

        program = sparsefx.lower(sm, (ids,), mesh=mesh, mode=mode, placement=placement, on_kernel=on_kernel)
    console.print(
        f"  lowered s={sparsity} onto {mesh} ({mode}, {placement}) in {time.perf_counter() - t0:.0f} s"
    )
    if path:
        os.makedirs(args.programs, exist_ok=True)
        program.save(path)
    _LOWERED[name] = program
    return program


_LOWERED: dict[str, sparsefx.DataflowProgram] = {}


# -- 1. fast executor speed ------------------------------------------------------------------------


TENSOR_FORM = "run 64x64, timed afresh, tensor form"
TENSOR_RATIO = "tensor form / compiled loops, timed afresh"


def fast_speed(args: argparse.Namespace) -> tuple[dict[str, Any], list[bool]]:
    model, ids = gpt(args.layers, args.vocab)  # the original module: compile prunes its own copy
    p64 = program_for(args, TARGET_SPARSITY, "64x64")
    dev = torch.device(args.device)
    model = model.to(dev)  # the dense forward runs where the executor does

    def new() -> tuple[torch.Tensor]:  # every call sees new token ids
        return (torch.randint(0, args.vocab, ids.shape, device=dev),)

    def on(fn: Callable[[], Any]) -> Callable[[], None]:
        def call() -> None:  # timed until the device has finished
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        return call

    fns = {
        "dense eager": on(lambda: _dense(model, *new())),
        "run 64x64": on(lambda: sparsefx.run(p64, new(), device=dev)),
        "run 64x64, timed afresh": on(lambda: _afresh(p64, new(), dev)),
    }
    if args.tensor_form:  # the same clock without its compiled loops (runtime/compiled.py)
        fns[TENSOR_FORM] = on(_tensor_form(lambda: _afresh(p64, new(), dev)))
    if not args.skip_wse2:
        pw = program_for(args, TARGET_SPARSITY, "wse2")
        fns["run wse2"] = on(lambda: sparsefx.run(pw, new(), device=dev))
    if args.pipelined_wse2:
        pp = program_for(args, TARGET_SPARSITY, "wse2", "pipelined")
        fns["run wse2 pipelined"] = on(lambda: sparsefx.run(pp, new(), device=dev))
    first = {}  # a program's first run merges its matrices and derives its structures (runtime/memo.py)
    for name, fn in fns.items():
        if name not in ("dense eager", "run 64x64, timed afresh", TENSOR_FORM):
            gc.collect()
            t0 = time.perf_counter()
            fn()
            first[name] = time.perf_counter() - t0
    console.print("first runs: " + ", ".join(f"{name} {fmt_seconds(t)}" for name, t in first.items()))
    console.print(f"timing {', '.join(fns)}: {args.rounds} rounds after {args.warmup} warm-up")
    samples = interleave(
        fns,
        args.rounds,
        args.warmup,
        before_each=gc.collect,
        on_round=lambda i: console.print(f"  round {i + 1}/{args.rounds}") if i >= 0 else None,
    )
    ratios = paired_ratios(samples, "dense eager")
    if "run wse2" in samples:
        ratios["run wse2 / run 64x64"] = [w / r for w, r in zip(samples["run wse2"], samples["run 64x64"])]
    tensor, afresh = samples.get(TENSOR_FORM), samples["run 64x64, timed afresh"]
    if tensor is not None:
        ratios[TENSOR_RATIO] = [t / c for t, c in zip(tensor, afresh)]
    summaries = {name: summarize(v) for name, v in samples.items()}
    ratio_summaries = {name: summarize(v) for name, v in ratios.items()}
    rows = [
        [name, fmt_seconds(s.median), f"[{fmt_seconds(s.p25)}–{fmt_seconds(s.p75)}]",
         fmt_ratio(ratio_summaries[name]) if name in ratio_summaries else "1"]
        for name, s in summaries.items()
    ]  # fmt: skip
    print_table(
        f"sparsefx.run against the dense eager forward (GPT-2 small, 90%, {MODE}, on {dev}, "
        f"{args.rounds} rounds)",
        ["", "median", "IQR", "÷ dense eager [IQR]"],
        rows,
    )
    if tensor is not None:
        console.print(f"{TENSOR_RATIO}: {fmt_ci(ratio_summaries[TENSOR_RATIO])} (no target)")
    checks = [("run 64x64 ÷ dense eager", "run 64x64", MAX_RUN_OVER_DENSE)]
    if "run wse2" in samples:
        checks.append(("run wse2 ÷ run 64x64", "run wse2 / run 64x64", MAX_WSE2_OVER_64))
    passed = []
    for what, key, limit in checks:
        ok = ratio_summaries[key].median <= limit
        passed.append(ok)
        console.print(f"{what}: {fmt_ci(ratio_summaries[key])}, target <= {limit:g}x: {verdict(ok)}")
    out = {
        "first_run_s": first,
        "samples": samples,
        "summaries": {k: v.as_dict() for k, v in summaries.items()},
        "ratios": ratios,
        "ratio_summaries": {k: v.as_dict() for k, v in ratio_summaries.items()},
        "targets": {key: limit for _, key, limit in checks},
        "passed": passed,
    }
    return out, passed


def _tensor_form(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` with the clock's compiled loops switched off (``SPARSEFX_NUMBA=0``, read on every call)."""

    def call() -> None:
        before = os.environ.get("SPARSEFX_NUMBA")
        os.environ["SPARSEFX_NUMBA"] = "0"
        try:
            fn()
        finally:
            if before is None:
                del os.environ["SPARSEFX_NUMBA"]
            else:
                os.environ["SPARSEFX_NUMBA"] = before

    return call


def _afresh(program: sparsefx.DataflowProgram, inputs: tuple, device: torch.device) -> None:
    """``sparsefx.run`` with every kernel timed again: no timing reused (``runtime/reuse.py``'s ``REUSE``)."""
    reuse.REUSE = False
    try:
        sparsefx.run(program, inputs, device=device)
    finally:
        reuse.REUSE = True


def _dense(model: torch.nn.Module, ids: torch.Tensor) -> None:
    with torch.inference_mode():
        model(ids)


# -- 2. reference executor speed --------------------------------------------------------------------


def reference_speed(args: argparse.Namespace) -> tuple[dict[str, Any], list[bool]]:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    x = torch.randn(4, 256)
    sm = sparsefx.compile(mlp, 0.9, (x,))
    program = sparsefx.lower(sm, (x,), mesh=(16, 16))
    fast = sparsefx.run(program, (x,))
    times = []
    try:
        for _ in range(args.reference_rounds):
            t0 = time.perf_counter()
            result = sparsefx.run(program, (x,), executor="reference")
            times.append(time.perf_counter() - t0)
    except EmulationError as e:
        console.print(f"reference executor (MLP 256-1024-256, 16x16): not available ({e}): {verdict(False)}")
        return {"available": False, "why": str(e)}, [False]
    s = summarize(times)
    ok = s.median <= MAX_REFERENCE_S
    agree = torch.allclose(result.outputs, fast.outputs, rtol=1e-4, atol=1e-5)
    console.print(
        f"reference executor (MLP 256-1024-256 at 90%, batch 4, 16x16): {fmt_seconds(s.median)} "
        f"(median of {s.n}), target <= {MAX_REFERENCE_S:.0f} s: {verdict(ok)}; cycles {result.stats.cycles} "
        f"against the fast clock's {fast.stats.cycles}; outputs {'agree' if agree else 'DIFFER'}"
    )
    return {
        "available": True,
        "seconds": times,
        "summary": s.as_dict(),
        "cycles": result.stats.cycles,
        "fast_cycles": fast.stats.cycles,
        "outputs_agree": agree,
        "passed": ok,
    }, [ok]


# -- 3. realized speedup ----------------------------------------------------------------------------


def realized(args: argparse.Namespace) -> tuple[dict[str, Any], list[bool]]:
    model, ids = gpt(args.layers, args.vocab)
    del model
    rows = [_row(s, program_for(args, s, args.sweep_mesh), ids) for s in args.sparsities]
    block = []  # the same model with placement="block", for comparison
    if not args.skip_block:
        block.append(
            _row(TARGET_SPARSITY, program_for(args, TARGET_SPARSITY, args.sweep_mesh, placement="block"), ids)
        )
    print_table(
        f"Emulated speedup over the dense baseline (GPT-2 small, {args.sweep_mesh}, {MODE}, "
        "balanced placement)",
        ["sparsity", "ideal 1/(1-s)", "data-movement ceiling", "linear layers", "efficiency",
         "whole model", "efficiency"],
        [
            [f"{r['sparsity']:g}" + ("" if r["placement"] == "balanced" else f" ({r['placement']})"),
             f"{r['ideal']:.2f}x", f"{r['ceiling']:.2f}x", f"{r['linear_realized']:.2f}x",
             f"{r['linear_efficiency']:.2f}", f"{r['realized']:.2f}x", f"{r['efficiency']:.2f}"]
            for r in rows + block
        ],
    )  # fmt: skip
    for r in rows + block:
        if r["sparsity"] in (TARGET_SPARSITY, max(args.sparsities)):
            _parts_table(r)
    passed = []
    at = [r for r in rows if math.isclose(r["sparsity"], TARGET_SPARSITY)]
    if at:
        r = at[0]
        ok = r["linear_realized"] >= MIN_EFFICIENCY * r["ideal"]
        passed.append(ok)
        console.print(
            f"linear layers at {TARGET_SPARSITY:g}: {r['linear_realized']:.2f}x against ideal "
            f"{r['ideal']:.2f}x (efficiency {r['linear_efficiency']:.2f}), target >= {MIN_EFFICIENCY}: "
            f"{verdict(ok)}"
        )
    if args.plot:
        _plot(rows, block, args.plot, args.sweep_mesh)
        console.print(f"plot: {args.plot}")
    return {"rows": rows, "block": block, "passed": passed}, passed


def _row(s: float, program: sparsefx.DataflowProgram, ids: torch.Tensor) -> dict[str, Any]:
    """One line of the table: the run's comparison with its dense baseline."""
    stats = sparsefx.run(program, (ids,)).stats
    d = stats.dense
    if d is None:
        raise SystemExit(f"no dense baseline at s={s}: {stats.dense_unavailable}")
    return {
        "sparsity": s,
        "placement": program.placement,
        "mesh": str(program.mesh),
        "ceiling": d.linear_dense_cycles / max(_floor(program), 1),
        "program_sparsity": d.sparsity,
        "ideal": d.ideal,
        "linear_realized": d.linear_realized,
        "linear_efficiency": d.linear_realized / d.ideal,
        "realized": d.realized,
        "efficiency": d.efficiency,
        "cycles": d.sparse_cycles,
        "dense_cycles": d.dense_cycles,
        "linear_cycles": d.linear_sparse_cycles,
        "linear_dense_cycles": d.linear_dense_cycles,
        "parts": d.parts,
    }


def _floor(program: sparsefx.DataflowProgram) -> int:
    """The fewest cycles any mapping of the program's sparse matmuls could take on its mesh, with
    features on lanes and partial sums down columns: each kernel waits for its busiest lane to carry its
    inputs (``in / lanes`` messages of one block of all rows), for its busiest column to carry its
    outputs (``out / columns``), and for its PEs' AXPYs, evenly spread and over all rows at once."""
    hw, mesh = program.hardware, program.mesh
    total = 0
    for k in program.kernels:
        if k.op != "sparse_matmul":
            continue
        rows, f_in, f_out = rows_of(k.shape), int(k.attrs["in_features"]), int(k.attrs["out_features"])
        wave = wavelets(rows, k.dtype, hw)
        io = max(math.ceil(f_in / min(mesh.height, f_in)), math.ceil(f_out / min(mesh.width, f_out))) * wave
        mac = math.ceil(int(k.stats["nnz"]) / (mesh.width * mesh.height)) * axpy_cycles(rows, k.dtype, hw)
        total += max(io, mac)
    return total


def _parts_table(r: dict[str, Any]) -> None:
    gap = sum(p["excess"] for p in r["parts"].values())
    print_table(
        f"Where the cycles go at s={r['sparsity']:g}, {r['placement']} placement (critical path; "
        "excess = sparse - (1-s) x dense)",
        ["part", "sparse", "dense", "(1-s) x dense", "excess", "share of gap"],
        [
            [name, f"{p['sparse']:,}", f"{p['dense']:,}", f"{p['ideal']:,.0f}", f"{p['excess']:,.0f}",
             f"{p['excess'] / gap:.0%}" if gap else "-"]
            for name, p in r["parts"].items()
        ],
    )  # fmt: skip


def _plot(rows: list[dict[str, Any]], block: list[dict[str, Any]], path: str, mesh: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = [r["sparsity"] for r in rows]
    x = [1 / (1 - v) for v in s]  # the axis runs in 1 / (1 - s), labelled with s
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot([min(x), max(x)], [min(x), max(x)], color="0.5", linestyle="--", label="ideal 1/(1-s)")
    ax.plot(x, [r["linear_realized"] for r in rows], "o-", label="linear layers")
    ax.plot(x, [r["realized"] for r in rows], "s-", label="whole model")
    for r in block:  # the same model with placement="block"
        ax.plot([1 / (1 - r["sparsity"])], [r["linear_realized"]], "o", color="C0", fillstyle="none", ms=9)
        ax.plot([1 / (1 - r["sparsity"])], [r["realized"]], "s", color="C1", fillstyle="none", ms=9)
    if block:
        ax.plot([], [], "o", color="0.3", fillstyle="none", label="placement='block' (hollow)")
    ax.axhline(1.0, color="0.3", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{v:g}" for v in s])
    ax.minorticks_off()
    ax.set_xlabel("sparsity s (axis in 1/(1-s))")
    ax.set_ylabel("speedup over the dense baseline (emulated cycles)")
    ax.plot(x, [r["ceiling"] for r in rows], ":", color="0.4", label="data-movement ceiling")
    ax.set_title(f"GPT-2 small on a {mesh} mesh, streaming, balanced placement")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds of the interleaved runs (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    p.add_argument("--reference-rounds", type=int, default=1, help="reference executor runs (default 1)")
    p.add_argument("--sparsities", type=float, nargs="+", default=list(SPARSITIES))
    p.add_argument("--programs", metavar="DIR", help="keep lowered programs here and reuse them")
    p.add_argument("--plot", metavar="PATH", default=PLOT, help=f"speedup plot (default {PLOT}; '': none)")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="where the speed runs go, dense forward too (default cpu)")
    p.add_argument("--skip-speed", action="store_true", help="skip the fast executor timing")
    p.add_argument("--skip-wse2", action="store_true", help="time the 64x64 program only")
    p.add_argument(
        "--tensor-form",
        action="store_true",
        help="also time the 64x64 program afresh without the compiled loops (SPARSEFX_NUMBA=0), side by side",
    )
    p.add_argument("--pipelined-wse2", action="store_true", help="also time the pipelined wse2 program")
    p.add_argument("--skip-reference", action="store_true", help="skip the reference executor")
    p.add_argument("--skip-sweep", action="store_true", help="skip the realized-speedup table")
    p.add_argument("--skip-block", action="store_true", help="skip the block-placement line at 90%%")
    p.add_argument("--sweep-mesh", default="64x64", help="mesh of the realized-speedup table (default 64x64)")
    p.add_argument("--layers", type=int, default=12, help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, default=50257, help=argparse.SUPPRESS)
    add_json_arg(p)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    env = environment()
    console.print(f"torch {env['torch']}, {env['threads']} threads, load average {env['loadavg_at_start']}")
    payload: dict[str, Any] = {"environment": env, "args": vars(args)}
    passed: list[bool] = []
    for key, skip, fn in (
        ("reference", args.skip_reference, reference_speed),
        ("fast", args.skip_speed, fast_speed),
        ("realized", args.skip_sweep, realized),
    ):
        if skip:
            continue
        payload[key], ok = fn(args)
        passed += ok
    if args.json:
        write_json(args.json, payload)
    return 0 if passed and all(passed) else 1


if __name__ == "__main__":
    raise SystemExit(main())
