"""Step trust: which optimizer steps keep bound weights zero where pruned.

A training step moves each weight's version counter, so without more every forward after a
step would zero the bound weights again (``sparsefx.bound``). But a step of an optimizer whose
update of an entry reads only that entry's weight, gradient and state (``SGD``, ``Adam``,
``AdamW``, ``RMSprop``) keeps a zero weight at zero when the entry's gradient and state are zero
too. So global optimizer-step hooks check, before each step of such an optimizer, that every
bound weight it updates is clean, that its gradient is the one the selecting hook produced and
nothing wrote since (or select it again), and that its state is known clean (created by a step
like this one, or masked by ``sparsity.apply(optimizer)``, and not written since). After the
step (``settle_step``) they record the weight clean at its new version. Anything unknown leaves
the weight as it was: the next forward zeroes it, one pass, which is always correct.

    >>> w, m = torch.nn.Parameter(torch.ones(4)), torch.tensor([True, False, True, False])
    >>> _ = sparsefx.bound.bind_weight(w, {"w_mask": m}, "w_mask")
    >>> opt = torch.optim.AdamW([w], lr=0.1)
    >>> sparsefx.ops.apply_mask(w, m).sum().backward(); opt.step()
    >>> sparsefx.bound.is_clean(w, m), w.data[1].item()
    (True, 0.0)

A sparsity algorithm applied to the optimizer asks ``trusted_states`` and ``settle_step`` so that
it masks state and re-prunes weights only where the chain of trust is broken.

The hooks are installed while any weight is bound (``sparsefx.bound.watch_bindings``) and removed
when the last binding goes (``step_hooks_installed``).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .bits import prune_
from .bound import Binding, binding_of, generation, watch_bindings

__all__ = [
    "ELEMENTWISE_OPTIMIZERS",
    "install_step_hooks",
    "remove_step_hooks",
    "step_hooks_installed",
    "note_state_masked",
    "settle_step",
    "state_tensors",
    "trusted_states",
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


class _Member:
    """A bound weight an optimizer updates, and the step in flight's view of it (reused every step)."""

    __slots__ = ("weight", "binding", "key", "mask", "state_clean")

    def __init__(self, weight: Tensor, binding: Binding) -> None:
        self.weight, self.binding, self.key = weight, binding, id(weight)
        self.mask: Tensor | None = None  # the mask the step in flight was checked against
        self.state_clean = False  # the weight's state was known clean before that step


class _StateRecord:
    """A weight's optimizer state as last recorded clean (updated in place after each clean step)."""

    __slots__ = ("mask", "mask_version", "size", "tensors")

    def __init__(self) -> None:
        self.mask: Tensor | None = None  # the mask, and its version, the state was clean for
        self.mask_version = -1
        self.size = -1  # the number of state entries
        self.tensors: tuple[tuple[str, Any, int], ...] = ()  # (key, weak reference, version) per tensor


class _Tracker:
    """What the step hooks know about one optimizer."""

    __slots__ = ("generation", "count", "members", "records", "pending", "masked")

    def __init__(self) -> None:
        self.generation = -1
        self.count = -1
        self.members: list[_Member] = []
        self.records: dict[int, _StateRecord] = {}  # id(weight) -> state known clean after a step
        self.pending: list[_Member] | None = None  # the step in flight
        self.masked: set[int] = set()  # weights whose state the algorithm masked for this step

    def refresh_members(self, optimizer: torch.optim.Optimizer) -> list[_Member]:
        """The bound weights ``optimizer`` updates, with their bindings (cached until either changes)."""
        count = sum(len(g["params"]) for g in optimizer.param_groups)
        if self.generation != generation() or self.count != count:
            self.members = [
                _Member(p, b)
                for g in optimizer.param_groups
                for p in g["params"]
                if (b := binding_of(p)) is not None
            ]
            self.generation, self.count = generation(), count
        return self.members


_TRACKERS: weakref.WeakKeyDictionary[torch.optim.Optimizer, _Tracker] = weakref.WeakKeyDictionary()


def state_tensors(optimizer: torch.optim.Optimizer, weight: Tensor) -> list[Tensor]:
    """The tensors of ``weight``'s state in ``optimizer`` shaped like it (``exp_avg``, momentum ...)."""
    state = optimizer.state.get(weight)
    if not state:
        return []
    shape = weight.shape
    return [v for v in state.values() if isinstance(v, Tensor) and v.dim() and v.shape == shape]


def note_state_masked(optimizer: torch.optim.Optimizer, weight: Tensor) -> None:
    """Say that ``weight``'s state in ``optimizer`` was just zeroed at its pruned positions."""
    tracker = _TRACKERS.get(optimizer)
    if tracker is not None:
        tracker.masked.add(id(weight))


