"""Built-in models used by the CLI, the demo, the tests and the benchmarks.

>>> from sparsefx.models import build_model
>>> spec = build_model("gpt-tiny", batch=1)
>>> spec.model(*spec.args, **spec.kwargs).shape
torch.Size([1, 64, 256])

Names load on first use: ``sparsefx.models.names`` (the built-in names, for the CLI's help) is
importable without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparsefx.models.cnn import Conv1dNet, SmallCNN
    from sparsefx.models.gpt import GPT, GPTConfig, gpt2_small, gpt_small_bench, gpt_tiny
    from sparsefx.models.mlp import MLP
    from sparsefx.models.names import BUILTIN_MODELS
    from sparsefx.models.registry import ModelSpec, build_model
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

_HOME: dict[str, str] = {
    "BUILTIN_MODELS": "names",
    "ModelSpec": "registry",
    "build_model": "registry",
    "MLP": "mlp",
    "GPT": "gpt",
    "GPTConfig": "gpt",
    "gpt_tiny": "gpt",
    "gpt_small_bench": "gpt",
    "gpt2_small": "gpt",
    "SmallCNN": "cnn",
    "Conv1dNet": "cnn",
    "DataDependentMLP": "zoo",
    "ShapeBranchNet": "zoo",
    "InplaceAssignNet": "zoo",
    "DataclassOutputNet": "zoo",
    "ZooOutput": "zoo",
    "DictOutputNet": "zoo",
    "Conv1DGPT2": "zoo",
    "Conv1D": "zoo",
    "GPT2ConvConfig": "zoo",
    "CausalLMOutput": "zoo",
}


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first access."""
    if name not in _HOME:
        raise AttributeError(f"module 'sparsefx.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
