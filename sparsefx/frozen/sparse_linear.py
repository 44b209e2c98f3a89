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
from typing import Any, NamedTuple

import torch
from torch import nn

from sparsefx.errors import FreezeError

from . import kernels
from .choose import BUCKETS, kernel_for
from .kernels import KERNELS, Kernel
from .packed import PackedWeight

__all__ = ["SparseLinear", "KERNEL_NAMES"]

KERNEL_NAMES = tuple(KERNELS)
"""The kernels by index, as ``kernel_choice`` stores them."""


class SparseLinear(nn.Module):
    """``x @ W.T + b`` with ``W`` packed (module docstring)."""

    buckets: tuple[int, ...] = BUCKETS
    """The token counts ``kernel_choice`` has one kernel for (a call takes the largest at or below it)."""

    def __init__(
        self, packed: PackedWeight, bias: torch.Tensor | None, choice: Sequence[str], transposed: bool = False
    ) -> None:
        super().__init__()
        self.transposed = transposed  # the layer it replaced stored [in, out] (Hugging Face's Conv1D)
        self.in_features, self.out_features = packed.in_features, packed.out_features
        self.register_buffer("weight_values", packed.values)
        self.register_buffer("weight_indices", packed.indices)
        self.register_buffer("weight_indptr", packed.indptr)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        codes = [KERNEL_NAMES.index(k) for k in choice]
        self.register_buffer("kernel_choice", torch.tensor(codes, dtype=torch.int8))
        self._packed = packed
        self._choice = tuple(choice)
        self._plan: _Plan | None = None

    @property
    def packed(self) -> PackedWeight:
        """The weight as the kernels read it (rebuilt after ``load_state_dict`` or ``.to()``)."""
        p = self._packed
        if p.values is not self.weight_values or p.indices is not self.weight_indices:
            p = self._packed = self._repack()
        return p

    @property
    def weight(self) -> torch.Tensor:
        """The masked weight, dense, as the replaced layer held it (models read ``.weight.dtype``).
        Rebuilt from the packed form at each read, unless the dense kernel keeps it; not trainable."""
        p = self.packed
        dense = p._cache.get("dense")
        dense = p.csr().to_dense() if dense is None else dense
        return self._layout(dense)

    def _layout(self, dense: torch.Tensor) -> torch.Tensor:
        return dense.T if self.transposed else dense

    def _repack(self) -> PackedWeight:
        return PackedWeight(self.weight_values, self.weight_indices, self.weight_indptr, self.in_features)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._packed = self._repack()  # loaded in place: what the kernels had made of it is stale
        self._packed.check(f"{prefix or 'the layer'}'s packed weight")
        codes = [int(c) for c in self.kernel_choice]
        if len(codes) != len(self.buckets) or not all(0 <= c < len(KERNEL_NAMES) for c in codes):
            raise FreezeError(
                f"{prefix}kernel_choice is {codes}: one of 0..{len(KERNEL_NAMES) - 1} for each of "
                f"{len(self.buckets)} token buckets"
            )
        self._choice = tuple(KERNEL_NAMES[c] for c in codes)
        self._plan = None

    def _apply(self, fn: Any, recurse: bool = True) -> SparseLinear:
        self._plan = None  # .to() and friends may replace the buffers the plan bound
        return super()._apply(fn, recurse)

    @property
    def choice(self) -> tuple[str, ...]:
        """The kernel name for each bucket of ``buckets``."""
        return self._choice

    def kernel(self, tokens: int) -> str:
        """The kernel a call of ``tokens`` rows runs (where the chosen one does not run here, the
        one ``kernels.stand_in`` names)."""
        if self.weight_values.dtype != torch.float32:
            return "dense"
        return kernels.stand_in(kernel_for(self._choice, tokens, self.buckets))

    def _bound(self) -> _Plan:
        """The kernels bound to the weight, one a bucket (what ``forward`` runs, looked up once)."""
        plan = self._plan
        if plan is None or plan.values is not self._buffers["weight_values"]:
            p, bias = self.packed, self.bias
            exact = tuple(self.kernel(b) for b in self.buckets)
            between = tuple(self.kernel(b + 1) for b in self.buckets)  # above a bucket, below the next
            by_name = {name: self._bind(name, p, bias) for name in {*exact, *between}}
            runs = tuple(by_name[k] for k in exact), tuple(by_name[k] for k in between)
            plan = self._plan = _Plan(p.values, p.values.dtype, *runs, self._bind_one(exact[0], p, bias))
        return plan

    def _run(self, plan: _Plan, tokens: int) -> Any:
        """The bound kernel a call of ``tokens`` runs (``choose.kernel_for``'s rule)."""
        at = self._bucket(tokens)
        return plan.exact[at] if tokens == self.buckets[at] else plan.between[at]

    def _bind(self, name: str, p: PackedWeight, bias: torch.Tensor | None) -> Any:
        return kernels.bind(name, p, bias)

    def _bind_one(self, name: str, p: PackedWeight, bias: torch.Tensor | None) -> Any:
        return kernels.bind_one(name, p, bias)

    def _bucket(self, tokens: int) -> int:
        """The index in ``buckets`` of the largest at or below ``tokens`` (0 below them all)."""
        at, buckets = 0, self.buckets
        while at + 1 < len(buckets) and tokens >= buckets[at + 1]:
            at += 1
        return at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plan, fin, shape = self._plan, self.in_features, x.shape
        if plan is None or plan.values is not self._buffers["weight_values"]:
            plan = self._bound()
        if shape[-1] != fin or x.dtype != plan.dtype or x.device.type != "cpu":
            self._refuse(x)
        tokens = x.numel() // fin
        if tokens == 1:  # a decoding step: the fewest calls (``kernels.bind_one``)
            return plan.one(x)
        if not tokens:
            return x.new_zeros((*shape[:-1], self.out_features))
        y = self._run(plan, tokens)(x.reshape(tokens, fin).contiguous())
        return y.reshape(*shape[:-1], self.out_features).contiguous()  # as nn.Linear's: contiguous

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
        by_bucket = ", ".join(f"{b}: {k}" for b, k in zip(self.buckets, self.choice))
        sizes = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{sizes}, density={p.density:.3f}, {by_bucket}"


class _Plan(NamedTuple):
    values: torch.Tensor  # the buffer it was bound to: another one means bind again
    dtype: torch.dtype
    exact: tuple[Kernel, ...]  # bound, one a bucket, for a call of its size (a SparseConv's: column
    between: tuple[Kernel, ...]  # kernels, None for dense); for one above it, below the next
    one: Any  # for a call of one token, of any leading shape (``kernels.bind_one``; a SparseConv's: None)