def trusted_states(optimizer: torch.optim.Optimizer) -> set[int]:
    """``id``s of the weights whose state in ``optimizer`` is known clean for the step in flight.

    Masking that state again would change nothing. Valid between the step's pre-hooks and the step.
    """
    tracker = _TRACKERS.get(optimizer)
    pending = tracker.pending if tracker is not None else None
    return {member.key for member in pending if member.state_clean} if pending else set()


def _state_clean(state: dict[str, Any] | None, mask: Tensor, record: _StateRecord | None) -> bool:
    if not state:
        return True  # created by this step, from a clean gradient
    if (
        record is None
        or record.mask is not mask
        or record.mask_version != mask._version
        or record.size != len(state)
    ):
        return False
    for key, ref, version in record.tensors:
        value = state.get(key)
        if value is None or ref() is not value or value._version != version:
            return False
    return True


def _state_record(state: dict[str, Any] | None, mask: Tensor, record: _StateRecord | None) -> _StateRecord:
    """``record`` (or a new one) updated to ``weight``'s state after a clean step; reuses its
    references when it can."""
    if record is None:
        record = _StateRecord()
    refs = {key: ref for key, ref, _ in record.tensors}
    entries = []
    state = state or {}
    for key, value in state.items():
        if not isinstance(value, Tensor) or not value.dim():
            continue
        ref = refs.get(key)
        if ref is None or ref() is not value:
            ref = weakref.ref(value)
        entries.append((key, ref, value._version))
    record.mask, record.mask_version = mask, mask._version
    record.size, record.tensors = len(state), tuple(entries)
    return record


def _before_step(optimizer: torch.optim.Optimizer, *_: Any) -> None:
    """Make every bound weight the step will update clean, and its gradient; note whose state is
    known clean."""
    global _IN_STEP
    _IN_STEP = True
    if type(optimizer) not in ELEMENTWISE_OPTIMIZERS:
        return
    tracker = _TRACKERS.get(optimizer)
    if tracker is None:
        tracker = _TRACKERS[optimizer] = _Tracker()
    tracker.masked.clear()
    records, state = tracker.records, optimizer.state
    pending: list[_Member] = []
    for member in tracker.refresh_members(optimizer):
        weight = member.weight
        grad = weight.grad
        if grad is None:
            continue  # the step leaves this weight alone
        binding = member.binding
        mask = binding.buffers[binding.key]
        binding.ensure_clean(weight, mask)
        if not binding.grad_clean(grad, mask):
            if grad.requires_grad or grad.layout != torch.strided:
                continue
            prune_(grad, mask)
        member.mask = mask
        member.state_clean = _state_clean(state.get(weight), mask, records.get(member.key))
        pending.append(member)
    tracker.pending = pending


def settle_step(optimizer: torch.optim.Optimizer) -> None:
    """After a step: record the weights it kept clean (same mask, clean state), and their state.

    Idempotent within a step: the global post-hook calls it, and so may an algorithm's own
    post-hook that runs first.
    """
    tracker = _TRACKERS.get(optimizer)
    if tracker is None or tracker.pending is None:
        return
    pending, tracker.pending = tracker.pending, None
    masked, records, state = tracker.masked, tracker.records, optimizer.state
    for member in pending:
        binding, mask, key = member.binding, member.mask, member.key
        same_mask = (
            binding.mask() is mask and binding.clean_mask is mask and binding.mask_version == mask._version
        )
        if same_mask and (member.state_clean or key in masked):
            weight = member.weight
            binding.set_clean(weight, mask)
            records[key] = _state_record(state.get(weight), mask, records.get(key))
        else:
            records.pop(key, None)
    masked.clear()


def _after_step(optimizer: torch.optim.Optimizer, *_: Any) -> None:
    global _IN_STEP
    settle_step(optimizer)
    _IN_STEP = False


_HOOKS: list[Any] = []  # the handles of the global hooks while they are installed
# Between the global pre-hook and the global post-hook of a step: torch is iterating its dicts of
# global hooks, which removing ours would break (the last bound weight can be collected by a
# garbage collection inside any hook).
_IN_STEP = False


def install_step_hooks() -> None:
    """Register the global optimizer-step hooks, unless they are installed already."""
    if not _HOOKS:
        _HOOKS.append(register_optimizer_step_pre_hook(_before_step))
        _HOOKS.append(register_optimizer_step_post_hook(_after_step))


def remove_step_hooks() -> None:
    """Remove the global optimizer-step hooks (done when the last binding goes)."""
    while _HOOKS:
        _HOOKS.pop().remove()


def step_hooks_installed() -> bool:
    """Are the global optimizer-step hooks installed? They are while any weight is bound: from
    the first ``bind_weight`` until the last bound weight is unbound or collected."""
    return bool(_HOOKS)


def _bindings_changed(any_bound: bool) -> None:
    if any_bound:
        install_step_hooks()
    elif not _IN_STEP:
        remove_step_hooks()
    # else the last binding went during a step: the hooks stay, doing nothing as no weight is
    # bound, until a binding goes again outside a step


watch_bindings(_bindings_changed)
