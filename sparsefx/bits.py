"""Bitwise select: a bool mask as an all-ones/all-zeros integer pattern, ANDed with float bits.

``where(mask, x, 0)`` on a bool mask runs several times slower on CPU than a bitwise AND of the
float's bits with a same-width integer mask (0 or -1 per entry). Both are a true select: NaN or
Inf at a pruned position cannot leak, and the result there is +0.0::

    >>> x, mask = torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([True, False, True])
    >>> select(x, mask)
    tensor([1., 0., 3.])
    >>> prune_(x, mask) is x, x
    (True, tensor([1., 0., 3.]))

The integer form of a mask costs 4 bytes per entry (float32), so it is cached only once a
gradient selection asks for it (``cached_bits``); pruning alone uses a one-off copy
(``bits_if_cached``). The cache is keyed by the mask's identity and checked against its version
counter, which every in-place write to the mask moves. It is the one owner of a mask's integer
form: a bound weight's gradient hook keeps the entry it last used (``cached_mask_bits``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .identity_map import IdentityMap

__all__ = [
    "SAME_WIDTH_INT",
    "MaskBits",
    "cached_bits",
    "cached_mask_bits",
    "bits_if_cached",
    "and_bits",
    "select",
    "select_",
    "prune_",
    "tracing",
]

SAME_WIDTH_INT: dict[torch.dtype, torch.dtype] = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


class MaskBits(NamedTuple):
    """A mask's integer form: ``tensor`` (0/-1 of ``dtype``), valid while the mask's version is
    ``mask_version``."""

    mask_version: int
    dtype: torch.dtype
    tensor: Tensor


_BITS_CACHE: IdentityMap[MaskBits] = IdentityMap()  # keyed by the mask's identity, not its value


def cached_mask_bits(mask: Tensor, dtype: torch.dtype) -> MaskBits:
    """The cache's entry for ``mask`` as 0/-1 integers of ``dtype``, made when missing or stale.

    >>> cached_mask_bits(torch.tensor([True, False]), torch.int32).tensor
    tensor([-1,  0], dtype=torch.int32)
    """
    cached = _BITS_CACHE.get(mask)
    if cached is not None and cached.mask_version == mask._version and cached.dtype == dtype:
        return cached
    cached = _BITS_CACHE[mask] = MaskBits(mask._version, dtype, mask.to(dtype).neg_())
    return cached


def cached_bits(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``mask`` as 0/-1 integers of ``dtype``, cached until the mask is written or collected.

    >>> cached_bits(torch.tensor([True, False]), torch.int32)
    tensor([-1,  0], dtype=torch.int32)
    """
    cached = _BITS_CACHE.get(mask)
    if cached is not None and cached.mask_version == mask._version and cached.dtype == dtype:
        return cached.tensor
    return cached_mask_bits(mask, dtype).tensor


def bits_if_cached(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The cached bits of ``mask`` when valid, else a one-off copy that is not kept.

    Pruning alone (a compile, an inference model) then keeps no resident copy of the masks; the
    first gradient selection builds the cache that training reuses.
    """
    cached = _BITS_CACHE.get(mask)
    if cached is not None and cached.mask_version == mask._version and cached.dtype == dtype:
        return cached.tensor
    return mask.to(dtype).neg_()


def and_bits(x: Tensor, bits: Tensor) -> Tensor:
    """A new tensor: ``x``'s bits ANDed with ``bits`` (contiguous, whatever ``x``'s strides)."""
    return (bits & x.view(bits.dtype)).view(x.dtype)  # bits first: the result takes its layout


@torch.no_grad()
def prune_(weight: Tensor, mask: Tensor) -> Tensor:
    """Set ``weight`` to +0.0 in place where ``mask`` is False (NaN there too); returns ``weight``."""
    bits_dtype = SAME_WIDTH_INT.get(weight.dtype)
    if bits_dtype is None or not weight.is_contiguous():
        return weight.masked_fill_(~mask, 0.0)
    weight.view(bits_dtype).bitwise_and_(bits_if_cached(mask, bits_dtype))
    return weight


def select_(x: Tensor, mask: Tensor) -> Tensor:
    """``prune_`` for a float tensor outside autograd (a gradient in a hook): no checks.

    >>> select_(torch.tensor([1.0, 2.0]), torch.tensor([False, True]))
    tensor([0., 2.])
    """
    bits_dtype = SAME_WIDTH_INT.get(x.dtype)
    if bits_dtype is None:
        return x.masked_fill_(~mask, 0.0)
    x.view(bits_dtype).bitwise_and_(cached_bits(mask, bits_dtype))
    return x


def select(x: Tensor, mask: Tensor) -> Tensor:
    """``torch.where(mask, x, 0)`` as a new tensor, without autograd (gradient hooks use it)."""
    bits_dtype = SAME_WIDTH_INT.get(x.dtype)
    if bits_dtype is None or x.is_meta or x.layout != torch.strided or tracing():
        return torch.where(mask, x, 0.0)
    return and_bits(x, cached_bits(mask, bits_dtype))


def tracing() -> bool:
    """Is a tracer (``torch.compile``, a fake-tensor trace such as ``torch.export``) running?"""
    return (
        torch.compiler.is_compiling()
        or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
    )
