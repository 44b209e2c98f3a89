"""``sparsefx.run`` with its values on a GPU against the same run on the CPU, and what bounds it.

Target: the fast executor's run with ``device="cuda"`` is no slower than the same run on the CPU of the
same machine (``torch.set_num_threads(os.cpu_count())``); a ratio whose 95% interval reaches 1.0 passes.
It was 0.34 s on an H200 against 0.175 s on its 16 cores while the clock ran on the GPU (17,637 launches
and 6,615 host syncs per run). ``sparsefx.run`` now computes the values on the device and times them
on the host (``runtime/run.py``), so the table shows what the GPU run is left with. On an H100 machine
(16 cores, torch 2.11) two sessions measured the GPU run at 0.82x and 0.94x the CPU run (0.39-0.44 s
against 0.47-0.51 s), 1,277 launches and 3 host syncs a run (the zero patterns' one copy home, and an
embedding's id check), stats identical; the clock, on the host, is three quarters of the GPU run.
On the H200 machine (16 cores, torch 2.11, numba 0.68 for the clock's loops) one session measured the
GPU run at 0.81x the CPU run (329 ms against 377 ms, 95% interval 0.70-1.23), 1,276 launches and 4
host syncs, stats identical, logits within 5.4e-7; timed afresh 2.31 s against 2.30 s (1.07x), both
bound by the host clock.

Pinned settings (``BENCHMARKS.md``): GPT-2 small, untied (``sparsefx.models.gpt``, 12 layers, d_model
768, vocab 50257, seeded), every linear layer at 90% static sparsity (lm_head included), 1 x 128 token
ids drawn afresh for every call, lowered streaming onto 64x64 with balanced placement
(``benchmarks/run.py``'s builder). Side by side in one process, interleaved, a warm-up round first:

* **dense eager**: the original module on the GPU, ``torch.inference_mode``, synchronized;
* **run gpu**: ``sparsefx.run(program, ids, device="cuda")``, kernels' timings reused from run to run
  (GPT-2's GELU leaves no exact zeros, so every run meets the first run's situations);
* **run gpu, timed afresh**: the same with timing reuse switched off (``runtime/reuse.py``'s ``REUSE``),
  what a model whose zero pattern changes from run to run pays;
* **run cpu** and **run cpu, timed afresh**: the same two with ``device=None``.

Then one profiled GPU run of each kind counts CUDA kernel launches (the profiler's device kernel
events) and host syncs (``torch.cuda.set_sync_debug_mode("warn")``'s warnings), and the pieces of a run
are timed alone (evaluation with the zero patterns' copy home, the clock of the program and of its
dense baseline, the stats) to say what bounds it. Setup (compile, lower) is not timed; ``--programs
DIR`` keeps the lowered program. Without CUDA (or with ``--device cpu``) the same runs go to the CPU
and the GPU-only columns say n/a; ``--layers``/``--vocab``/``--mesh`` shrink the model to try it::

    bash benchmarks/gpu_run.sh                                     # on a GPU machine, the pinned settings
    .venv/bin/python benchmarks/gpu_run.py --device cpu --layers 2 --vocab 2048 --mesh 16x16
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from _timing import (
    Summary,
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
from run import LINEAR, MODE, TARGET_SPARSITY, _afresh, _dense, gpt, program_for

import sparsefx
from sparsefx.runtime.baseline import dense_activity, dense_program
from sparsefx.runtime.evaluate import evaluate
from sparsefx.runtime.fast import simulate
from sparsefx.runtime.report import report_data
from sparsefx.runtime.run import _Activity
from sparsefx.runtime.stats import collect, compare

DENSE = "dense eager"
NA = "n/a"


def main() -> int:
    args = _parse()
    gpu = args.device != "cpu" and torch.cuda.is_available()
    dev = torch.device(args.device if gpu else "cpu")
    torch.set_num_threads(args.threads)
    env = environment() | {"gpu": torch.cuda.get_device_name(dev) if gpu else None}
    _print_settings(args, env, dev)
    model, ids = gpt(args.layers, args.vocab)  # the original module: compile prunes its own copy
    program = program_for(args, TARGET_SPARSITY, args.mesh)
    console.print(f"program: {len(program.kernels)} kernels on {program.mesh} ({program.mode})")
    model = model.to(dev)
    fns = _candidates(args, model, program, ids, dev, gpu)
    first = _first_runs(args, program, ids, dev, gpu)
    console.print(f"timing {', '.join(fns)}: {args.rounds} rounds after {args.warmup} warm-up")
    samples = interleave(
        fns,
        args.rounds,
        args.warmup,
        before_each=gc.collect,
        on_round=lambda i: console.print(f"  round {i + 1}/{args.rounds}") if i >= 0 else None,
    )
    counts = _counts(args, program, ids, dev) if gpu else {}
    split = _split(args, program, ids, dev, gpu)
    out = _report(args, samples, counts, split, gpu)
    payload = {"environment": env, "args": vars(args), "first_runs": first, **out}
    if args.json:
        write_json(args.json, payload)
        console.print(f"figures: {args.json}")
    return 0 if out["passed"] in (None, True) and first.get("stats_identical", True) else 1


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="the GPU (default cuda; cpu: everything on the CPU)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds of the interleaved runs (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    p.add_argument("--split-rounds", type=int, default=3, help="rounds of the pieces timed alone (default 3)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: every CPU)")
    p.add_argument("--skip-afresh", action="store_true", help="time only the runs that reuse timings")
    p.add_argument("--programs", metavar="DIR", help="keep the lowered program here and reuse it")
    p.add_argument("--layers", type=int, default=12, help="GPT layers (default 12, GPT-2 small)")
    p.add_argument("--vocab", type=int, default=50257, help="vocabulary (default 50257)")
    p.add_argument("--mesh", default="64x64", help="mesh the program is lowered onto (default 64x64)")
    add_json_arg(p)
    args = p.parse_args()
    if args.json is None and os.environ.get("OUT"):
        args.json = os.path.join(os.environ["OUT"], "gpu_run.json")
    return args


def _print_settings(args: argparse.Namespace, env: dict[str, Any], dev: torch.device) -> None:
    console.print(
        f"torch {env['torch']}, {env['threads']} threads on {env['cpus']} CPUs, GPU {env['gpu'] or NA}, "
        f"load average {env['loadavg_at_start']}"
    )
    console.print(
        f"settings: GPT(n_layer={args.layers}, n_head=12, d_model=768, vocab_size={args.vocab}, "
        f"max_seq_len=1024), seed 0, eval; static {TARGET_SPARSITY:g}, param_filter {LINEAR}; 1 x 128 "
        f"token ids, new each call; {args.mesh}, {MODE}, balanced; values on {dev}, clock on the host; "
        f"{args.rounds} rounds after {args.warmup} warm-up"
    )


def _candidates(
    args: argparse.Namespace,
    model: torch.nn.Module,
    program: sparsefx.DataflowProgram,
    ids: torch.Tensor,
    dev: torch.device,
    gpu: bool,
) -> dict[str, Callable[[], None]]:
    """The timed calls, each drawing new token ids and returning once its device has finished."""

    def new(on: torch.device) -> tuple[torch.Tensor]:
        return (torch.randint(0, args.vocab, ids.shape, device=on),)

    def synced(fn: Callable[[], Any]) -> Callable[[], None]:
        def call() -> None:
            fn()
            if gpu:
                torch.cuda.synchronize(dev)

        return call

    cpu = torch.device("cpu")
    fns = {DENSE: synced(lambda: _dense(model, *new(dev)))}
    if gpu:
        fns["run gpu"] = synced(lambda: sparsefx.run(program, new(dev), device=dev))
        if not args.skip_afresh:
            fns["run gpu, timed afresh"] = synced(lambda: _afresh(program, new(dev), dev))
    fns["run cpu"] = lambda: sparsefx.run(program, new(cpu))
    if not args.skip_afresh:
        fns["run cpu, timed afresh"] = lambda: _afresh(program, new(cpu), None)
    return fns


def _first_runs(
    args: argparse.Namespace,
    program: sparsefx.DataflowProgram,
    ids: torch.Tensor,
    dev: torch.device,
    gpu: bool,
) -> dict[str, Any]:
    """Each run's first call on the same ids, timed once (a program's first run on a device moves its
    payloads there and merges its matrices, kept for later runs: ``runtime/memo.py``), and whether the
    GPU run's stats are the CPU run's, cycle for cycle, and its logits the same within float tolerance."""
    x = torch.randint(0, args.vocab, ids.shape)
    first, results = {}, {}
    for name, on in (("run cpu", None), ("run gpu", dev)) if gpu else (("run cpu", None),):
        gc.collect()
        t0 = time.perf_counter()
        results[name] = sparsefx.run(program, (x.to(on or "cpu"),), device=on)
        if gpu:
            torch.cuda.synchronize(dev)
        first[name] = time.perf_counter() - t0
    console.print("first runs: " + ", ".join(f"{n} {fmt_seconds(t)}" for n, t in first.items()))
    out: dict[str, Any] = {"first_run_s": first, "cycles": results["run cpu"].stats.cycles}
    if gpu:
        cpu, on_gpu = results["run cpu"], results["run gpu"]
        out["stats_identical"] = report_data(on_gpu.stats, program) == report_data(cpu.stats, program)
        out["logits_max_abs_diff"] = float((on_gpu.outputs.cpu() - cpu.outputs).abs().max())
        console.print(
            f"run gpu against run cpu on the same ids: stats identical {out['stats_identical']} "
            f"({cpu.stats.cycles:,} cycles), logits differ by at most {out['logits_max_abs_diff']:.2e}"
        )
    return out


def _counts(
    args: argparse.Namespace, program: sparsefx.DataflowProgram, ids: torch.Tensor, dev: torch.device
) -> dict[str, Any]:
    """CUDA kernel launches and host syncs of one GPU run, reusing timings and timed afresh."""
    out = {}
    for name, afresh in (("run gpu", False), ("run gpu, timed afresh", True)):

        def run(afresh: bool = afresh) -> None:
            x = (torch.randint(0, args.vocab, ids.shape, device=dev),)
            if afresh:
                _afresh(program, x, dev)
            else:
                sparsefx.run(program, x, device=dev)

        def synced(run: Callable[[], None] = run) -> None:
            run()
            torch.cuda.synchronize(dev)

        out[name] = _launches(synced) | _syncs(run, dev)
    return out


def _launches(call: Callable[[], None]) -> dict[str, Any]:
    """Device kernel events of one ``call`` (memory copies and sets apart), the host syncs the profiler
    saw (stream/device synchronizations, blocking copies), and the launches inside each of
    ``runtime/run.py``'s ranges."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            call()
    events = list(prof.events())
    device = [e for e in events if e.device_type == DeviceType.CUDA]
    copies = [e for e in device if e.name.startswith(("Memcpy", "Memset"))]
    launch_api = [e for e in events if e.name.startswith(("cudaLaunchKernel", "cuLaunchKernel"))]
    sync_api = [
        e for e in events if e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy")
    ]
    ranges = [e for e in events if e.name.startswith("sparsefx.run: ") and e.device_type != DeviceType.CUDA]
    per_range: dict[str, int] = {}
    for r in ranges:
        key = r.name.removeprefix("sparsefx.run: ")
        inside = sum(r.time_range.start <= e.time_range.start <= r.time_range.end for e in launch_api)
        per_range[key] = per_range.get(key, 0) + inside
    return {
        "launches": len(device) - len(copies),
        "copies": len(copies),
        "launch_calls": len(launch_api),
        "profiler_syncs": len(sync_api),
        "launches_per_range": per_range,
    }


