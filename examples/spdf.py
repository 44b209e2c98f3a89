"""SPDF: sparse pre-training, then dense (or partially dense) fine-tuning.

The workflow (Thangarasa et al., "SPDF", 2023; REFERENCE §1):

1. Pre-train at a high static sparsity (``--sparsity 0.75``, a random mask): most of the training
   FLOPs are spent here, at a quarter of the dense cost.
2. Fine-tune on the downstream task from the same pre-trained weights, in two ways:

   (a) dense fine-tuning: ``retarget_(sm, 0.0)`` sets every mask to all-ones. The pruned weights
       come back at 0 and train from there.
   (b) partial redensification: ``retarget_(sm, 0.25)`` regrows pruned positions at random
       (seeded, weights at 0) until 75% of each weight matrix is kept.

   For reference the script also fine-tunes at the pre-training sparsity (no redensification).

Each phase prints the number of kept (nonzero) masked weights, the training FLOPs it spent (from
``sparsefx.flops`` on the current masks) and the test loss and accuracy. Both tasks are synthetic,
with fresh data every batch: ten Gaussian classes whose means differ in the first 16 of 64 input
features. The downstream task has the same classes, moved closer together and shifted at random.
On a task this small all fine-tuning variants reach a similar accuracy: the point is the workflow
(and the FLOPs it saves), not the toy's numbers.

    python examples/spdf.py
    python examples/spdf.py --sparsity 0.9 --redensify-to 0.5 --steps 2000 --finetune-steps 500
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence

import torch
from _task import GaussianTask, add_training_args, evaluate, masked_nnz, train  # examples/ is on sys.path
from torch import nn

import sparsefx
from sparsefx.models import build_model
from sparsefx.sparse.retarget import retarget_


def train_flops(sm: nn.Module, steps: int, batch: int) -> str:
    """Training FLOPs of ``steps`` steps at ``batch`` with the current masks, and their share of dense."""
    report = sparsefx.flops(sm, (torch.zeros(batch, 64),))
    share = 100 * report.sparse_train / report.dense_train
    return f"train FLOPs {steps * report.sparse_train:.3g} ({share:.0f}% of dense)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sparsity", type=float, default=0.75, help="pre-training sparsity")
    parser.add_argument("--redensify-to", type=float, default=0.25, help="sparsity of fine-tuning (b)")
    parser.add_argument("--steps", type=int, default=1200, help="pre-training steps")
    parser.add_argument("--finetune-steps", type=int, default=300, help="fine-tuning steps per variant")
    add_training_args(parser)
    args = parser.parse_args(argv)
    for flag, level in (("--sparsity", args.sparsity), ("--redensify-to", args.redensify_to)):
        if not 0.0 <= level < 1.0:
            parser.error(f"{flag} must lie in [0, 1): {level}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()

    pretrain_task = GaussianTask.make(args.seed)
    downstream = pretrain_task.related(args.seed + 1)
    pretrain_test = pretrain_task.sample(4096, torch.Generator().manual_seed(args.seed + 2))
    downstream_test = downstream.sample(4096, torch.Generator().manual_seed(args.seed + 3))

    spec = build_model("mlp", seed=args.seed)
    config = {"sparsity": args.sparsity, "init_method": "random", "seed": args.seed}
    sm = sparsefx.compile(spec.model, config, example_inputs=spec.args)
    opt = torch.optim.AdamW(sm.parameters(), lr=args.lr)
    sm.sparsity.apply(opt)
    train(sm, opt, pretrain_task, args.steps, args.batch, seed=args.seed + 4)
    print(
        f"pre-training ({100 * args.sparsity:g}% sparse): {masked_nnz(sm.masks)} | "
        f"{train_flops(sm, args.steps, args.batch)} | pre-training task: {evaluate(sm, pretrain_test)} | "
        f"downstream before fine-tuning: {evaluate(sm, downstream_test)}",
        flush=True,
    )
    pretrained = copy.deepcopy(sm.state_dict())

    variants = [
        ("(a) dense fine-tuning", 0.0),
        (f"(b) partial redensification to {100 * args.redensify_to:g}%", args.redensify_to),
        (f"(ref) sparse fine-tuning at {100 * args.sparsity:g}%", args.sparsity),
    ]
    for label, level in variants:
        sm.load_state_dict(pretrained)
        retarget_(sm, level, seed=args.seed)
        opt = torch.optim.AdamW(sm.parameters(), lr=args.lr)
        sm.sparsity.apply(opt)
        train(sm, opt, downstream, args.finetune_steps, args.batch, seed=args.seed + 5)
        print(
            f"{label} ({100 * level:g}% sparse): {masked_nnz(sm.masks)} | "
            f"{train_flops(sm, args.finetune_steps, args.batch)} | "
            f"downstream: {evaluate(sm, downstream_test)}",
            flush=True,
        )
    print(f"done in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
