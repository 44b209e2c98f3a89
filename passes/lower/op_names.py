"""One canonical name per graph op, whatever spelling the graph uses.

torch.fx graphs say ``F.relu``, ``x.relu()``, ``nn.ReLU`` or ``operator.add``; ``torch.export`` graphs
say ``aten.relu.default``. Lowering rules are keyed by one name per op::

    >>> import operator
    >>> from torch import nn
    >>> canonical_function(operator.add), canonical_function(torch.ops.aten.add.Tensor)
    ('add', 'add')
    >>> canonical_module(nn.GELU(approximate="tanh")), canonical_method("transpose")
    ('gelu', 'transpose')
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import nn

__all__ = ["canonical_function", "canonical_method", "canonical_module", "MODULES"]

_OPERATORS = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "div",
    operator.neg: "neg",
    operator.pow: "pow",
    operator.getitem: "getitem",
    operator.matmul: "matmul",
    operator.iadd: "add",  # in place: interpret._mutates says so, and lowering follows the write
    operator.isub: "sub",
    operator.imul: "mul",
    operator.itruediv: "div",
    operator.ipow: "pow",
    operator.iand: "bitwise_and",
    operator.ior: "bitwise_or",
    operator.ixor: "bitwise_xor",
    operator.and_: "bitwise_and",
    operator.or_: "bitwise_or",
    operator.xor: "bitwise_xor",
    operator.invert: "bitwise_not",
    operator.eq: "eq",
    operator.ne: "ne",
    operator.lt: "lt",
    operator.le: "le",
    operator.gt: "gt",
    operator.ge: "ge",
}

_ALIASES = {
    "true_divide": "div",
    "divide": "div",
    "multiply": "mul",
    "subtract": "sub",
    "_softmax": "softmax",
    "_log_softmax": "log_softmax",
    "native_layer_norm": "layer_norm",
    "_unsafe_view": "view",
    "_to_copy": "to",
    "alias": "identity",
    "lift_fresh_copy": "identity",
    "detach": "identity",
    "clone": "identity",
    "contiguous": "identity",
    "feature_dropout": "dropout",
    "native_dropout": "dropout",
    "sym_size": "size",
    "split_with_sizes": "split",
    "squeeze_": "squeeze",
    "unsqueeze_": "unsqueeze",
    "rsub": "rsub",
    "numpy_T": "attr_T",
    "mT": "attr_mT",
    "_assert_tensor_metadata": "assert_metadata",
    "scaled_dot_product_attention": "sdpa",
    "_scaled_dot_product_flash_attention_for_cpu": "sdpa_flash",
    "masked_fill_": "masked_fill",
    "relu_": "relu",
    "__and__": "bitwise_and",
    "__or__": "bitwise_or",
    "__xor__": "bitwise_xor",
    "__invert__": "bitwise_not",
    "add_": "add",
    "sub_": "sub",
    "mul_": "mul",
    "div_": "div",
    "pow_": "pow",
    "__iand__": "bitwise_and",
    "__ior__": "bitwise_or",
    "__ixor__": "bitwise_xor",
}

MODULES: dict[type, str] = {
    nn.ReLU: "relu",
    nn.GELU: "gelu",
    nn.Tanh: "tanh",
    nn.Sigmoid: "sigmoid",
    nn.SiLU: "silu",
    nn.Identity: "identity",
    nn.Dropout: "dropout",
    nn.Dropout1d: "dropout",
    nn.Dropout2d: "dropout",
    nn.LayerNorm: "layer_norm",
    nn.Embedding: "embedding",
    nn.Linear: "linear",
    nn.Conv1d: "conv1d",
    nn.Conv2d: "conv2d",
    nn.BatchNorm1d: "batch_norm",
    nn.BatchNorm2d: "batch_norm",
    nn.BatchNorm3d: "batch_norm",
    nn.MaxPool2d: "max_pool2d",
    nn.AvgPool2d: "avg_pool2d",
    nn.AdaptiveAvgPool2d: "adaptive_avg_pool2d",
    nn.AdaptiveAvgPool1d: "adaptive_avg_pool1d",
    nn.Flatten: "flatten",
    nn.Softmax: "softmax",
}
"""Leaf module classes lowering knows (their stock ``forward`` only) -> canonical op name."""


def _clean(name: str) -> str:
    name = _ALIASES.get(name, name)
    return name


def canonical_function(target: Any) -> str:
    """The canonical name of a ``call_function`` target (a torch function, operator or aten overload)."""
    if target in _OPERATORS:
        return _OPERATORS[target]
    if isinstance(target, torch._ops.OpOverload):
        return _clean(target.overloadpacket.__name__)
    if isinstance(target, torch._ops.OpOverloadPacket):
        return _clean(target.__name__)
    name = getattr(target, "__name__", str(target))
    return _clean(name)


def canonical_method(name: str) -> str:
    """The canonical name of a ``call_method`` target (a tensor method name)."""
    return _clean(name)


def canonical_module(module: nn.Module) -> str | None:
    """The canonical name of a leaf module, or None when its class (or a custom forward) is unknown."""
    for cls, name in MODULES.items():
        if type(module) is cls or (isinstance(module, cls) and type(module).forward is cls.forward):
            return name
    return None
