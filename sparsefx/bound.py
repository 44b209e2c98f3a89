"""Bound weights: a compiled model's sparse weights, and when each is known to be zero where pruned.

A masked op in a compiled graph must compute with ``where(mask, weight, 0)``. For a weight bound
here (``bind_weight``; ``SparsityAlgorithm`` binds the weights of the model it was compiled with),
``apply_mask`` instead zeroes the weight's pruned positions in place, once, and then uses the
weight itself. Whether that zeroing is needed is decided from version counters, which every
in-place write moves: a weight is *clean* while its version, its mask's identity and its mask's
version are those recorded the last time it was zeroed.

The binding's gradient hook selects each gradient (in place when the graph's op computed it
into a tensor nothing else holds) and remembers the storage and version of what it returned, so
that a later optimizer step can tell, without a pass over the data, that ``.grad`` is still that
selected gradient. ``sparsefx.step_trust`` uses that to keep weights clean across optimizer steps.

    >>> w, m = torch.nn.Parameter(torch.ones(4)), torch.tensor([True, False, True, False])
    >>> handle = bind_weight(w, {"w_mask": m}, "w_mask")
    >>> use_bound(w, m), w.data
    (True, tensor([1., 0., 1., 0.]))
    >>> is_clean(w, m)
    True

Writes through ``weight.data`` do not move the version counter: after one that stores nonzero
values at pruned positions, call ``sparsity.prune_weights()`` (or ``prune_(weight.data, mask)``).

Every step touches these objects once per weight in each phase, right after large kernels have
evicted them from the caches, so the hot methods do as few Python operations as they can.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.hooks import RemovableHandle

from .bits import SAME_WIDTH_INT, and_bits, cached_bits, prune_
from .identity_map import IdentityMap

__all__ = ["Binding", "bind_weight", "binding_of", "use_bound", "is_clean", "generation"]


class Binding:
    """One bound weight: how to find its mask, and what is known clean about it and its gradient."""

    __slots__ = (
        "buffers",
        "key",
        "fresh",
        "clean_mask",
        "weight_version",
        "mask_version",
        "grad_record",
        "bits",
        "bits_mask",
        "bits_version",
        "grad_dtype",
        "capture",
        "handle",
    )

    def __init__(self, buffers: dict[str, Tensor], key: str, fresh: bool) -> None:
        self.buffers, self.key = buffers, key  # the mask is ``buffers[key]`` (read on every use)
        self.fresh = fresh  # the graph's ops compute this weight's gradient into a tensor nothing else holds
        self.clean_mask: Tensor | None = None
        self.weight_version = -1
        self.mask_version = -1
        # (storage of the gradient the hook returned, its version, the mask it used, that mask's version)
        self.grad_record: tuple[weakref.ref[Any], int, Tensor, int] | None = None
        self.bits: Tensor | None = None  # the mask's integer form (shared with sparsefx.bits' cache)
        self.bits_mask: Tensor | None = None
        self.bits_version = -1
        self.grad_dtype: torch.dtype | None = None  # the dtype ``bits`` was made for
        self.capture: Callable[[Tensor], None] | None = None  # sees the dense gradient first (RigL)
        self.handle: RemovableHandle | None = None  # its gradient hook, removed when rebound

    def mask(self) -> Tensor:
        """The weight's current mask."""
        return self.buffers[self.key]

    def is_clean(self, weight: Tensor, mask: Tensor) -> bool:
        """Is ``weight`` known to be +0.0 wherever ``mask`` is False?"""
        return (
            self.clean_mask is mask
            and self.weight_version == weight._version
            and self.mask_version == mask._version
        )

    def set_clean(self, weight: Tensor, mask: Tensor) -> None:
        self.clean_mask, self.weight_version, self.mask_version = mask, weight._version, mask._version

    def ensure_clean(self, weight: Tensor, mask: Tensor) -> None:
        """Zero ``weight``'s pruned positions in place unless it is known clean already.

        Through ``.data``: values the mask keeps do not change, and a version bump would
        invalidate tensors that graphs built earlier saved for their backward.
        """
        if not self.is_clean(weight, mask):
            prune_(weight.data, mask)
            self.set_clean(weight, mask)

    def select_grad(self, grad: Tensor) -> Tensor:
        """The weight's gradient hook: ``where(mask, grad, 0)``, in place when the gradient is fresh."""
        if self.capture is not None:
            self.capture(grad)  # before the select, which may work in place
        mask = self.buffers[self.key]
        bits = self.bits
        # The common case first, in as few Python operations as possible: the cached bits match the
        # mask and the gradient's dtype (so it is a float of a width bits.py handles), and the
        # gradient is a plain strided tensor outside any graph.
        if (
            bits is None
            or self.bits_mask is not mask
            or self.bits_version != mask._version
            or grad.dtype is not self.grad_dtype
            or grad.requires_grad
            or grad.layout is not torch.strided
            or grad.is_meta
        ):
            bits = self._bits_for(grad, mask)
            if bits is None:
                self.grad_record = None
                return torch.where(mask, grad, 0.0)  # differentiable under create_graph=True
        if self.fresh:
            grad.view(bits.dtype).bitwise_and_(bits)
        else:
            grad = and_bits(grad, bits)
        self.grad_record = (weakref.ref(grad.untyped_storage()), grad._version, mask, mask._version)
        return grad

    def _bits_for(self, grad: Tensor, mask: Tensor) -> Tensor | None:
        """The integer form of ``mask`` for ``grad``, or None when ``grad`` needs ``where``."""
        bits_dtype = SAME_WIDTH_INT.get(grad.dtype)
        if grad.requires_grad or bits_dtype is None or grad.layout != torch.strided or grad.is_meta:
            return None
        self.bits = cached_bits(mask, bits_dtype)
        self.bits_mask, self.bits_version, self.grad_dtype = mask, mask._version, grad.dtype
        return self.bits

    def grad_clean(self, grad: Tensor, mask: Tensor) -> bool:
        """Is ``grad`` (a ``.grad``) the gradient this hook last selected with ``mask``, unwritten since?

        The hook's result becomes ``.grad`` itself when autograd accumulates it into an empty
        ``.grad`` (the common case: it shares storage and version counter). Anything else, an
        accumulation into an existing ``.grad``, a later hook that returns another tensor or
        writes this one, an assignment to ``.grad``, shows as another storage or version.
        """
        record = self.grad_record
        return (
            record is not None
            and record[0]() is grad.untyped_storage()
            and record[1] == grad._version
            and record[2] is mask
            and record[3] == mask._version
        )


