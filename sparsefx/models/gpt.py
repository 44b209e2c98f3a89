"""A GPT-style decoder-only transformer made of ``nn.Linear`` layers, traceable by ``torch.fx``.

Pre-LayerNorm blocks with a fused ``qkv`` projection, causal
``F.scaled_dot_product_attention`` and a GELU MLP; learned token (``wte``) and position (``wpe``)
embeddings; a final ``ln_f`` and a bias-free ``lm_head``, tied to ``wte`` when ``tie_weights`` is set
(``gpt2_small``, as GPT-2 does). No Python control flow
depends on tensor values or shapes, so ``torch.fx.symbolic_trace`` captures it whole.

    >>> import torch
    >>> model = gpt_tiny()
    >>> (idx,), _ = model.example_inputs(batch=2, seq_len=16)
    >>> model(idx).shape
    torch.Size([2, 16, 256])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sparsefx.errors import ConfigError

__all__ = ["GPTConfig", "GPT", "gpt_tiny", "gpt_small_bench", "gpt2_small"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a :class:`GPT`.

    >>> GPTConfig(n_layer=2, n_head=4, d_model=64, vocab_size=256, max_seq_len=64).head_dim
    16
    """

    n_layer: int
    n_head: int
    d_model: int
    vocab_size: int
    max_seq_len: int
    dropout: float = 0.0
    tie_weights: bool = False  # lm_head.weight is wte.weight (one parameter, two modules)

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "d_model", "vocab_size", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"GPTConfig.{name}: {value!r} is not a positive int")
        if self.d_model % self.n_head:
            raise ConfigError(f"GPTConfig.d_model: {self.d_model} is not divisible by n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"GPTConfig.dropout: {self.dropout} is not in [0, 1)")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_head


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused ``qkv`` Linear and an output ``proj``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.resid_drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, C] -> [B, T, C]``; heads are split with shape-free ``unflatten``/``flatten``."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.resid_drop(self.proj(y.transpose(1, 2).flatten(-2)))


class FeedForward(nn.Module):
    """``fc`` (C -> 4C), GELU, ``proj`` (4C -> C)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, 4 * config.d_model)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * config.d_model, config.d_model)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., C] -> [..., C]``."""
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = FeedForward(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, C] -> [B, T, C]``."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only language model: ``forward(idx[B, T]) -> logits[B, T, vocab_size]``.

    Parameters are named ``wte``, ``wpe``, ``blocks.{i}.attn.qkv``, ``blocks.{i}.attn.proj``,
    ``blocks.{i}.mlp.fc``, ``blocks.{i}.mlp.proj``, ``ln_f`` and ``lm_head`` (with ``tie_weights``,
    ``named_parameters`` lists the shared weight once, as ``wte.weight``). Sequences longer
    than ``max_seq_len`` fail inside ``wpe`` (there is no Python check, to stay traceable).

        >>> sum(p.numel() for p in GPT(GPTConfig(1, 1, 4, 8, 2)).parameters())
        324
        >>> sum(p.numel() for p in GPT(GPTConfig(1, 1, 4, 8, 2, tie_weights=True)).parameters())
        292
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.max_seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights()
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight

    def _init_weights(self) -> None:
        """GPT-2 style init: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer)."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(".proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids ``[B, T]`` (int64) to next-token logits ``[B, T, vocab_size]``."""
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def example_inputs(
        self, batch: int = 2, seq_len: int | None = None
    ) -> tuple[tuple[torch.Tensor, ...], dict]:
        """``((idx,), {})``: random token ids ``[batch, seq_len]`` on the model's device.

        ``seq_len`` defaults to ``min(max_seq_len, 128)``.
        """
        seq_len = min(self.config.max_seq_len, 128) if seq_len is None else seq_len
        if not 0 < seq_len <= self.config.max_seq_len:
            raise ConfigError(f"GPT seq_len: {seq_len} is not in [1, max_seq_len={self.config.max_seq_len}]")
        device = self.wte.weight.device
        return (torch.randint(0, self.config.vocab_size, (batch, seq_len), device=device),), {}


def gpt_tiny() -> GPT:
    """2 layers, d_model 64, 4 heads, vocab 256, context 64 (about 0.1 M parameters)."""
    return GPT(GPTConfig(n_layer=2, n_head=4, d_model=64, vocab_size=256, max_seq_len=64))


def gpt_small_bench() -> GPT:
    """4 layers, d_model 256, 4 heads, vocab 2048, context 128: the benchmark model."""
    return GPT(GPTConfig(n_layer=4, n_head=4, d_model=256, vocab_size=2048, max_seq_len=128))


def gpt2_small() -> GPT:
    """GPT-2 small: 12 layers, d_model 768, 12 heads, vocab 50257, context 1024, and the LM head tied to
    the token embedding as GPT-2 does (124,439,808 parameters)."""
    config = GPTConfig(
        n_layer=12, n_head=12, d_model=768, vocab_size=50257, max_seq_len=1024, tie_weights=True
    )
    return GPT(config)
