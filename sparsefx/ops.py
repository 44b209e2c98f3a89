"""Masked-sparse ops: the explicit form of weight masking in a compiled graph.

Each op computes its dense counterpart on ``torch.where(mask, weight, 0)``. The select (not a
multiply) means NaN or Inf stored at pruned positions cannot leak into outputs, and autograd of
``where`` gives the masked weight gradient ``where(mask, grad, 0)``: pruned gradients are exactly 0.

``sparsefx.op_table`` describes each of them once (sources, operand positions, FLOPs)::

    >>> w, m = torch.ones(2, 3), torch.tensor([[True, False, True], [False, True, False]])
    >>> masked_linear(torch.ones(1, 3), w, m)
    tensor([[2., 1.]])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .bits import SAME_WIDTH_INT, and_bits, cached_bits, prune_, select, select_, tracing

__all__ = [
    "apply_mask",
    "select",
    "select_",
    "prune_",
    "masked_linear",
    "masked_matmul",
    "masked_addmm",
    "masked_conv1d",
    "masked_conv2d",
    "masked_module_call",
    "register_fast_path",
]

# ``sparsefx.bound.use_bound`` once that module is imported (any binding imports it): the graph
# vocabulary does not import the training machinery, which registers itself here.
_bound_fast_path: Callable[[Tensor, Tensor], bool] | None = None


def register_fast_path(fn: Callable[[Tensor, Tensor], bool] | None) -> None:
    """Let ``apply_mask`` return ``weight`` itself whenever ``fn(weight, mask)`` says True.

    ``fn`` promises that ``weight`` is zero where ``mask`` is False and that its gradient gets
    selected (``sparsefx.bound`` registers ``use_bound``); ``None`` clears the slot.
    """
    global _bound_fast_path
    _bound_fast_path = fn


def apply_mask(weight: Tensor, mask: Tensor) -> Tensor:
    """``weight`` with pruned positions selected to +0.0; the gradient is selected the same way.

    Equal to ``torch.where(mask, weight, 0)``. Two implementations give that result:

    * A weight bound with ``sparsefx.bound.bind_weight`` (a compiled model's own parameter) is
      zeroed in place at its pruned positions unless it is known to be already, and returned as
      is; its gradient is selected by its sparsity algorithm's hook. No autograd node and no copy;
      usually no pass over the weight at all (see ``sparsefx.bound``).
    * Any other tensor (a tensor passed to ``torch.func.functional_call``, or a trace) goes through
      an autograd function: a bitwise AND of the float bits with an all-ones/all-zeros integer
      mask, forward and backward. It is a true select (NaN at a pruned position cannot leak), and on
      CPU several times faster than ``where`` on a bool mask.
    """
    if (
        not torch.compiler.is_compiling()  # a fake or traced tensor is never bound
        and (fast_path := _bound_fast_path) is not None
        and fast_path(weight, mask)
    ):
        return weight
    bits_dtype = SAME_WIDTH_INT.get(weight.dtype)
    if bits_dtype is None or weight.is_meta:
        return torch.where(mask, weight, 0.0)
    if tracing():
        return _BitSelect.apply(weight, mask.to(bits_dtype).neg_())
    return _BitSelect.apply(weight, cached_bits(mask, bits_dtype))


class _BitSelect(torch.autograd.Function):
    """``x`` with its bits ANDed with ``bits`` (0 or -1 per entry); the gradient is selected alike."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, bits: Tensor) -> Tensor:
        ctx.save_for_backward(bits)
        return and_bits(x, bits)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (bits,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: stay differentiable for double backward
            return _BitSelect.apply(grad, bits), None
        return and_bits(grad, bits), None


def masked_linear(input: Tensor, weight: Tensor, mask: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` with a masked weight shaped [out, in]."""
    return F.linear(input, apply_mask(weight, mask), bias)


def masked_matmul(input: Tensor, weight: Tensor, mask: Tensor, weight_first: bool = False) -> Tensor:
    """``input @ weight`` (or ``weight @ input`` when ``weight_first``) with a masked weight."""
    w = apply_mask(weight, mask)
    return torch.matmul(w, input) if weight_first else torch.matmul(input, w)


def masked_addmm(
    bias: Tensor, input: Tensor, weight: Tensor, mask: Tensor, beta: float = 1, alpha: float = 1
) -> Tensor:
    """``torch.addmm(bias, input, weight)`` with a masked weight shaped [in, out] (GPT-2 Conv1D style)."""
    return torch.addmm(bias, input, apply_mask(weight, mask), beta=beta, alpha=alpha)


def masked_conv1d(
    input: Tensor,
    weight: Tensor,
    mask: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | str | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> Tensor:
    """``F.conv1d`` with a masked weight shaped [out, in/groups, k]."""
    return F.conv1d(input, apply_mask(weight, mask), bias, stride, padding, dilation, groups)


def masked_conv2d(
    input: Tensor,
    weight: Tensor,
    mask: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | str | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> Tensor:
    """``F.conv2d`` with a masked weight shaped [out, in/groups, kh, kw]."""
    return F.conv2d(input, apply_mask(weight, mask), bias, stride, padding, dilation, groups)


def masked_module_call(
    module: nn.Module, masks: Mapping[str, Tensor], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """Call a leaf module whose own parameters named in ``masks`` are replaced by their masked form.

    This is the generic form for leaf modules the rewrite has no named op for
    (``nn.MultiheadAttention``, ``nn.Bilinear`` ...).
    """
    params = {name: apply_mask(getattr(module, name), mask) for name, mask in masks.items()}
    return torch.func.functional_call(module, params, args, dict(kwargs))
