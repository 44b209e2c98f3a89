"""The built-in model names and what each one is, without importing torch (the CLI's help reads them).

>>> "gpt2-small" in BUILTIN_MODELS
True
"""

from __future__ import annotations

__all__ = ["BUILTIN_MODELS"]

BUILTIN_MODELS: dict[str, str] = {
    "mlp": "MLP 64 -> 256 -> 256 -> 10 with ReLU; input (batch, 64)",
    "gpt-tiny": "GPT, 2 layers, d_model 64, 4 heads, vocab 256, ctx 64",
    "gpt-small-bench": "GPT, 4 layers, d_model 256, 4 heads, vocab 2048, ctx 128 (benchmarks)",
    "gpt2-small": "GPT-2 small: 12 layers, d_model 768, 12 heads, vocab 50257, LM head tied to wte (124M)",
    "cnn": "Small CNN (strided + grouped Conv2d, BatchNorm) for 3x32x32 images",
    "conv1d": "1-D CNN (Conv1d) for [batch, 4, 128] signals",
    "zoo-data-dependent": "Branches on a tensor value; neither fx nor torch.export captures it",
    "zoo-shape-branch": "Branches on input shapes; fx fails, torch.export works",
    "zoo-inplace": "Item assignment into activations; fx fails, torch.export works",
    "zoo-dataclass": "Keyword-only args and a dataclass output; fx fails, torch.export works",
    "zoo-dict": "Python loop over the sequence length, dict output; fx fails, torch.export works",
    "zoo-gpt2-conv1d": "Hugging Face-style tiny GPT-2 with Conv1D layers; fx fails, torch.export works",
}
