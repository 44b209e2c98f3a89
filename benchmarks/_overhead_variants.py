"""The two training setups ``update_overhead.py`` compares, and a timer around RigL's update.

Both are ``sparsefx.compile`` of deep copies of one model at the same sparsity (so the same
weights and, seeded by parameter name, the same initial masks), each with its own
``AdamW(fused=True)`` attached by ``sm.sparsity.apply(optimizer)``: one ``static``, one ``rigl``
updating every ``freq`` steps. ``UpdateTimer`` wraps the RigL instance's ``update`` and
``update_mask`` to time every update that changed masks, and the drop-and-grow part of it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import sparsefx
from sparsefx.models.mlp import MLP
from sparsefx.models.registry import build_model

__all__ = ["Task", "Run", "UpdateTimer", "build_task", "build_run", "MODELS"]

MODELS = ("mlp", "gpt-small-bench")
MLP_WIDTHS = (1024, (1024, 1024, 1024), 10)


@dataclass(frozen=True)
class Task:
    """A model, a pool of batches (step ``i`` of a block uses batch ``i % pool``) and the loss."""

    describe: str
    model: nn.Module
    xs: Tensor
    ys: Tensor
    loss: Callable[[Tensor, Tensor], Tensor]


def build_task(name: str, batch: int, seq_len: int, seed: int, pool: int) -> Task:
    """``mlp`` (1024-1024-1024-1024-10, ``batch`` rows) or a built-in GPT (``batch`` x ``seq_len``).

    ``pool`` distinct batches, so the loss does not collapse to 0 on one memorised batch (which
    drives gradients and Adam state toward denormals and changes what a step costs). MLP labels
    come from a fixed random linear teacher; GPT tokens are uniform random.
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    if name == "mlp":
        fan_in, hidden, out = MLP_WIDTHS
        model: nn.Module = MLP(fan_in, hidden, out)
        xs = torch.randn(pool, batch, fan_in, generator=gen)
        ys = (xs @ torch.randn(fan_in, out, generator=gen)).argmax(-1)
        widths = "-".join(str(w) for w in (fan_in, *hidden, out))
        return Task(f"MLP {widths}, batch {batch}", model, xs, ys, F.cross_entropy)
    model = build_model(name, input_shape=(batch, seq_len), seed=seed).model
    tokens = torch.randint(0, model.config.vocab_size, (pool, batch, seq_len + 1), generator=gen)

    def lm_loss(logits: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())

    xs, ys = tokens[..., :-1].contiguous(), tokens[..., 1:].contiguous()
    return Task(f"{name}, batch {batch}x{seq_len}", model, xs, ys, lm_loss)


class UpdateTimer:
    """Times each ``update()`` of ``algorithm`` that changed masks, and its ``update_mask`` calls.

    Instance attributes shadow the class methods, so the optimizer's post-step hook (which calls
    ``self.update()``) goes through the wrappers; nothing in the library changes.
    """

    def __init__(self, algorithm: Any) -> None:
        self.update_seconds: list[float] = []
        self.mask_seconds: list[float] = []
        self._mask_time = 0.0
        self._mask_calls = 0
        update, update_mask = algorithm.update, algorithm.update_mask

        def timed_update() -> None:
            self._mask_time, self._mask_calls = 0.0, 0
            start = time.perf_counter()
            update()
            elapsed = time.perf_counter() - start
            if self._mask_calls:
                self.update_seconds.append(elapsed)
                self.mask_seconds.append(self._mask_time)

        def timed_update_mask(p: Tensor, mask: Tensor, sparsity: float) -> Tensor:
            start = time.perf_counter()
            new = update_mask(p, mask, sparsity)
            self._mask_time += time.perf_counter() - start
            self._mask_calls += 1
            return new

        algorithm.update = timed_update
        algorithm.update_mask = timed_update_mask


@dataclass
class Run:
    """A compiled model, its optimizer, and (for RigL) the update timer and updates per block."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    timer: UpdateTimer | None = None
    updates_per_block: list[int] = field(default_factory=list)
    update_seconds_per_block: list[float] = field(default_factory=list)
    last_loss: float = float("nan")

    def block_fn(self, task: Task, steps: int) -> Callable[[], None]:
        """``steps`` training steps (zero_grad, forward, loss, backward, AdamW), batches in pool order."""

        def block() -> None:
            before = len(self.timer.update_seconds) if self.timer else 0
            loss = torch.zeros(())
            for i in range(steps):
                x, y = task.xs[i % len(task.xs)], task.ys[i % len(task.ys)]
                self.optimizer.zero_grad(set_to_none=True)
                loss = task.loss(self.model(x), y)
                loss.backward()
                self.optimizer.step()
            self.last_loss = float(loss.detach())
            if self.timer:
                self.updates_per_block.append(len(self.timer.update_seconds) - before)
                self.update_seconds_per_block.append(sum(self.timer.update_seconds[before:]))

        return block


def build_run(name: str, task: Task, config: dict[str, Any]) -> Run:
    """Compile a deep copy of the task's model with ``config``; ``AdamW(fused=True)``; time RigL."""
    sm = sparsefx.compile(copy.deepcopy(task.model), config, (task.xs[0],))
    sm.train()
    optimizer = torch.optim.AdamW(sm.parameters(), fused=True)
    sm.sparsity.apply(optimizer)
    timer = UpdateTimer(sm.sparsity) if sm.sparsity.dynamic else None
    return Run(name, sm, optimizer, timer)
