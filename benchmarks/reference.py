"""The reference executor's speed: the event-driven machine on its two pinned workloads.

1. An MLP 256-1024-256 (ReLU) at 90%, batch 4, on 16x16 (pipelined): target <= 60 s.
2. One GPT-2-small transformer block (d_model 768, 12 heads, 128 tokens, its four linear layers at
   90%) on 16x16 in streaming mode: target <= 10 minutes.

Each is timed with ``reference.execute`` alone, so the dense baseline's run is not counted, and its
cycles are printed beside the fast clock's on the same program and inputs.

    .venv/bin/python benchmarks/reference.py            # ~2-6 minutes
    .venv/bin/python benchmarks/reference.py --skip-block --json out/reference.json
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch
from _timing import console, verdict, write_json

import sparsefx
from sparsefx.models.gpt import Block, GPTConfig
from sparsefx.runtime.reference import execute

MLP_TARGET_S = 60.0
BLOCK_TARGET_S = 600.0


def _case(
    name: str, model: torch.nn.Module, x: torch.Tensor, mesh: tuple[int, int], mode: str, target: float
) -> dict[str, Any]:
    sm = sparsefx.compile(model, 0.9, (x,))
    program = sparsefx.lower(sm, (x,), mesh=mesh, mode=mode)
    t0 = time.perf_counter()
    outputs, timeline = execute(program, (x,))
    seconds = time.perf_counter() - t0
    fast = sparsefx.run(program, (x,))
    want = sm.eval()(x)
    agree = torch.allclose(outputs, want, rtol=1e-4, atol=1e-5)
    ok = seconds <= target
    console.print(
        f"{name} ({mesh[0]}x{mesh[1]}, {mode}): {seconds:.1f} s, target <= {target:.0f} s: {verdict(ok)}; "
        f"cycles {timeline.cycles} against the fast clock's {fast.stats.cycles} "
        f"(fast / reference {fast.stats.cycles / max(timeline.cycles, 1):.3f}); outputs "
        f"{'match PyTorch' if agree else 'DIFFER from PyTorch'}"
    )
    return {
        "seconds": seconds,
        "target_s": target,
        "cycles": timeline.cycles,
        "fast_cycles": fast.stats.cycles,
        "outputs_match": agree,
        "passed": ok and agree,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--skip-block", action="store_true", help="time the MLP only")
    p.add_argument("--json", metavar="PATH", help="write the figures here")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    console.print("settings: 90% static sparsity, seed 0, one torch thread, reference.execute alone")
    results: dict[str, Any] = {}
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    results["mlp"] = _case(
        "MLP 256-1024-256, batch 4", mlp, torch.randn(4, 256), (16, 16), "pipelined", MLP_TARGET_S
    )
    if not args.skip_block:
        block = Block(GPTConfig(n_layer=1, n_head=12, d_model=768, vocab_size=64, max_seq_len=128)).eval()
        x = torch.randn(1, 128, 768)
        results["block"] = _case(
            "GPT-2-small block, 1 x 128 tokens", block, x, (16, 16), "streaming", BLOCK_TARGET_S
        )
    if args.json:
        write_json(args.json, results)
    return 0 if all(r["passed"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