_BOUND: IdentityMap[Binding] = IdentityMap()
_GENERATION = [0]  # moves on every (un)binding, so per-optimizer caches of bound weights refresh


def bind_weight(
    weight: Tensor, buffers: dict[str, Tensor] | None, key: str = "", *, fresh: bool = False
) -> RemovableHandle | None:
    """Let ``apply_mask`` zero ``weight`` in place and use it directly (``buffers=None`` unbinds).

    ``buffers[key]`` is the weight's current mask (a module's ``_buffers``: replacing or loading
    the buffer is seen). Registers the gradient hook that selects every gradient of ``weight``
    and returns its handle (the caller removes it when it unbinds).
    ``fresh`` says the graph's masked ops are the weight's only readers, so the hook may select
    in place (see ``SparseModel.weights_with_fresh_grads``).
    """
    _GENERATION[0] += 1
    if buffers is None:
        _BOUND.pop(weight, None)
        return None
    binding = Binding(buffers, key, fresh)
    previous = _BOUND.get(weight)
    if previous is not None and previous.handle is not None:
        previous.handle.remove()  # one selecting hook per weight: the newest binding's
    _BOUND[weight] = binding
    from .step_trust import install_step_hooks  # step_trust imports this module

    install_step_hooks()
    binding.handle = weight.register_hook(binding.select_grad)
    return binding.handle


def binding_of(weight: Tensor) -> Binding | None:
    """The binding of ``weight``, if it is bound."""
    return _BOUND.get(weight)


def generation() -> int:
    """A number that changes whenever any weight is bound or unbound."""
    return _GENERATION[0]


def use_bound(weight: Tensor, mask: Tensor) -> bool:
    """If ``weight`` is bound and clean for ``mask``, or ``mask`` is its own mask and zeroing it in
    place makes it clean, say True: the masked op may use ``weight`` as is (``apply_mask``)."""
    binding = _BOUND.get(weight)
    if binding is None:
        return False
    if binding.is_clean(weight, mask):
        return True
    if binding.mask() is not mask:
        return False
    binding.ensure_clean(weight, mask)
    return True


def is_clean(weight: Tensor, mask: Tensor) -> bool:
    """Is ``weight`` bound and known to be zero where ``mask`` is False?"""
    binding = _BOUND.get(weight)
    return binding is not None and binding.is_clean(weight, mask)
