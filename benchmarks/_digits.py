"""The digits task ``quality.py`` trains on: data, model, one training run, test accuracy.

Data is scikit-learn's ``load_digits`` (1797 8x8 images shipped inside the package, no download),
pixels scaled to [0, 1], split once into 75% train / 25% test, stratified, with a fixed seed, so
every method and seed sees the same test set. The model is ``MLP(64, (256, 256), 10)``. A run
draws its mini-batches from a seeded generator: for a given seed every method sees the same
initial weights and the same batches, so per-seed differences between methods are paired.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import sparsefx
from sparsefx.models.mlp import MLP

__all__ = ["Digits", "RunResult", "load", "train_once"]

SPLIT_SEED = 0
HIDDEN = (256, 256)


@dataclass(frozen=True)
class Digits:
    """Train and test tensors: float features in [0, 1], int64 labels."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor


@dataclass(frozen=True)
class RunResult:
    """What one training run gives: test accuracy, final train loss, zeros in the masked weights, time."""

    test_accuracy: float
    test_size: int
    final_loss: float
    weights_zero: float
    seconds: float

    def as_dict(self) -> dict[str, float]:
        """Plain dict for JSON output."""
        return asdict(self)


def load() -> Digits:
    """The fixed split of ``load_digits`` (raises ImportError without scikit-learn)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data / 16.0, data.target, test_size=0.25, random_state=SPLIT_SEED, stratify=data.target
    )

    def as_x(a: Any) -> Tensor:
        return torch.as_tensor(a, dtype=torch.float32)

    def as_y(a: Any) -> Tensor:
        return torch.as_tensor(a, dtype=torch.int64)

    return Digits(as_x(x_train), as_y(y_train), as_x(x_test), as_y(y_test))


def _batches(n: int, batch: int, seed: int) -> Any:
    """Endless mini-batch indices: a fresh seeded permutation each epoch (last partial batch dropped)."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n - batch + 1, batch):
            yield perm[start : start + batch]


def train_once(
    data: Digits, config: Mapping[str, Any] | None, *, steps: int, batch: int, lr: float, seed: int
) -> RunResult:
    """Train one model for ``steps`` AdamW steps; ``config=None`` trains the dense model.

    A sparse run compiles the model with ``sparsefx.compile(model, config)`` and calls
    ``sm.sparsity.apply(optimizer)``, so masks are re-applied (and updated) after every step.
    """
    torch.manual_seed(seed)
    model: torch.nn.Module = MLP(data.x_train.shape[1], HIDDEN, 10)
    sm = None
    if config is not None:
        sm = sparsefx.compile(model, {**config, "seed": seed}, (data.x_train[:batch],))
        model = sm
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    if sm is not None:
        sm.sparsity.apply(opt)
    batches = _batches(len(data.y_train), batch, seed)
    start = time.perf_counter()
    model.train()
    loss = torch.zeros(())
    for _ in range(steps):
        idx = next(batches)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(data.x_train[idx]), data.y_train[idx])
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        accuracy = float((model(data.x_test).argmax(1) == data.y_test).float().mean())
    return RunResult(accuracy, len(data.y_test), float(loss.detach()), _weights_zero(sm), seconds)


def _weights_zero(sm: Any) -> float:
    """Fraction of exact zeros in the sparsified weights (0 for the dense model)."""
    if sm is None:
        return 0.0
    with torch.no_grad():
        params = [sp.param for sp in sm.sparsity.params.values()]
        zeros = sum(int((p == 0).sum()) for p in params)
        return zeros / max(1, sum(p.numel() for p in params))
