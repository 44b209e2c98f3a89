"""Iterative magnitude pruning: train dense, then prune 50% -> 75% -> 90%, retraining after each step.

The workflow (REFERENCE §1: "raise the sparsity after each checkpoint and retrain"):

1. Train the dense model (``--dense-steps``).
2. Compile it at the first level with ``init_method: topk``, so each weight matrix keeps its
   largest ``|w|``, and retrain (``--steps``) with the optimizer sparsified: pruned weights and
   their optimizer state stay exactly 0.
3. For every next level, ``sparsefx.sparse.retarget.retarget_`` raises the sparsity of the masks in
   place: pruned positions stay pruned and the smallest kept ``|w|`` are pruned too; the optimizer
   state at the newly pruned positions is zeroed. Retrain.

Each round prints the number of kept (nonzero) masked weights and the test loss and accuracy right
after pruning and after retraining. The task is synthetic, so every batch is fresh data: ten
Gaussian classes whose means differ in 16 of the 64 input features (the other 48 are noise).

    python examples/iterative_pruning.py
    python examples/iterative_pruning.py --levels 0.5 0.75 0.9 0.97 --steps 400
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch
from _task import GaussianTask, add_training_args, evaluate, masked_nnz, train  # examples/ is on sys.path

import sparsefx
from sparsefx.models import build_model
from sparsefx.sparse.retarget import retarget_


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=float, nargs="+", default=[0.5, 0.75, 0.9], help="rising sparsities")
    parser.add_argument("--dense-steps", type=int, default=600, help="dense training steps before round 1")
    parser.add_argument("--steps", type=int, default=300, help="retraining steps per round")
    add_training_args(parser)
    args = parser.parse_args(argv)
    if any(not 0.0 <= level < 1.0 for level in args.levels):
        parser.error(f"--levels must lie in [0, 1): {args.levels}")
    if any(b <= a for a, b in zip(args.levels, args.levels[1:])):
        parser.error(f"--levels must rise: {args.levels}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()

    task = GaussianTask.make(args.seed)
    test = task.sample(4096, torch.Generator().manual_seed(args.seed + 1))
    spec = build_model("mlp", seed=args.seed)
    model = spec.model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    train(model, opt, task, args.dense_steps, args.batch, seed=args.seed + 2)
    weights = sum(p.numel() for p in model.parameters() if p.ndim > 1)
    print(f"dense: nnz {weights} / {weights} | trained: {evaluate(model, test)}", flush=True)

    config = {"sparsity": args.levels[0], "init_method": "topk", "seed": args.seed}
    sm = sparsefx.compile(model, config, example_inputs=spec.args)
    opt = torch.optim.AdamW(sm.parameters(), lr=args.lr)
    sm.sparsity.apply(opt)
    for round_, level in enumerate(args.levels, start=1):
        if round_ > 1:
            retarget_(sm, level, seed=args.seed, optimizer=opt)
        pruned = evaluate(sm, test)
        train(sm, opt, task, args.steps, args.batch, seed=args.seed + 2 + round_)
        print(
            f"round {round_} ({100 * level:g}% sparse): {masked_nnz(sm.masks)} | pruned: {pruned} | "
            f"retrained: {evaluate(sm, test)}",
            flush=True,
        )
    print(f"done in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
