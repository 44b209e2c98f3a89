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
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import sparsefx
from sparsefx.models import build_model
from sparsefx.sparse.retarget import retarget_

Batch = tuple[Tensor, Tensor]


@dataclass(frozen=True)
class GaussianTask:
    """Ten classes; class ``c`` is ``N(means[c], I)`` on the first features, ``N(0, I)`` on the rest."""

    means: Tensor
    features: int = 64

    @classmethod
    def make(cls, seed: int, informative: int = 16, separation: float = 0.8) -> GaussianTask:
        gen = torch.Generator().manual_seed(seed)
        return cls(torch.randn(10, informative, generator=gen) * separation)

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        y = torch.randint(0, len(self.means), (n,), generator=gen)
        x = torch.randn(n, self.features, generator=gen)
        x[:, : self.means.shape[1]] += self.means[y]
        return x, y


def train(
    model: nn.Module, opt: torch.optim.Optimizer, task: GaussianTask, steps: int, batch: int, seed: int
) -> None:
    """``steps`` optimizer steps, each on a fresh batch drawn from a generator seeded with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        x, y = task.sample(batch, gen)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


@torch.no_grad()
def evaluate(model: nn.Module, data: Batch) -> str:
    """``"loss L acc A%"`` of ``model`` on ``data``."""
    x, y = data
    model.eval()
    logits = model(x)
    acc = float((logits.argmax(1) == y).float().mean())
    return f"loss {float(F.cross_entropy(logits, y)):.4f} acc {100 * acc:.1f}%"


def masked_nnz(masks: dict[str, Tensor]) -> str:
    """``"nnz KEPT / TOTAL"`` over all masks."""
    return f"nnz {sum(int(m.sum()) for m in masks.values())} / {sum(m.numel() for m in masks.values())}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=float, nargs="+", default=[0.5, 0.75, 0.9], help="rising sparsities")
    parser.add_argument("--dense-steps", type=int, default=600, help="dense training steps before round 1")
    parser.add_argument("--steps", type=int, default=300, help="retraining steps per round")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (the model is too small for more)"
    )
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
