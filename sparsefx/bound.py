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
selected gradient. ``sparsefx.step_trust`` uses that to keep weights clean across optimizer steps;
it depends on this module, not the other way: it asks ``watch_bindings`` to hear when the first
weight is bound and when the last binding goes. Importing this module registers ``use_bound`` as
``sparsefx.ops``' fast path, so the graph vocabulary never imports the training machinery.

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

from .bits import SAME_WIDTH_INT, MaskBits, and_bits, cached_mask_bits, prune_
from .identity_map import IdentityMap
from .ops import register_fast_path

__all__ = [
    "Binding",
    "bind_weight",
    "binding_of",
    "use_bound",
    "is_clean",
    "generation",
    "watch_bindings",
]


class Binding:
    """One bound weight: how to find its mask, and what is known clean about it and its gradient."""

    __slots__ = (
        "buffers",
        "key",
        "fresh",
        "clean_mask",
        "weight_version",
        "mask_version",
        "grad_storage",
        "grad_version",
        "grad_mask",
        "grad_mask_version",
        "mask_bits",
        "bits_mask",
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
        # What the hook last returned: a weak reference to its storage (None: nothing known), its
        # version, the mask it used and that mask's version (see ``grad_clean``).
        self.grad_storage: weakref.ref[Any] | None = None
        self.grad_version = -1
        self.grad_mask: Tensor | None = None
        self.grad_mask_version = -1
        # sparsefx.bits' cache entry for ``bits_mask`` (the one owner of a mask's integer form; the
        # binding keeps the entry it last used, and the float dtype it used it for)
        self.mask_bits: MaskBits | None = None
        self.bits_mask: Tensor | None = None
        self.grad_dtype: torch.dtype | None = None
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
        bits = self.mask_bits
        # The common case first, in as few Python operations as possible: the cached bits match the
        # mask and the gradient's dtype (so it is a float of a width bits.py handles), and the
        # gradient is a plain strided tensor outside any graph.
        if (
            bits is None
            or self.bits_mask is not mask
            or bits.mask_version != mask._version
            or grad.dtype is not self.grad_dtype
            or grad.requires_grad
            or grad.layout is not torch.strided
            or grad.is_meta
        ):
            bits = self._bits_for(grad, mask)
            if bits is None:
                self.grad_storage = None
                return torch.where(mask, grad, 0.0)  # differentiable under create_graph=True
        if self.fresh:
            grad.view(bits.dtype).bitwise_and_(bits.tensor)
        else:
            grad = and_bits(grad, bits.tensor)
        self.grad_storage = weakref.ref(grad.untyped_storage())
        self.grad_version = grad._version
        self.grad_mask = mask
        self.grad_mask_version = mask._version
        return grad

    def _bits_for(self, grad: Tensor, mask: Tensor) -> MaskBits | None:
        """The integer form of ``mask`` for ``grad``, or None when ``grad`` needs ``where``."""
        bits_dtype = SAME_WIDTH_INT.get(grad.dtype)
        if grad.requires_grad or bits_dtype is None or grad.layout != torch.strided or grad.is_meta:
            return None
        self.mask_bits = cached_mask_bits(mask, bits_dtype)
        self.bits_mask, self.grad_dtype = mask, grad.dtype
        return self.mask_bits

    def grad_clean(self, grad: Tensor, mask: Tensor) -> bool:
        """Is ``grad`` (a ``.grad``) the gradient this hook last selected with ``mask``, unwritten since?

        The hook's result becomes ``.grad`` itself when autograd accumulates it into an empty
        ``.grad`` (the common case: it shares storage and version counter). Anything else, an
        accumulation into an existing ``.grad``, a later hook that returns another tensor or
        writes this one, an assignment to ``.grad``, shows as another storage or version.
        """
        storage = self.grad_storage
        return (
            storage is not None
            and storage() is grad.untyped_storage()
            and self.grad_version == grad._version
            and self.grad_mask is mask
            and self.grad_mask_version == mask._version
        )


# Told True when the first weight is bound, False when the last binding goes (``watch_bindings``).
_WATCHERS: list[Callable[[bool], None]] = []


def _last_binding_gone() -> None:
    for watcher in _WATCHERS:
        watcher(False)


_BOUND: IdentityMap[Binding] = IdentityMap(on_empty=_last_binding_gone)
_GENERATION = [0]  # moves on every (un)binding, so per-optimizer caches of bound weights refresh


def watch_bindings(watcher: Callable[[bool], None]) -> None:
    """Call ``watcher(True)`` whenever the first weight is bound, ``watcher(False)`` whenever the
    last binding goes (unbound, or its weight collected); at once with True if any weight is bound.

    ``sparsefx.step_trust`` installs its optimizer-step hooks this way, only while they can matter.
    """
    _WATCHERS.append(watcher)
    if len(_BOUND):
        watcher(True)


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
    first = not len(_BOUND)
    _BOUND[weight] = binding
    if first:
        for watcher in _WATCHERS:
            watcher(True)
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


register_fast_path(use_bound)
