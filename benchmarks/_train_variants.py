"""The four training setups ``train_step.py`` compares, each on its own deep copy of one model.

* ``dense``: the eager model as built.
* ``sparsefx``: ``sparsefx.compile(model, sparsity)`` (static sparsity, masked ops in the graph).
* ``sparsefx + apply(opt)`` (only with ``applied=True``): the same, with the optimizer handed to
  ``sm.sparsity.apply(optimizer)`` as the README's training loop does (state masking, re-pruning
  and ``update()`` around every step).
* ``torch.nn.utils.prune``: ``global_unstructured`` with ``L1Unstructured`` over the same weights.
* ``torch.ao.pruning``: ``WeightNormSparsifier`` (1x1 blocks), ``prepare`` then ``step``, with the
  parametrizations left attached during training, as users run it.
* ``select floor`` (only with ``floor=True``): the eager model with sparsefx's masks, its pruned
  weights zeroed once, and after each backward one in-place select of each sparse gradient, written
  out in the step with no hooks. It is the least any correct select-based method can do per step
  (weights stay zero under AdamW when their gradients are selected), so it bounds what sparsefx can
  win over the others.

"The same weights" are the ones sparsefx selects (``sm.masks``): every ``nn.Linear`` weight but
``lm_head``; embeddings, norms and biases stay dense. Each setup gets its own ``AdamW`` (default
implementation unless ``fused``).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.ao.pruning import WeightNormSparsifier
from torch.nn.utils import prune

import sparsefx
from sparsefx.models.registry import build_model

__all__ = [
    "Variant",
    "build_variants",
    "add_setup_args",
    "setup_from_args",
    "DENSE",
    "SPARSEFX",
    "SPARSEFX_APPLIED",
    "PRUNE",
    "AO",
    "FLOOR",
]

DENSE, SPARSEFX, PRUNE, AO = "dense eager", "sparsefx", "torch.nn.utils.prune", "torch.ao.pruning"
SPARSEFX_APPLIED = "sparsefx + apply(opt)"
FLOOR = "select floor"


@dataclass
class Variant:
    """A model, its optimizer, and how to read the effective weights of the selected layers."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    effective: Callable[[], list[Tensor]]
    losses: list[float] = field(default_factory=list)
    after_backward: Callable[[], None] | None = None

    def step_fn(self, x: Tensor, y: Tensor) -> Callable[[], None]:
        """One training step: zero_grad, forward, next-token cross-entropy, backward, AdamW step."""

        def step() -> None:
            self.optimizer.zero_grad(set_to_none=True)
            logits = self.model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
            if self.after_backward is not None:
                self.after_backward()
            self.optimizer.step()
            self.losses.append(loss.detach().item())

        return step

    def sparsity(self) -> float:
        """Fraction of zeros in the effective (masked) weights of the selected layers."""
        with torch.no_grad():
            weights = self.effective()
            zeros = sum(int((w == 0).sum()) for w in weights)
            return zeros / max(1, sum(w.numel() for w in weights))


def _weights(model: nn.Module, paths: list[str]) -> Callable[[], list[Tensor]]:
    return lambda: [model.get_submodule(p).weight for p in paths]


def build_variants(
    base: nn.Module,
    example: Tensor,
    sparsity: float,
    *,
    fused: bool = False,
    floor: bool = False,
    applied: bool = False,
) -> dict[str, Variant]:
    """Deep-copy ``base`` four times (plus one each for ``applied`` and ``floor``) and set each copy
    up; keyed by display name.

    ``fused`` gives every variant ``AdamW(fused=True)`` instead of the default implementation.
    """
    sm = sparsefx.compile(copy.deepcopy(base), sparsity, (example,))
    names = list(sm.masks)
    paths = [n.rsplit(".", 1)[0] for n in names]
    if not all(
        n.endswith(".weight") and isinstance(base.get_submodule(p), nn.Linear) for n, p in zip(names, paths)
    ):
        raise RuntimeError(f"sparsefx selected something other than Linear weights: {names}")

    dense = copy.deepcopy(base)

    pruned = copy.deepcopy(base)
    prune.global_unstructured(
        [(pruned.get_submodule(p), "weight") for p in paths],
        pruning_method=prune.L1Unstructured,
        amount=sparsity,
    )

    ao = copy.deepcopy(base)
    sparsifier = WeightNormSparsifier(sparsity_level=sparsity, sparse_block_shape=(1, 1), zeros_per_block=1)
    sparsifier.prepare(ao, [{"tensor_fqn": n} for n in names])
    sparsifier.step()

    variants = {
        DENSE: (dense, _weights(dense, paths)),
        SPARSEFX: (sm, _weights(sm, paths)),  # the parameters themselves: pruned entries must be 0
        PRUNE: (pruned, _weights(pruned, paths)),
        AO: (ao, _weights(ao, paths)),
    }
    if applied:
        sm_applied = sparsefx.compile(copy.deepcopy(base), sparsity, (example,))
        variants[SPARSEFX_APPLIED] = (sm_applied, _weights(sm_applied, paths))
    selects: Callable[[], None] | None = None
    if floor:
        manual = copy.deepcopy(base)
        pairs = [(manual.get_parameter(n), sm.masks[n].clone()) for n in names]
        for p, mask in pairs:
            sparsefx.ops.prune_(p.data, mask)

        def selects() -> None:
            for p, mask in pairs:
                sparsefx.ops.select_(p.grad, mask)

        variants[FLOOR] = (manual, _weights(manual, paths))
    out = {}
    for name, (model, effective) in variants.items():
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), fused=fused or None)
        if name == SPARSEFX_APPLIED:
            model.sparsity.apply(optimizer)
        out[name] = Variant(
            name, model, optimizer, effective, after_backward=selects if name == FLOOR else None
        )
    return out


def add_setup_args(p: argparse.ArgumentParser) -> None:
    """The options that pick the model, batch, sparsity and optimizer the setups share."""
    p.add_argument("--model", default="gpt-small-bench", help="built-in GPT model (default gpt-small-bench)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default 128)")
    p.add_argument("--sparsity", type=float, default=0.9, help="sparsity level (default 0.9)")
    p.add_argument(
        "--adamw-fused", action="store_true", help="AdamW(fused=True) for every variant (default: AdamW())"
    )
    p.add_argument("--seed", type=int, default=0, help="seed for weights and tokens (default 0)")


def setup_from_args(
    args: argparse.Namespace, *, floor: bool, applied: bool = True
) -> tuple[dict[str, Variant], Tensor, Tensor]:
    """Build the model the options name, a fixed batch of next-token data, and the setups on it."""
    torch.manual_seed(args.seed)
    spec = build_model(args.model, input_shape=(args.batch, args.seq_len), seed=args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, spec.model.config.vocab_size, (args.batch, args.seq_len + 1), generator=gen)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    variants = build_variants(
        spec.model, x, args.sparsity, fused=args.adamw_fused, floor=floor, applied=applied
    )
    return variants, x, y
