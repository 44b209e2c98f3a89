"""Bound weights: a compiled model's sparse weights, and when each is known to be zero where pruned.

A masked op in a compiled graph must compute with ``where(mask, weight, 0)``. For a weight bound
here (``bind_weight``; ``SparsityAlgorithm`` binds the weights of the model it was compiled with),
``apply_mask`` instead zeroes the weight's pruned positions in place, once, and then uses the
weight itself. Whether that zeroing is needed is decided from version counters, which every
in-place write moves: a weight is *clean* while its version, its mask's identity and its mask's
version are those recorded the last time it was zeroed.

A training step moves the weight's version, so without more the next forward would zero it
again. But a step of an optimizer that updates each entry from that entry's own weight, gradient
and state alone (``SGD``, ``Adam``, ``AdamW``, ``RMSprop``) keeps a zero weight at zero when the
entry's gradient and state are zero too. So global optimizer-step hooks check, before each step of
such an optimizer, that every bound weight it updates is clean, that its gradient is known clean
(produced by the selecting gradient hook and not written since, or selected again here) and that
its state is known clean (created by a step like this one, and not written since); after the step
they record the weight as clean at its new version. Anything unknown leaves the weight as it was:
the next forward zeroes it, one pass, which is always correct.

    >>> w, m = torch.nn.Parameter(torch.ones(4)), torch.tensor([True, False, True, False])
    >>> bind_weight(w, lambda: m)
    >>> use_bound(w, m), w.data
    (True, tensor([1., 0., 1., 0.]))
    >>> is_clean(w, m)
    True

Writes through ``weight.data`` do not move the version counter: after one that stores nonzero
values at pruned positions, call ``sparsity.prune_weights()`` (or ``prune_(weight.data, mask)``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .identity_map import IdentityMap

__all__ = [
    "bind_weight",
    "use_bound",
    "is_clean",
    "note_selected_grad",
    "note_grad_accumulated",
    "note_state_masked",
    "state_tensors",
    "ELEMENTWISE_OPTIMIZERS",
]

# Optimizers whose update of an entry reads only that entry's weight, gradient and state, and
# leaves a zero weight at zero when its gradient and state are zero (exact types: a subclass may
# change the rule).
ELEMENTWISE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.RMSprop,
)


class _Binding:
    """One bound weight: how to find its mask, and what is known clean about it."""

    __slots__ = (
        "mask",
        "clean_mask",
        "clean_versions",
        "grad_ref",
        "grad_version",
        "grad_base_clean",
        "select_hook",
    )

    def __init__(self, mask: Callable[[], Tensor], select_hook: int | None) -> None:
        self.mask = mask
        self.clean_mask: Tensor | None = None
        self.clean_versions = (-1, -1)
        self.grad_ref: weakref.ref[Tensor] | None = None  # the .grad last known clean, and its version
        self.grad_version = -1
        self.grad_base_clean = False
        self.select_hook = select_hook  # id of the tensor hook that selects this weight's gradients

    def is_clean(self, weight: Tensor, mask: Tensor) -> bool:
        return self.clean_mask is mask and self.clean_versions == (weight._version, mask._version)

    def set_clean(self, weight: Tensor, mask: Tensor) -> None:
        self.clean_mask, self.clean_versions = mask, (weight._version, mask._version)

    def ensure_clean(self, weight: Tensor, mask: Tensor) -> None:
        """Zero ``weight``'s pruned positions in place unless it is known clean already.

        Through ``.data``: values the mask keeps do not change, and a version bump would
        invalidate tensors that graphs built earlier saved for their backward.
        """
        if not self.is_clean(weight, mask):
            _prune(weight.data, mask)
            self.set_clean(weight, mask)

    def grad_clean(self, grad: Tensor | None) -> bool:
        ref = self.grad_ref
        return grad is not None and ref is not None and ref() is grad and grad._version == self.grad_version


_BOUND: IdentityMap[_Binding] = IdentityMap()
_GENERATION = [0]  # moves on every (un)binding, so per-optimizer caches of bound weights refresh


def bind_weight(weight: Tensor, mask: Callable[[], Tensor] | None, select_hook: int | None = None) -> None:
    """Let ``apply_mask`` zero ``weight`` in place and use it directly (``None`` unbinds).

    ``mask()`` returns the weight's current mask. The caller promises that every gradient of
    ``weight`` is selected by a tensor hook of its own, ``select_hook`` (the id of its handle),
    which calls ``note_selected_grad``, and that a post-accumulate hook calls
    ``note_grad_accumulated`` (``SparsityAlgorithm`` registers both): the masked ops then add no
    autograd node.
    """
    if mask is None:
        _BOUND.pop(weight, None)
    else:
        _BOUND[weight] = _Binding(mask, select_hook)
        _install_step_hooks()
    _GENERATION[0] += 1


def use_bound(weight: Tensor, mask: Tensor) -> bool:
    """If ``weight`` is bound and ``mask`` is its mask, make it clean and say True (``apply_mask``)."""
    binding = _BOUND.get(weight)
    if binding is None or binding.mask() is not mask:
        return False
    binding.ensure_clean(weight, mask)
    return True


def is_clean(weight: Tensor, mask: Tensor) -> bool:
    """Is ``weight`` bound and known to be zero where ``mask`` is False?"""
    binding = _BOUND.get(weight)
    return binding is not None and binding.is_clean(weight, mask)


def note_selected_grad(weight: Tensor) -> None:
    """Called by the selecting gradient hook of ``weight``, before accumulation into ``.grad``.

    What it hands on is the final gradient only while it is the last hook registered on
    ``weight``: a hook added later could change the gradient, which then stays unknown (the next
    optimizer step selects it again).
    """
    binding = _BOUND.get(weight)
    if binding is not None:
        hooks = weight._backward_hooks
        last = next(reversed(hooks)) if hooks else None
        grad = weight.grad
        binding.grad_base_clean = last == binding.select_hook and (grad is None or binding.grad_clean(grad))


def note_grad_accumulated(weight: Tensor) -> None:
    """Called after accumulation: ``.grad`` is clean when it was None or clean before, and the
    selecting hook had the last word on what was added."""
    binding = _BOUND.get(weight)
    if binding is None:
        return
    grad = weight.grad
    if binding.grad_base_clean and grad is not None and not grad.requires_grad:
        binding.grad_ref, binding.grad_version = weakref.ref(grad), grad._version
    else:
        binding.grad_ref = None
    binding.grad_base_clean = False


# ------------------------------------------------------------------------ optimizer state

# optimizer -> {id(weight): (mask, mask version, ((weakref to state tensor, version), ...))}
_STATES: weakref.WeakKeyDictionary[torch.optim.Optimizer, dict[int, Any]] = weakref.WeakKeyDictionary()
# optimizer -> for the step in flight: (weight, binding, mask, state known clean) of every bound
# weight it updates, made clean with a clean gradient before the step
_PENDING: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[tuple[Tensor, _Binding, Tensor, bool]]] = (
    weakref.WeakKeyDictionary()
)
# optimizer -> (generation, parameter count, bound weights it updates with their bindings)
_MEMBERS: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[int, int, list[tuple[Tensor, _Binding]]]] = (
    weakref.WeakKeyDictionary()
)
_MASKED_NOW: weakref.WeakKeyDictionary[torch.optim.Optimizer, set[int]] = weakref.WeakKeyDictionary()


def note_state_masked(optimizer: torch.optim.Optimizer, weight: Tensor) -> None:
    """Say that ``weight``'s state in ``optimizer`` was just zeroed at its pruned positions."""
    _MASKED_NOW.setdefault(optimizer, set()).add(id(weight))


