"""What ``sparsefx.freeze`` buys on this CPU: frozen sparse layers and models against dense eager PyTorch.

Targets (issue: "Real speed on the CPU a user already has"), settings as ``shared/BENCHMARKS.md`` pins
them: the dense side is the original module's eager forward under ``torch.inference_mode()``, the
same thread count on both sides, the sides interleaved in one process after a warm-up call each,
the median of the per-round ratios (dense time over frozen time) with its 95% interval:

* per layer, GPT-2 small's four shapes at 90%: >= 3.5x at 32, 128, 512 and 1024 tokens and
  >= 2.5x at 1 and 8 tokens, one thread;
* the whole untied GPT-2 small with every linear layer sparse (its LM head too), 128 tokens, batch 1
  and 8: >= 3x on one thread, >= 2.5x on two (a one-token step, as in decoding, reported beside);
* at 50% never slower than dense (a ratio whose interval reaches 1.0 passes).

Each figure has the same frozen path at sparsity 0 beside it (``s=0``): what comes from sparsity,
not from the path itself. The freeze time is reported too::

    .venv/bin/python benchmarks/freeze.py [--part layers|model|all] [--sparsity 0.9 ...] [--json PATH]
    .venv/bin/python benchmarks/freeze.py --readme   # 50%, 90% and 99%, the README's table
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path
from typing import Any

import torch
from _timing import (
    add_json_arg,
    environment,
    interleave,
    paired_ratios,
    print_table,
    summarize,
    verdict,
    write_between_markers,
    write_json,
)

import sparsefx
from sparsefx.frozen.choose import choose
from sparsefx.frozen.kernels import available_kernels
from sparsefx.frozen.packed import pack
from sparsefx.frozen.sparse_linear import SparseLinear

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]  # GPT-2 small's (in, out)
TOKENS = (1, 8, 32, 128, 512, 1024)
LINEAR = ["*.attn.*.weight", "*.mlp.*.weight", "lm_head.weight"]  # every linear layer, the LM head too
ROUNDS = 7
CASES = ((1, 128), (8, 128), (1, 1))  # whole model: batch x tokens (the last a one-token decode step)
README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- freeze:start -->", "<!-- freeze:end -->"
COMMAND = ".venv/bin/python benchmarks/freeze.py --readme"


def _ratio(samples: dict[str, list[float]], name: str) -> Any:
    return summarize([1 / r for r in paired_ratios(samples, "dense")[name]])  # dense time / frozen time


def _frozen_layer(lin: torch.nn.Linear, mask: torch.Tensor) -> tuple[torch.nn.Module, Any]:
    """``lin`` with ``mask`` as ``sparsefx.freeze`` leaves it, and the kernel it runs at a token count:
    a ``SparseLinear``, or ``lin`` itself where dense measured fastest at every size."""
    p = pack(lin.weight, mask)
    choice = choose(p, available_kernels(), lin.bias)
    if set(choice) == {"dense"}:
        return lin, lambda tokens: "dense"
    layer = SparseLinear(p, lin.bias, choice)
    return layer, layer.kernel


def layer_rows(sparsity: float, rounds: int) -> list[dict[str, Any]]:
    """Each shape and token count: the frozen layer's speedup over ``nn.Linear``, and at s=0."""
    rows = []
    for fin, fout in SHAPES:
        torch.manual_seed(fin + fout)
        lin = torch.nn.Linear(fin, fout)
        order = torch.randperm(fin * fout)
        mask = torch.zeros(fin * fout, dtype=torch.bool)
        mask[order[: round((1 - sparsity) * fin * fout)]] = True
        mask = mask.reshape(fout, fin)
        with torch.no_grad():
            lin.weight.mul_(mask)
        layers, kernel_of = {}, {}
        for name, m in (("frozen", mask), ("s=0", torch.ones_like(mask))):
            layers[name], kernel_of[name] = _frozen_layer(lin, m)
        for tokens in TOKENS:
            x = torch.randn(tokens, fin)
            with torch.inference_mode():
                fns = {"dense": lambda x=x, lin=lin: lin(x)}
                fns |= {n: (lambda f=f, x=x: f(x)) for n, f in layers.items()}
                samples = interleave(fns, rounds, warmup=1, number=max(1, 64 // tokens))
            rows.append(
                {
                    "shape": f"{fin}x{fout}",
                    "tokens": tokens,
                    "kernel": kernel_of["frozen"](tokens),
                    "speedup": _ratio(samples, "frozen").as_dict(),
                    "s0": _ratio(samples, "s=0").as_dict(),
                }
            )
            print(f"  {fin}x{fout} at {tokens} tokens: {rows[-1]['speedup']['median']:.2f}x", flush=True)
    return rows


def model_rows(sparsity: float, rounds: int, threads: tuple[int, ...]) -> list[dict[str, Any]]:
    """The whole GPT-2 small at each of ``CASES``: frozen against the original module."""
    from run import gpt  # benchmarks/run.py's pinned GPT (untied LM head)

    model, _ = gpt(12, 50257)
    ids = torch.randint(0, 50257, (1, 128))
    frozen = {}
    for name, s in (("frozen", sparsity), ("s=0", 0.0)):
        dense_copy, _ = gpt(12, 50257)  # compile prunes its model's weights in place: not the baseline's
        sm = sparsefx.compile(
            dense_copy, {"algorithm": "static", "sparsity": s, "param_filter": LINEAR}, (ids,)
        )
        t0 = time.perf_counter()
        frozen[name] = sparsefx.freeze(sm.eval())
        frozen[name + " seconds"] = time.perf_counter() - t0
        frozen[name + " sm"] = sm
    rows = []
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        for batch, tokens in CASES:
            x = torch.randint(0, 50257, (batch, tokens))
            with torch.inference_mode():
                out, expected = frozen["frozen"](x), frozen["frozen sm"](x)
                torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
                fns = {
                    "dense": lambda x=x: model(x),
                    "frozen": lambda x=x: frozen["frozen"](x),
                    "s=0": lambda x=x: frozen["s=0"](x),
                }
                samples = interleave(fns, rounds, warmup=1)
            rows.append(
                {
                    "threads": n_threads,
                    "batch": batch,
                    "tokens": tokens,
                    "dense_s": summarize(samples["dense"]).median,
                    "speedup": _ratio(samples, "frozen").as_dict(),
                    "s0": _ratio(samples, "s=0").as_dict(),
                }
            )
            print(
                f"  {batch} x {tokens} tokens, {n_threads} thread(s): {rows[-1]['speedup']['median']:.2f}x",
                flush=True,
            )
    torch.set_num_threads(1)
    f = frozen["frozen"]
    info = {
        "kernels": {name: _kernels(frozen[name]) for name in ("frozen", "s=0")},
        "freeze_s": frozen["frozen seconds"],
        "frozen_bytes": f.frozen_bytes,
        "dense_bytes": f.dense_bytes,
    }
    return [{**r, **info} for r in rows]


def _kernels(fast: Any) -> dict[str, list[str]]:
    """Each sparse weight's shape and the kernels it chose, by bucket (the same shape, the same choice)."""
    return {"x".join(map(str, r.shape)): list(r.kernels) or ["dense"] for r in fast.freeze_report}


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else verdict(ok)


def _x(s: dict[str, float]) -> str:
    return f"{s['median']:.2f}x [{s['ci_low']:.2f}, {s['ci_high']:.2f}]"


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _vectors() -> str:
    """What the kernels had to work with: ``lookup`` needs AVX-512 (without it one token runs ``spmv``)."""
    from sparsefx.frozen.kernels import runs_here

    return "AVX-512" if runs_here("lookup") else "no AVX-512: one token on spmv"


def markdown(out: dict[str, Any]) -> str:
    """The README's tables: per layer (shape and sparsity by tokens) and the whole model."""
    env = out["environment"]
    lines = [
        f"Measured with `{COMMAND}` on {_cpu()} ({env['cpus']} cores, {_vectors()}), torch {env['torch']}, "
        "one thread unless a row says two. Each cell is the median of the per-round ratios, dense eager "
        "time over frozen time.",
        "",
        "| layer (in x out) | sparsity | " + " | ".join(f"{t} tokens" for t in TOKENS) + " |",
        "|---|---|" + "---|" * len(TOKENS),
    ]
    for s, rows in out["layers"].items():
        for shape in dict.fromkeys(r["shape"] for r in rows):
            cells = [f"{r['speedup']['median']:.2f}x ({r['kernel']})" for r in rows if r["shape"] == shape]
            lines.append(f"| {shape} | {float(s):.0%} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| whole GPT-2 small | sparsity | threads | "
        + " | ".join(f"{b} x {t} tokens" for b, t in CASES)
        + " | freeze | size |",
        "|---|---|---|" + "---|" * len(CASES) + "---|---|",
    ]
    for s, rows in out["model"].items():
        for n in dict.fromkeys(r["threads"] for r in rows):
            by = {(r["batch"], r["tokens"]): r for r in rows if r["threads"] == n}
            r0 = rows[0]
            size = f"{r0['frozen_bytes'] / 1e6:.0f} MB of {r0['dense_bytes'] / 1e6:.0f} MB"
            cells = " | ".join(f"{by[c]['speedup']['median']:.2f}x" for c in CASES)
            lines.append(
                f"| every linear layer, LM head too | {float(s):.0%} | {n} | {cells} "
                f"| {r0['freeze_s']:.1f} s | {size} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("layers", "model", "all"), default="all")
    p.add_argument("--sparsity", type=float, nargs="+", default=[0.9])
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--readme", action="store_true", help="measure 50%%, 90%% and 99%% and rewrite the README")
    add_json_arg(p)
    args = p.parse_args(argv)
    if args.readme:
        args.part, args.sparsity = "all", [0.5, 0.9, 0.99]
    torch.set_num_threads(1)
    out: dict[str, Any] = {"environment": environment(), "layers": {}, "model": {}}
    for s in args.sparsity:
        if args.part in ("layers", "all"):
            rows = out["layers"][str(s)] = layer_rows(s, args.rounds)
            table = []
            for r in rows:
                target = 2.5 if r["tokens"] <= 8 else 3.5
                med, hi = r["speedup"]["median"], r["speedup"]["ci_high"]
                ok = med >= target if s == 0.9 else (hi >= 1.0 if s == 0.5 else None)
                table.append(
                    [r["shape"], str(r["tokens"]), r["kernel"], _x(r["speedup"]), _x(r["s0"]),
                     f">= {target}x" if s == 0.9 else ("never slower" if s == 0.5 else "report"),
                     _verdict(ok)]
                )  # fmt: skip
            cols = ["shape (in x out)", "tokens", "kernel", "frozen / dense", "s=0 path", "target", ""]
            print_table(f"Per layer at {s:.0%}, one thread", cols, table)
        if args.part in ("model", "all"):
            threads = tuple(args.threads) if s == 0.9 or not args.readme else (1,)
            rows = out["model"][str(s)] = model_rows(s, max(5, args.rounds - 2), threads)
            table = []
            for r in rows:
                target = (3.0 if r["threads"] == 1 else 2.5) if r["tokens"] == 128 else None
                med, hi = r["speedup"]["median"], r["speedup"]["ci_high"]
                ok = (med >= target if target else None) if s == 0.9 else (hi >= 1.0 if s == 0.5 else None)
                want = (f">= {target}x" if target else "report") if s == 0.9 else "never slower"
                table.append(
                    [str(r["threads"]), f"{r['batch']} x {r['tokens']}", f"{r['dense_s'] * 1e3:.0f} ms",
                     _x(r["speedup"]), _x(r["s0"]), want if s in (0.5, 0.9) else "report", _verdict(ok)]
                )  # fmt: skip
            cols = ["threads", "batch x tokens", "dense", "frozen / dense", "s=0 path", "target", ""]
            r0 = rows[0]
            print_table(
                f"GPT-2 small at {s:.0%} (LM head too): frozen in {r0['freeze_s']:.1f} s, "
                f"{r0['frozen_bytes'] / 1e6:.0f} MB of sparse weights against "
                f"{r0['dense_bytes'] / 1e6:.0f} MB dense",
                cols,
                table,
            )
    if args.json:
        write_json(args.json, out)
    if args.readme:
        write_between_markers(README, START, END, markdown(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
