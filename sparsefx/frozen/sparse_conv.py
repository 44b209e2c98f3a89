"""A convolution whose weight is packed: im2col (``F.unfold``), then a frozen linear layer's kernels.

A ``Conv1d`` or ``Conv2d`` (one group) computes, at each output position, the weight's
``[out, in * kernel]`` matrix times the input patch under the kernel. ``SparseConv`` unfolds the
(padded) input into those patches, one a token, and runs the packed matrix on them with the kernel
chosen for the call's output positions (batch times spatial, ``CONV_BUCKETS``). The kernels read
the patches as unfolded, tokens as columns (``kernels.bind_columns``), and write the output in the
convolution's layout: no transpose either way. Where ``dense`` is chosen it runs the convolution
itself on the masked weight (``F.conv1d``/``F.conv2d``), so a layer is never slower than the
original by more than the measurement's noise. Its state is a ``SparseLinear``'s (the packed weight,
bias and ``kernel_choice``)::

    >>> import torch
    >>> from sparsefx.frozen.packed import pack
    >>> conv = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
    >>> mask = torch.rand(conv.weight.shape) < 0.3
    >>> p = pack(conv.weight.reshape(4, -1), mask.reshape(4, -1))
    >>> layer = SparseConv(conv, p, ("torch",) * len(CONV_BUCKETS))
    >>> x = torch.randn(2, 3, 8, 8)
    >>> with torch.no_grad():
    ...     _ = conv.weight.mul_(mask)
    >>> torch.allclose(layer(x), conv(x), rtol=1e-4, atol=1e-5)
    True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sparsefx.errors import FreezeError

from . import kernels
from .choose import BUDGET, fastest
from .kernels import ColumnKernel
from .packed import PackedWeight
from .sparse_linear import SparseLinear

__all__ = ["SparseConv", "CONV_BUCKETS", "conv_refusal", "choose_conv"]

CONV_BUCKETS = (16, 64, 256, 1024, 4096)
"""Output positions a call (batch times spatial) the choice is measured at."""


def conv_refusal(module: nn.Module) -> str | None:
    """None where ``module`` is a convolution ``SparseConv`` runs; else why it is not ("" where
    ``module`` is no convolution at all)."""
    if not isinstance(module, nn.modules.conv._ConvNd):
        return ""
    if type(module) not in (nn.Conv1d, nn.Conv2d):
        return f"a {type(module).__name__}: the packed kernels run Conv1d and Conv2d"
    if module.groups != 1:
        return f"a grouped convolution (groups={module.groups}): the packed kernels take one group"
    return None


class SparseConv(SparseLinear):
    """``conv(x)`` with the weight packed as ``[out, in * kernel]`` (module docstring)."""

    buckets = CONV_BUCKETS

    def __init__(self, conv: nn.Conv1d | nn.Conv2d, packed: PackedWeight, choice: Sequence[str]) -> None:
        super().__init__(packed, conv.bias, choice)
        self.dims = conv.weight.dim() - 2
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride, self.dilation = conv.kernel_size, conv.stride, conv.dilation
        self.pad = tuple(conv._reversed_padding_repeated_twice)  # F.pad's amounts, the last dim first
        self.pad_mode = "constant" if conv.padding_mode == "zeros" else conv.padding_mode
        self.weight_shape = tuple(conv.weight.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plan = self._bound()
        if x.dim() not in (self.dims + 1, self.dims + 2) or x.shape[-self.dims - 1] != self.in_channels:
            raise FreezeError(
                f"a frozen {self.dims}-d convolution takes [batch,] {self.in_channels} channels and "
                f"{self.dims} spatial dims; got an input of shape {list(x.shape)}"
            )
        if x.dtype != plan.dtype or x.device.type != "cpu":
            self._refuse(x)
        batched = x if x.dim() == self.dims + 2 else x.unsqueeze(0)
        out = self._out_shape(batched)
        y = self._conv(batched, out, self._run(plan, math.prod(out[:1] + out[2:])))
        return y if x.dim() == self.dims + 2 else y.squeeze(0)

    def conv(self, x: torch.Tensor, run: ColumnKernel | None) -> torch.Tensor:
        """The convolution of batched ``x``: dense on the masked weight where ``run`` is None (as
        ``nn.Conv2d`` runs it), else its patches through the bound kernel ``run``."""
        return self._conv(x, self._out_shape(x), run)

    def _out_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        pads = [self.pad[2 * i] + self.pad[2 * i + 1] for i in reversed(range(self.dims))]
        spatial = [
            (size + pad - d * (k - 1) - 1) // s + 1
            for size, pad, k, s, d in zip(x.shape[2:], pads, self.kernel_size, self.stride, self.dilation)
        ]
        return (x.shape[0], self.out_channels, *spatial)

    def _conv(self, x: torch.Tensor, out: tuple[int, ...], run: ColumnKernel | None) -> torch.Tensor:
        symmetric = all(self.pad[i] == self.pad[i + 1] for i in range(0, len(self.pad), 2))
        if self.pad_mode != "constant" or (run is not None and not symmetric):
            x, padding = F.pad(x, self.pad, mode=self.pad_mode), (0,) * self.dims
        else:  # zeros: the convolution (or the unfold) pads as it reads
            padding = tuple(self.pad[2 * i] for i in reversed(range(self.dims)))
        if run is None:
            if self.pad_mode == "constant" and not symmetric:
                padding = "same"  # the one padding of zeros that is not the same on both sides
            weight = self.packed.dense().reshape(self.weight_shape)
            dense = F.conv2d if self.dims == 2 else F.conv1d
            return dense(x, weight, self.bias, self.stride, padding, self.dilation)
        if self.dims == 2:
            cols = F.unfold(x, self.kernel_size, self.dilation, padding, self.stride)
        else:  # a 1-d convolution is a 2-d one over one row
            k, d, s = self.kernel_size, self.dilation, self.stride
            cols = F.unfold(x.unsqueeze(2), (1, *k), (1, *d), (0, *padding), (1, *s))
        y = cols.new_empty((cols.shape[0], self.out_channels, cols.shape[2]))
        for image, patches in enumerate(cols):  # [in * kernel, positions]: tokens as columns already
            run(patches, y[image])
        return y.reshape(out)

    def _layout(self, dense: torch.Tensor) -> torch.Tensor:
        return dense.reshape(self.weight_shape)

    def _bind_one(self, name: str, p: PackedWeight, bias: torch.Tensor | None) -> None:
        return None  # a convolution's calls go through ``forward``'s unfolding

    def _bind(self, name: str, p: PackedWeight, bias: torch.Tensor | None) -> ColumnKernel | None:
        return None if name == "dense" else kernels.bind_columns(name, p, bias)

    def extra_repr(self) -> str:
        geometry = f"kernel_size={self.kernel_size}, stride={self.stride}, dilation={self.dilation}"
        return f"{self.in_channels}, {self.out_channels}, {geometry}, {super().extra_repr()}"


def _probe(layer: SparseConv, positions: int) -> torch.Tensor:
    """A one-image input whose output has about ``positions`` positions (at least one a dim)."""
    side = max(1, round(positions ** (1 / layer.dims)))
    sizes = []
    for i, (k, s, d) in enumerate(zip(layer.kernel_size, layer.stride, layer.dilation)):
        padding = layer.pad[2 * (layer.dims - 1 - i)] + layer.pad[2 * (layer.dims - 1 - i) + 1]
        need = (side - 1) * s + d * (k - 1) + 1 - padding
        sizes.append(max(need, padding // 2 + 1, 1))  # reflect padding needs more input than it pads
    gen = torch.Generator().manual_seed(positions)
    return torch.randn(1, layer.in_channels, *sizes, generator=gen, dtype=layer.weight_values.dtype)


def choose_conv(layer: SparseConv, candidates: Sequence[str], *, cold: bool = False) -> tuple[str, ...]:
    """The fastest of ``candidates`` for ``layer`` at each of ``CONV_BUCKETS``, the dense convolution
    among them, measured as ``choose.fastest`` does (cold or not). A bucket past ``BUDGET`` dense
    multiply-adds takes the choice of the largest one measured (a wide layer at 4096 positions would
    take seconds a call)."""
    if layer.weight_values.dtype != torch.float32:
        return ("dense",) * len(CONV_BUCKETS)
    p, bias = layer.packed, layer.bias
    bound = {k: kernels.bind_columns(k, p, bias) for k in candidates if k in kernels.COLUMN_BINDERS}
    choice: list[str] = []
    for positions in CONV_BUCKETS:
        if choice and positions * p.in_features * p.out_features > BUDGET:
            choice.append(choice[-1])
            continue
        x = _probe(layer, positions)
        run = {k: functools.partial(layer.conv, x, b) for k, b in bound.items()}
        run["dense"] = functools.partial(layer.conv, x, None)
        choice.append(fastest(run, cold=cold))
    return tuple(choice)
