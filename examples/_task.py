"""The small synthetic task and training helpers the workflow examples share.

A 10-class Gaussian-mixture classification task whose class means live in the first features;
``related`` gives a shifted task for fine-tuning.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Batch", "GaussianTask", "add_training_args", "train", "evaluate", "masked_nnz"]

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

    def related(self, seed: int, shrink: float = 0.75, shift: float = 0.4) -> GaussianTask:
        """A downstream task: the same classes, moved closer together and shifted at random."""
        gen = torch.Generator().manual_seed(seed)
        noise = torch.randn(self.means.shape, generator=gen)
        return GaussianTask(self.means * shrink + shift * noise, self.features)

    def sample(self, n: int, gen: torch.Generator) -> Batch:
        y = torch.randint(0, len(self.means), (n,), generator=gen)
        x = torch.randn(n, self.features, generator=gen)
        x[:, : self.means.shape[1]] += self.means[y]
        return x, y


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """The flags both examples share: ``--batch``, ``--lr``, ``--seed``, ``--threads``."""
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (the model is too small for more)"
    )


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
