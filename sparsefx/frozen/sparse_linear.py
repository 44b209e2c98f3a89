"""A linear layer whose weight is packed: ``y = x @ W.T + b`` on the kernel chosen for the call's tokens.

It replaces an ``nn.Linear`` (weight ``[out, in]``) or a Hugging Face ``Conv1D`` (weight ``[in, out]``,
``y = x @ W + b``) whose weight is sparse. Its state is the packed weight (``weight_values``,
``weight_indices``, ``weight_indptr``), the bias, and the kernel chosen for each token bucket
(``kernel_choice``, an index into ``KERNEL_NAMES`` per bucket of ``choose.BUCKETS``), so
``torch.load(weights_only=True)`` of a frozen model's ``state_dict`` gives it back exactly::

    >>> import torch
    >>> from sparsefx.frozen.packed import pack
    >>> lin = torch.nn.Linear(3, 2)
    >>> mask = torch.tensor([[True, False, True], [False, True, False]])
    >>> layer = SparseLinear(pack(lin.weight, mask), lin.bias, ("dense",) * 5)
    >>> x = torch.randn(4, 3)
    >>> torch.allclose(layer(x), torch.nn.functional.linear(x, lin.weight * mask, lin.bias))
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from sparsefx.errors import FreezeError

from . import kernels
from .choose import BUCKETS, kernel_for
from .kernels import KERNELS, NUMBA_KERNELS
from .packed import PackedWeight

__all__ = ["SparseLinear", "KERNEL_NAMES"]

KERNEL_NAMES = tuple(KERNELS)
"""The kernels by index, as ``kernel_choice`` stores them."""


class SparseLinear(nn.Module):
    """``x @ W.T + b`` with ``W`` packed (module docstring)."""

    def __init__(self, packed: PackedWeight, bias: torch.Tensor | None, choice: Sequence[str]) -> None:
        super().__init__()
        self.in_features, self.out_features = packed.in_features, packed.out_features
        self.register_buffer("weight_values", packed.values)
        self.register_buffer("weight_indices", packed.indices)
        self.register_buffer("weight_indptr", packed.indptr)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        codes = [KERNEL_NAMES.index(k) for k in choice]
        self.register_buffer("kernel_choice", torch.tensor(codes, dtype=torch.int8))
        self._packed = packed
        self._choice = tuple(choice)

    @property
    def packed(self) -> PackedWeight:
        """The weight as the kernels read it (rebuilt after ``load_state_dict`` or ``.to()``)."""
        p = self._packed
        if p.values is not self.weight_values or p.indices is not self.weight_indices:
            p = self._packed = self._repack()
        return p

    def _repack(self) -> PackedWeight:
        return PackedWeight(self.weight_values, self.weight_indices, self.weight_indptr, self.in_features)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._packed = self._repack()  # loaded in place: what the kernels had made of it is stale
        self._choice = tuple(KERNEL_NAMES[int(c)] for c in self.kernel_choice)

    @property
    def choice(self) -> tuple[str, ...]:
        """The kernel name for each bucket of ``choose.BUCKETS``."""
        return self._choice

    def kernel(self, tokens: int) -> str:
        """The kernel a call of ``tokens`` rows runs (``spmv`` and ``rows`` need numba: else ``torch``)."""
        name = kernel_for(self._choice, tokens)
        return "torch" if name in NUMBA_KERNELS and not kernels.NUMBA else name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features or x.device.type != "cpu" or x.dtype != self.weight_values.dtype:
            self._refuse(x)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).contiguous()
        if not x2.shape[0]:
            return x2.new_zeros((*lead, self.out_features))
        name = self.kernel(x2.shape[0]) if x2.dtype == torch.float32 else "dense"
        return KERNELS[name](self.packed, x2, self.bias).reshape(*lead, self.out_features)

    def _refuse(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.in_features:
            raise FreezeError(
                f"a frozen linear layer takes {self.in_features} input features; got an input of "
                f"shape {list(x.shape)}"
            )
        if x.device.type != "cpu":
            raise FreezeError(f"a frozen model runs on the CPU; got an input on {x.device}")
        raise FreezeError(
            f"this frozen layer holds {self.weight_values.dtype} weights; got a {x.dtype} input "
            "(freeze the model in the dtype it runs in)"
        )

    def extra_repr(self) -> str:
        p = self.packed
        by_bucket = ", ".join(f"{b}: {k}" for b, k in zip(BUCKETS, self.choice))
        sizes = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{sizes}, density={p.density:.3f}, {by_bucket}"
