"""Seeded random cases on which the fast clock and the event-driven reference must agree.

``draw_cases(n, seed)`` draws ``n`` cases from ``random.Random(seed)``: each a small model built from
torch modules (an MLP of 2-3 linear layers of widths 8-96 with ReLU, GELU or nothing between and
maybe a LayerNorm; a Conv2d net, ReLU, flatten, Linear; or a one-layer built-in ``GPT`` with tiny
dimensions), a sparsity in [0.5, 0.95], a mesh, a mode, a placement, a batch and a zero pattern of
its inputs: ``none``, ``features`` (whole input features zero: the last dimension of an MLP's input,
the channels of a conv net's) or ``elements`` (each element zero with the case's rate). A GPT reads
token ids, so its inputs have no zero pattern. A pipelined program takes one column per kernel, so a
pipelined case draws a mesh at least as wide as its model has kernels.

``run_case(case)`` compiles, lowers, runs both executors on fresh inputs and returns their cycles, the
ratio fast / reference and whether each executor's outputs equal PyTorch's. The test
(``tests/test_agreement_random.py``) and the benchmark (``benchmarks/agreement_random.py``) share it.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

import sparsefx
from sparsefx.models.gpt import GPT, GPTConfig
from sparsefx.runtime.reference import execute
from sparsefx.trees import tensor_leaves

RTOL, ATOL = 1e-4, 1e-5
"""How close each executor's outputs must be to the compiled model's own (``sm.eval()``)."""

TOLERANCE = 0.10
"""Largest ``abs(fast / reference - 1)`` of total cycles a case may have."""

GPT_KERNELS = 30
"""Kernels of a one-layer ``GPT`` program: a pipelined GPT case needs a mesh this wide."""

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


@dataclass(frozen=True)
class Case:
    """One drawn case. ``shape`` is an MLP's widths (input first), a conv net's ``(in_channels,
    channels, image size, out_features)`` or a GPT's ``(d_model, heads, vocab)``; ``tokens`` is the
    sequence length (0: an MLP reads ``[batch, features]``)."""

    index: int
    seed: int
    model: str
    shape: tuple[int, ...]
    act: str
    norm: str
    sparsity: float
    mesh: tuple[int, int]
    mode: str
    placement: str
    batch: int
    tokens: int
    zeros: str
    rate: float

    @property
    def described_model(self) -> str:
        """The model and its shape: ``mlp48-96-24-relu-lnmid``, ``conv3x6x6-8ch-20``, ``gpt16-h2-v40``."""
        if self.model == "mlp":
            norm = f"-ln{self.norm}" if self.norm else ""
            return "mlp" + "-".join(map(str, self.shape)) + f"-{self.act}{norm}"
        if self.model == "conv":
            c, ch, size, out = self.shape
            return f"conv{c}x{size}x{size}-{ch}ch-{out}"
        return "gpt{}-h{}-v{}".format(*self.shape)

    @property
    def described_zeros(self) -> str:
        """``none``, ``ids`` (token ids), or the pattern and its rate: ``features0.50``."""
        return self.zeros if self.zeros in ("none", "ids") else f"{self.zeros}{self.rate:.2f}"

    @property
    def label(self) -> str:
        """A short name that holds every drawn parameter but the seed (a pytest id)."""
        rows = f"b{self.batch}" + (f"t{self.tokens}" if self.tokens else "")
        return (
            f"{self.index}-{self.described_model}-s{self.sparsity:.2f}-{self.mesh[0]}x{self.mesh[1]}-"
            f"{self.mode}-{self.placement}-{rows}-{self.described_zeros}"
        )

    def build(self) -> tuple[nn.Module, torch.Tensor]:
        """The model (eval mode, weights from ``seed``) and a dense example input to lower it with."""
        g = torch.Generator().manual_seed(self.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = self._module()
        if self.model == "gpt":
            example = torch.randint(0, self.shape[2], (self.batch, self.tokens), generator=g)
        else:
            example = torch.randn(self._input_shape(), generator=g)
        return model.eval(), example

    def inputs(self) -> torch.Tensor:
        """Fresh inputs (from ``seed + 1``) with the case's zero pattern."""
        g = torch.Generator().manual_seed(self.seed + 1)
        if self.model == "gpt":
            return torch.randint(0, self.shape[2], (self.batch, self.tokens), generator=g)
        x = torch.randn(self._input_shape(), generator=g)
        if self.zeros == "features":
            dim = 1 if self.model == "conv" else -1
            n = x.shape[dim]
            zero = torch.randperm(n, generator=g)[: max(1, min(n - 1, round(self.rate * n)))]
            x.index_fill_(dim % x.dim(), zero, 0.0)
        elif self.zeros == "elements":
            x[torch.rand(x.shape, generator=g) < self.rate] = 0.0
        return x

    def _input_shape(self) -> tuple[int, ...]:
        if self.model == "conv":
            c, _, size, _ = self.shape
            return (self.batch, c, size, size)
        return (self.batch, self.tokens, self.shape[0]) if self.tokens else (self.batch, self.shape[0])

    def _module(self) -> nn.Module:
        if self.model == "gpt":
            d, heads, vocab = self.shape
            return GPT(GPTConfig(n_layer=1, n_head=heads, d_model=d, vocab_size=vocab, max_seq_len=8))
        if self.model == "conv":
            c, ch, size, out = self.shape
            return nn.Sequential(
                nn.Conv2d(c, ch, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(ch * size * size, out)
            )
        layers: list[nn.Module] = [nn.LayerNorm(self.shape[0])] if self.norm == "in" else []
        for i, (fan_in, fan_out) in enumerate(zip(self.shape[:-1], self.shape[1:])):
            if i and self.act != "none":
                layers.append(ACTIVATIONS[self.act]())
            layers.append(nn.Linear(fan_in, fan_out))
            if i == 0 and self.norm == "mid":
                layers.append(nn.LayerNorm(fan_out))
        return nn.Sequential(*layers)


def _kernels(model: str, shape: tuple[int, ...], act: str, norm: str) -> int:
    """Kernels of the model's program: one per module of the ``nn.Sequential``, the GPT's count."""
    if model == "gpt":
        return GPT_KERNELS
    if model == "conv":
        return 4  # conv, ReLU, flatten (a layout), linear
    layers = len(shape) - 1
    return layers + (layers - 1) * (act != "none") + bool(norm)


def draw_case(rng: random.Random, index: int) -> Case:
    """Draw one case's parameters from ``rng``."""
    model = rng.choices(("mlp", "conv", "gpt"), weights=(0.6, 0.28, 0.12))[0]
    act, norm, tokens = "none", "", 0
    if model == "mlp":
        shape = tuple(rng.randint(8, 96) for _ in range(rng.choice((3, 4))))
        act = rng.choice(("relu", "gelu", "none"))
        norm = rng.choice(("", "", "in", "mid"))
        tokens = rng.choice((0, 0, rng.randint(2, 4)))
        batch = rng.randint(1, 8)
    elif model == "conv":
        shape = (rng.randint(2, 4), rng.randint(4, 12), rng.randint(4, 7), rng.randint(4, 32))
        batch = rng.randint(1, 4)
    else:
        heads = rng.choice((1, 2))
        shape = (rng.choice((8, 16, 32)), heads, rng.randint(16, 64))
        batch, tokens = rng.randint(1, 2), rng.randint(2, 8)
    sparsity = round(rng.uniform(0.5, 0.95), 2)
    mode = rng.choice(("streaming", "pipelined"))
    placement = rng.choice(("block", "balanced"))
    if mode == "pipelined":
        least = max(4, _kernels(model, shape, act, norm))
        width = rng.randint(least, max(least, 16) + 2)
        height = rng.randint(4, 8 if model == "gpt" else 16)
    else:
        width, height = rng.randint(4, 16), rng.randint(4, 16)
    if model == "gpt":
        zeros, rate = "ids", 0.0
    else:
        zeros = rng.choice(("none", "features", "elements"))
        rate = round(rng.uniform(0.1, 0.9), 2) if zeros != "none" else 0.0
    return Case(
        index, rng.randrange(2**31), model, shape, act, norm, sparsity, (width, height), mode, placement,
        batch, tokens, zeros, rate,
    )  # fmt: skip


def draw_cases(n: int, seed: int = 0) -> list[Case]:
    """``n`` cases drawn from ``random.Random(seed)``: the first ``n`` of any longer draw too."""
    rng = random.Random(seed)
    return [draw_case(rng, i) for i in range(n)]


def _close(got: Any, want: Any) -> tuple[bool, float]:
    g, w = tensor_leaves(got), tensor_leaves(want)
    if len(g) != len(w) or not g:
        return False, float("inf")
    ok = all(a.shape == b.shape and torch.allclose(a, b, rtol=RTOL, atol=ATOL) for a, b in zip(g, w))
    err = max(float((a - b).abs().max()) if a.shape == b.shape and a.numel() else 0.0 for a, b in zip(g, w))
    return ok, err


def run_case(case: Case) -> dict[str, Any]:
    """Lower ``case``, run both executors on its fresh inputs and compare: a JSON-ready dict with the
    case's parameters, ``fast`` and ``reference`` total cycles, ``ratio`` (fast / reference), and
    ``fast_ok`` / ``reference_ok`` (outputs equal PyTorch's) with each one's largest error."""
    t0 = time.perf_counter()
    model, example = case.build()
    sm = sparsefx.compile(model, case.sparsity, (example,))
    program = sparsefx.lower(sm, (example,), mesh=case.mesh, mode=case.mode, placement=case.placement)
    x = case.inputs()
    with torch.no_grad():
        expected = sm.eval()(x)
    fast = sparsefx.run(program, (x,))
    outputs, timeline = execute(program, (x,))
    fast_ok, fast_err = _close(fast.outputs, expected)
    ref_ok, ref_err = _close(outputs, expected)
    return asdict(case) | {
        "label": case.label,
        "described_model": case.described_model,
        "described_zeros": case.described_zeros,
        "kernels": len(program.kernels),
        "fast": int(fast.stats.cycles),
        "reference": int(timeline.cycles),
        "ratio": fast.stats.cycles / timeline.cycles,
        "fast_ok": fast_ok,
        "fast_error": fast_err,
        "reference_ok": ref_ok,
        "reference_error": ref_err,
        "seconds": time.perf_counter() - t0,
    }


def gap(result: dict[str, Any]) -> float:
    """``abs(fast / reference - 1)``."""
    return abs(result["ratio"] - 1)