def state_tensors(optimizer: torch.optim.Optimizer, weight: Tensor) -> list[Tensor]:
    """The tensors of ``weight``'s state in ``optimizer`` shaped like it (``exp_avg``, momentum ...)."""
    state = optimizer.state.get(weight)
    if not state:
        return []
    shape = weight.shape
    return [v for v in state.values() if isinstance(v, Tensor) and v.dim() and v.shape == shape]


def _state_record(optimizer: torch.optim.Optimizer, weight: Tensor, mask: Tensor) -> Any:
    tensors = state_tensors(optimizer, weight)
    return mask, mask._version, tuple((weakref.ref(t), t._version) for t in tensors)


def _state_clean(
    optimizer: torch.optim.Optimizer, weight: Tensor, mask: Tensor, records: dict[int, Any]
) -> bool:
    if not optimizer.state.get(weight):
        return True  # created by this step, from a clean gradient
    record = records.get(id(weight))
    if record is None or record[0] is not mask or record[1] != mask._version:
        return False
    tensors = state_tensors(optimizer, weight)
    return len(tensors) == len(record[2]) and all(
        ref() is t and t._version == v for t, (ref, v) in zip(tensors, record[2])
    )


def _members(optimizer: torch.optim.Optimizer) -> list[tuple[Tensor, _Binding]]:
    """The bound weights ``optimizer`` updates, with their bindings (cached until either changes)."""
    count = sum(len(g["params"]) for g in optimizer.param_groups)
    cached = _MEMBERS.get(optimizer)
    if cached is not None and cached[0] == _GENERATION[0] and cached[1] == count:
        return cached[2]
    members = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            binding = _BOUND.get(p)
            if binding is not None:
                members.append((p, binding))
    _MEMBERS[optimizer] = (_GENERATION[0], count, members)
    return members


def _before_step(optimizer: torch.optim.Optimizer, *_: Any) -> None:
    """Make every bound weight the step will update clean, and its gradient; note whose state is
    known clean."""
    if type(optimizer) not in ELEMENTWISE_OPTIMIZERS:
        return
    _MASKED_NOW.pop(optimizer, None)
    records = _STATES.get(optimizer, {})
    pending = []
    for weight, binding in _members(optimizer):
        grad = weight.grad
        if grad is None:
            continue  # the step leaves this weight alone
        mask = binding.mask()
        binding.ensure_clean(weight, mask)
        if not binding.grad_clean(grad):
            if grad.requires_grad or grad.layout != torch.strided:
                continue
            _prune(grad, mask)
        pending.append((weight, binding, mask, _state_clean(optimizer, weight, mask, records)))
    _PENDING[optimizer] = pending


def _after_step(optimizer: torch.optim.Optimizer, *_: Any) -> None:
    """Record the weights the step kept clean (same mask, clean state), and their new state."""
    pending = _PENDING.pop(optimizer, None)
    masked = _MASKED_NOW.pop(optimizer, None) or ()
    if not pending:
        return
    records = _STATES.setdefault(optimizer, {})
    for weight, binding, mask, state_clean in pending:
        same_mask = (
            binding.mask() is mask
            and binding.clean_mask is mask
            and binding.clean_versions[1] == mask._version
        )
        if same_mask and (state_clean or id(weight) in masked):
            binding.set_clean(weight, mask)
            records[id(weight)] = _state_record(optimizer, weight, mask)
        else:
            records.pop(id(weight), None)


_HOOKS: list[Any] = []


def _install_step_hooks() -> None:
    if not _HOOKS:
        _HOOKS.append(register_optimizer_step_pre_hook(_before_step))
        _HOOKS.append(register_optimizer_step_post_hook(_after_step))


def _prune(t: Tensor, mask: Tensor) -> None:
    from .ops import prune_  # ops imports this module; prune_ runs under no_grad

    prune_(t, mask)