def _syncs(run: Callable[[], None], dev: torch.device) -> dict[str, Any]:
    """Host syncs of one ``run`` (the benchmark's own synchronize after it left out): the warnings of
    ``torch.cuda.set_sync_debug_mode("warn")``, and where in the code each was raised."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(dev)
    sites = [f"{os.path.basename(w.filename)}:{w.lineno}" for w in seen if "synchroniz" in str(w.message)]
    return {"syncs": len(sites), "sync_sites": sites}


def _split(
    args: argparse.Namespace,
    program: sparsefx.DataflowProgram,
    ids: torch.Tensor,
    dev: torch.device,
    gpu: bool,
) -> dict[str, dict[str, float]]:
    """Median seconds of each piece of a run (reusing timings), called as ``sparsefx.run`` calls them:
    the evaluation (with the zero patterns' copy to the host), the clock (program and dense baseline),
    the stats; on the GPU and on the CPU."""
    dense = dense_program(program)
    out = {}
    for where, on in (("gpu", dev), ("cpu", None)) if gpu else (("cpu", None),):
        times: dict[str, list[float]] = {"evaluate": [], "clock": [], "stats": []}
        for _ in range(args.split_rounds):
            x = (torch.randint(0, args.vocab, ids.shape, device=on),)
            gc.collect()
            t0 = time.perf_counter()
            activity = _Activity(program)
            evaluate(program, x, on, listener=activity)
            activity.to_host()
            t1 = time.perf_counter()
            timeline = simulate(program, activity.seen)
            patterns = dense_activity(activity.seen, dense) if dense is not None else None
            timed = simulate(dense, patterns) if dense is not None else None
            t2 = time.perf_counter()
            stats = collect(program, timeline, "fast")
            if dense is not None:
                stats.dense = compare(program, stats, collect(dense, timed, "fast", mesh_detail=False))
            t3 = time.perf_counter()
            for piece, seconds in zip(times.values(), (t1 - t0, t2 - t1, t3 - t2)):
                piece.append(seconds)
        out[where] = {key: summarize(v).median for key, v in times.items()}
    return out


def _report(
    args: argparse.Namespace,
    samples: dict[str, list[float]],
    counts: dict[str, Any],
    split: dict[str, dict[str, float]],
    gpu: bool,
) -> dict[str, Any]:
    """Print the tables and the verdict; the figures for the JSON."""
    to_dense = {k: summarize(v) for k, v in paired_ratios(samples, DENSE).items()}
    to_cpu = {  # each GPU run over the same run on the CPU, round by round
        g: summarize([a / b for a, b in zip(samples[g], samples[g.replace("gpu", "cpu")])])
        for g in samples
        if "gpu" in g
    }
    summaries = {k: summarize(v) for k, v in samples.items()}
    rows = [
        _row(name, s, to_dense.get(name), to_cpu.get(name), counts.get(name)) for name, s in summaries.items()
    ]
    where = "the GPU" if gpu else "the CPU"
    print_table(
        f"sparsefx.run on GPT-2 small (90%, 1 x 128, {args.mesh} {MODE}) against the dense eager forward "
        f"on {where}, {args.rounds} rounds",
        ["", "median", "IQR", f"÷ {DENSE} [IQR]", "gpu ÷ cpu [IQR]", "launches", "host syncs"],
        rows,
    )
    _split_table(split)
    passed = None
    if gpu:
        s = to_cpu["run gpu"]
        passed = s.ci_low <= 1.0
        console.print(
            f"run gpu ÷ run cpu: {fmt_ci(s)}, target <= 1 (a 95% CI reaching 1 passes): {verdict(passed)}"
        )
    return {
        "samples": samples,
        "summaries": {k: v.as_dict() for k, v in summaries.items()},
        "ratios_to_dense": {k: v.as_dict() for k, v in to_dense.items()},
        "gpu_over_cpu": {k: v.as_dict() for k, v in to_cpu.items()},
        "counts": counts,
        "split_s": split,
        "passed": passed,
    }


def _row(name: str, s: Summary, dense: Summary | None, cpu: Summary | None, count: dict | None) -> list[str]:
    return [
        name,
        fmt_seconds(s.median),
        f"[{fmt_seconds(s.p25)}–{fmt_seconds(s.p75)}]",
        fmt_ratio(dense) if dense else "1",
        fmt_ratio(cpu) if cpu else NA,
        f"{count['launches']:,}" if count else NA,
        f"{count['syncs']:,}" if count else NA,
    ]


def _split_table(split: dict[str, dict[str, float]]) -> None:
    print_table(
        "Where a run's time goes (reusing timings; each piece timed alone, median)",
        ["", "evaluate (values, zeros home)", "clock (program + dense)", "stats", "sum"],
        [
            [where, *(fmt_seconds(v) for v in parts.values()), fmt_seconds(sum(parts.values()))]
            for where, parts in split.items()
        ],
    )
    if "gpu" in split:
        parts = split["gpu"]
        total = sum(parts.values())
        shares = ", ".join(f"{name} {v / total:.0%}" for name, v in parts.items())
        console.print(
            f"the GPU run spends {shares}: the clock and the stats run on the host, so it is bound by "
            "the host's Python and small-tensor work, and the evaluation by kernel launches"
        )


if __name__ == "__main__":
    raise SystemExit(main())
