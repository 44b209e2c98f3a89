"""Built-in models used by the CLI, the demo, the tests and the benchmarks.

>>> spec = build_model("gpt-tiny", batch=1)
>>> spec.model(*spec.args, **spec.kwargs).shape
torch.Size([1, 64, 256])
"""

from __future__ import annotations

from sparsefx.models.cnn import Conv1dNet, SmallCNN
from sparsefx.models.gpt import GPT, GPTConfig, gpt2_small, gpt_small_bench, gpt_tiny
from sparsefx.models.mlp import MLP
from sparsefx.models.registry import BUILTIN_MODELS, ModelSpec, build_model
from sparsefx.models.zoo import (
    CausalLMOutput,
    Conv1D,
    Conv1DGPT2,
    DataclassOutputNet,
    DataDependentMLP,
    DictOutputNet,
    GPT2ConvConfig,
    InplaceAssignNet,
    ShapeBranchNet,
    ZooOutput,
)

__all__ = [
    "BUILTIN_MODELS",
    "ModelSpec",
    "build_model",
    "MLP",
    "GPT",
    "GPTConfig",
    "gpt_tiny",
    "gpt_small_bench",
    "gpt2_small",
    "SmallCNN",
    "Conv1dNet",
    "DataDependentMLP",
    "ShapeBranchNet",
    "InplaceAssignNet",
    "DataclassOutputNet",
    "ZooOutput",
    "DictOutputNet",
    "Conv1DGPT2",
    "Conv1D",
    "GPT2ConvConfig",
    "CausalLMOutput",
]
