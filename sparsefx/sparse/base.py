"""SparsityAlgorithm and DynamicSparsityAlgorithm: the one place the training invariants live.

An algorithm owns the ``<param>_mask`` buffers of the parameters it sparsifies and keeps three
invariants while a torch optimizer trains: pruned weights are exactly 0, pruned gradients are
selected to 0, and same-shape optimizer state is masked before every step. Dynamic algorithms
also change masks on the steps their update schedule names::

    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    >>> sparsity = sparsefx.sparse.Static(sparsity=0.75)
    >>> _ = model.apply(sparsity)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> sparsity.apply(opt)
    >>> {name: int(mask.sum()) for name, mask in sparsity.masks.items()}
    {'0.weight': 16, '2.weight': 8}

Binding is lazy under ``model.apply(sparsity)``: ``Module.apply`` visits children first, so only
the last call sees the root and the parameters' full names (which filters and per-parameter seeds
need). Masks are created at the first use: a forward, ``state_dict``, ``apply(optimizer)``, or any
method of the algorithm.
"""

from __future__ import annotations

import functools
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..bound import bind_weight, binding_of
from ..config import GroupConfig, ParamDecision, SparsityConfig, SparsityPlan
from ..config.registry import register_algorithm, resolve_group
from ..config.schedules import Schedule, UpdateSchedule
from ..errors import ConfigError
from ..masks import follows_mask, has_mask, is_mask_of, mask_name, owner_and_attr
from ..ops import prune_, select
from ..step_trust import note_state_masked, settle_step, state_tensors, trusted_states
from .drop_grow import drop_and_grow
from .make_masks import make_masks
from .relevel import relevel
from .select import resolve_plan

__all__ = ["SparsityAlgorithm", "DynamicSparsityAlgorithm", "SparseParam"]

Hook = Callable[[str, float, float, int], None]


@dataclass
class SparseParam:
    """One sparsified parameter: its name, the module owning it and its mask, and its settings."""

    name: str
    owner: nn.Module
    attr: str
    decision: ParamDecision

    @property
    def param(self) -> nn.Parameter:
        return self.owner._parameters[self.attr]

    def __post_init__(self) -> None:
        self._mask_key = mask_name(self.attr)

    @property
    def mask(self) -> Tensor:
        return self.owner._buffers[self._mask_key]

    @mask.setter
    def mask(self, value: Tensor) -> None:
        self.owner._buffers[self._mask_key].copy_(value)


class SparsityAlgorithm(ABC):
    """Base of every algorithm. Subclasses implement ``update()``.

    Keyword arguments are the cerebras.pytorch 2.x group keys (``sparsity``, ``init_method``,
    ``param_filter``, ``seed``, ``update``, ``drop_fraction``, ``balance_out_groups`` ...), parsed and
    validated by ``sparsefx.config``. A subclass is selectable in configs by its lower-cased name.
    """

    name: str = ""
    dynamic: bool = False
    needs_dense_grad: bool = False  # RigL: keep the full gradient of each sparse weight

    selectable: bool = True  # may a config name it (``algorithm: <name>``)?

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("selectable", True) and ABC not in cls.__bases__:
            register_algorithm(cls, cls.__dict__.get("name") or cls.__name__.lower())

    def __init__(self, group: GroupConfig | Any = None, /, **kwargs: Any) -> None:
        # a parsed group, or the group keys as keywords (a level may come first, Cerebras style)
        self.group = resolve_group(self, group, kwargs)
        self.autoupdate = True
        self.step = 0
        self.params: dict[str, SparseParam] = {}
        self._called: list[weakref.ref[nn.Module]] = []
        self._pending_hooks: list[Any] = []
        self._grad_hooks: list[Any] = []
        self._relevel_hooks: list[Any] = []
        self._target_hooks: list[Hook] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._graph_masked = False
        self._fresh_grads: frozenset[str] = frozenset()
        self._capturing = False  # plain (non-graph) hooks capture dense gradients for the next step

    # ------------------------------------------------------------------------------------ binding

    def __call__(self, module: nn.Module) -> None:
        """``model.apply(sparsity)`` calls this once per submodule, children first (binding is lazy)."""
        if self.params:
            return
        self._called.append(weakref.ref(module))
        self._pending_hooks.append(module.register_forward_pre_hook(lambda *_: self._bind_pending()))
        self._pending_hooks.append(
            module.register_state_dict_pre_hook(lambda *_a, **_k: self._bind_pending())
        )

    def apply(self, obj: nn.Module | torch.optim.Optimizer) -> None:
        """Sparsify a module (its whole tree, now) or an optimizer (state masking + update hook)."""
        if isinstance(obj, torch.optim.Optimizer):
            self._apply_optimizer(obj)
        elif isinstance(obj, nn.Module):
            self.bind(obj)
        else:
            raise TypeError(
                f"sparsity.apply expects an nn.Module or a torch.optim.Optimizer; got {type(obj)}"
            )

    def bind(self, model: nn.Module, plan: SparsityPlan | None = None, *, graph_masked: bool = False) -> None:
        """Own the masks of ``model``'s selected parameters, creating masks that do not exist yet.

        ``plan`` is the decision per parameter (default: this algorithm's own filter over ``model``);
        ``graph_masked`` says ``model`` is a compiled SparseModel whose masked ops read these weights;
        they are bound to them (``ops.bind_weight``), so the ops use the pruned weights in place.
        """
        plan = plan if plan is not None else resolve_plan(SparsityConfig((self.group,)), model)
        self._graph_masked = graph_masked
        fresh = getattr(model, "weights_with_fresh_grads", None)
        self._fresh_grads = fresh() if graph_masked and fresh is not None else frozenset()
        todo = {d.name: self.initial_decision(d) for d in plan.sparse.values() if not has_mask(model, d.name)}
        made = make_masks(model, todo)
        for decision in plan.sparse.values():
            self._bind_param(model, decision, made.get(decision.name))
        self._arm_dense_grads()
        self.prune_weights()
        self._relevel_hooks.append(model.register_load_state_dict_post_hook(self._relevel_loaded))

    def _relevel_loaded(self, model: nn.Module, incompatible: Any) -> None:
        """After ``load_state_dict``: masks saved at another level are brought to the config's."""
        relevel(self, model)

    def initial_plan(self, plan: SparsityPlan) -> SparsityPlan:
        """``plan`` with every sparse decision at its step-0 level (see ``initial_decision``)."""
        return SparsityPlan(tuple(self.initial_decision(d) if d.sparse else d for d in plan.decisions))

    def initial_decision(self, decision: ParamDecision) -> ParamDecision:
        """The decision at step 0: dense when a dynamic schedule does not update at step 0."""
        update = self.group.update
        if self.dynamic and update is not None and not update(0):
            return replace(decision, sparsity=0.0)
        return decision

    def _bind_param(self, model: nn.Module, decision: ParamDecision, mask: Tensor | None = None) -> None:
        """Own ``decision``'s parameter; ``mask`` (made by ``bind``) is registered when it has none yet."""
        owner_path, attr = owner_and_attr(decision.name)
        owner = model.get_submodule(owner_path)
        if mask is not None and mask_name(attr) not in owner._buffers:
            owner.register_buffer(mask_name(attr), mask, persistent=True)
        sp = SparseParam(decision.name, owner, attr, decision)
        self.params[decision.name] = sp
        if self._graph_masked:  # the graph's masked ops use the weight itself (see sparsefx.bound)
            fresh = sp.name in self._fresh_grads
            self._grad_hooks.append(bind_weight(sp.param, sp.owner._buffers, sp._mask_key, fresh=fresh))
        else:
            self._grad_hooks.append(sp.param.register_hook(lambda g, sp=sp: self._plain_grad_hook(g, sp)))

    def _plain_grad_hook(self, grad: Tensor, sp: SparseParam) -> Tensor:
        """The gradient hook of a weight no graph reads: capture the dense gradient when armed, select."""
        if self._capturing:  # only DynamicSparsityAlgorithm arms it, and defines _capture
            self._capture(sp.name, grad)  # type: ignore[attr-defined]
        return _select_grad(grad, sp)

    def _arm_dense_grads(self) -> None:
        """Capture dense gradients in the backward of the next step (``needs_dense_grad`` only)."""
        if self.needs_dense_grad:
            raise NotImplementedError(
                f"{type(self).__name__} sets needs_dense_grad but cannot capture gradients"
            )

    def _bind_pending(self) -> None:
        if not self._called:
            return
        modules = [m for m in (ref() for ref in self._called) if m is not None]
        children = {id(c) for m in modules for c in m.children()}
        self._called = []
        for hook in self._pending_hooks:
            hook.remove()
        self._pending_hooks = []
        for root in modules:
            if id(root) not in children:
                self.bind(root)

    # --------------------------------------------------------------------------------- invariants

    @property
    def masks(self) -> dict[str, Tensor]:
        """``{param name: bool mask}`` of every parameter this algorithm sparsifies."""
        self._bind_pending()
        return {name: sp.mask for name, sp in self.params.items()}

    def prune_weights(self) -> None:
        """Set every pruned weight to exactly 0 (NaN there too)."""
        self._bind_pending()
        for sp in self.params.values():
            if sp.param.device.type != "meta":
                prune_(sp.param.data, sp.mask)

    def mask_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        """Zero pruned positions of every state tensor shaped like its parameter (unless requires_dense).

        State that ``sparsefx.step_trust`` knows to be clean for the step in flight is left alone:
        masking it would change nothing.
        """
        trusted, state = trusted_states(optimizer), optimizer.state
        for sp in self.params.values():
            param = sp.param
            if id(param) in trusted or not state.get(param):
                continue
            tensors = state_tensors(optimizer, param)
            masked = [value for key, value in state[param].items() if follows_mask(key, value, param)]
            for value in masked:
                prune_(value, sp.mask)
            if len(masked) == len(tensors):  # a requires_dense tensor left as is may move pruned weights
                note_state_masked(optimizer, param)

    def _apply_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._bind_pending()
        self._track(optimizer)
        optimizer.register_step_pre_hook(lambda opt, *_: self.mask_optimizer_state(opt))
        optimizer.register_step_post_hook(lambda opt, *_: self._after_step(opt))

    def _track(self, optimizer: torch.optim.Optimizer) -> None:
        """Remember ``optimizer`` so regrown positions of its state can be reset."""
        self._optimizers.append(optimizer)

    def _after_step(self, optimizer: torch.optim.Optimizer) -> None:
        settle_step(optimizer)  # before the global post-hook would: weights the step kept clean need no pass
        for sp in self.params.values():
            param = sp.param
            if param.device.type == "meta":
                continue
            binding = binding_of(param)
            if binding is None:
                prune_(param.data, sp.mask)
            else:
                binding.ensure_clean(param, sp.mask)
        if self.autoupdate:
            self.update()

    # ------------------------------------------------------------------------------------- update

    def sparsity_at(self, sp: SparseParam, step: int) -> float:
        """The target level of ``sp`` at ``step``: the group's schedule, scaled when a layer
        distribution (ERK, ER) gave this parameter a level other than the group's."""
        base = float(self.group.sparsity(0))
        level = float(self.group.sparsity(step))
        if base > 0 and sp.decision.sparsity != base:
            return min(level * sp.decision.sparsity / base, 1.0 - 1e-9)
        return level

    @abstractmethod
    def update(self) -> None:
        """Advance one step; change masks when the schedule says so."""

    def _report(self) -> None:
        for hook in self._target_hooks:
            for name, sp in self.params.items():
                mask = sp.mask
                actual = 1.0 - int(mask.count_nonzero()) / max(1, mask.numel())
                hook(name, self.sparsity_at(sp, self.step), actual, self.step)

    def register_target_sparsity_hook(self, hook: Hook) -> None:
        """``hook(name, target, actual, step)`` after every update, e.g. for TensorBoard logging."""
        self._target_hooks.append(hook)

    # ---------------------------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit-identically (masks live in the model's state dict)."""
        return {"algorithm": type(self).__name__.lower(), "step": self.step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        algorithm = state.get("algorithm")
        if algorithm != type(self).__name__.lower():
            raise ConfigError(
                f"sparsity state is for algorithm {algorithm!r}, not {type(self).__name__.lower()!r}"
            )
        self.step = int(state["step"])

    def __iter__(self) -> Iterator[SparseParam]:
        return iter(self.params.values())

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(sparsity={self.group.sparsity!r}, params={len(self.params)}, step={self.step})"


class DynamicSparsityAlgorithm(SparsityAlgorithm):
    """Base of algorithms that recompute masks on update steps: implement ``update_mask``.

    ``update_mask(p, mask, sparsity) -> bool mask`` gets the parameter, its current mask and the
    target level at this step. Regrown means active in the new mask and not in the old one: there
    the weight and the same-shape optimizer state start at 0. A position dropped and regrown in the
    same update was never pruned, so it keeps its weight and optimizer state.
    """

    dynamic = True

    def __init__(self, group: GroupConfig | None = None, /, **kwargs: Any) -> None:
        super().__init__(group, **kwargs)
        if self.group.update is None:
            self.group = replace(self.group, update=UpdateSchedule(freq=1))
        self.generator = torch.Generator().manual_seed(self.group.seed)
        self.current: SparseParam | None = None  # the parameter update_mask is working on
        self._dense_grads: dict[str, Tensor] = {}

    @property
    def update_schedule(self) -> UpdateSchedule:
        assert self.group.update is not None
        return self.group.update

    @property
    def drop_fraction(self) -> Schedule | None:
        return self.group.drop_fraction

    @abstractmethod
    def update_mask(self, p: Tensor, mask: Tensor, sparsity: float) -> Tensor:
        """The new mask of ``p`` at the current step."""

    def drop_and_grow(self, p: Tensor, mask: Tensor, sparsity: float, grow_score: Tensor) -> Tensor:
        """``sparse.drop_grow.drop_and_grow`` at this step's drop fraction, inside the group's balance
        groups: what SET and RigL (and custom regrowth rules) call from ``update_mask``."""
        return drop_and_grow(
            p,
            mask,
            sparsity,
            self.drop_fraction(self.step),
            grow_score,
            balance_out_groups=self.group.balance_out_groups,
            balance_in_groups=self.group.balance_in_groups,
        )

    def update(self) -> None:
        self._bind_pending()
        self.step += 1
        if self.update_schedule(self.step):
            self._update_masks()
        self._arm_dense_grads()

    def _update_masks(self) -> None:
        self._sync_dense_grads()  # before the finiteness check: a NaN on one rank reaches every rank
        if not self._grads_finite():
            self._dense_grads.clear()
            return
        for name, sp in self.params.items():
            old = sp.mask.clone()
            self.current = sp
            with torch.no_grad():
                new = self.update_mask(sp.param.detach(), old, self.sparsity_at(sp, self.step))
            self._check_mask(name, new, sp)
            grown = new & ~old  # newly active only: a weight dropped and regrown here keeps its state
            sp.mask = new
            with torch.no_grad():
                sp.param.data.masked_fill_(grown, 0.0)
                for optimizer in self._optimizers:
                    for key, value in optimizer.state.get(sp.param, {}).items():
                        if follows_mask(key, value, sp.param):
                            value.masked_fill_(grown, 0.0)
        self.prune_weights()
        self._dense_grads.clear()
        self._report()

    def _check_mask(self, name: str, new: Any, sp: SparseParam) -> None:
        if not is_mask_of(new, sp.mask):
            got = f"{type(new).__name__} {getattr(new, 'shape', '')} {getattr(new, 'dtype', '')}"
            raise ConfigError(
                f"{type(self).__name__}.update_mask for {name!r} returned {got}; expected a bool mask"
            )

    def _grads_finite(self) -> bool:
        for sp in self.params.values():
            grad = self._dense_grads.get(sp.name, sp.param.grad)
            if grad is not None and not bool(torch.isfinite(grad).all()):
                return False
        return True

    def _sync_dense_grads(self) -> None:
        """Average captured dense gradients over ranks, so every rank computes the same masks.

        Every rank reduces every parameter, in the parameters' fixed order (a parameter this rank did
        not use contributes zeros), so the collectives match whatever order backward ran in.
        """
        if not self.needs_dense_grad or not (dist.is_available() and dist.is_initialized()):
            return
        world = dist.get_world_size()
        for name, sp in self.params.items():
            grad = self._dense_grads.setdefault(name, torch.zeros_like(sp.param))
            dist.all_reduce(grad)
            grad.div_(world)

    # ---------------------------------------------------------------------- dense gradients (RigL)

    def _arm_dense_grads(self) -> None:
        """Capture dense gradients only in the backward passes of a step that will update masks.

        The capture rides on the weight's one gradient hook, before its select, so the 99 of 100
        steps between RigL updates pay nothing for it. Re-armed after every ``update()``, bind and
        ``load_state_dict``.
        """
        if not self.needs_dense_grad:
            return
        armed = bool(self.update_schedule(self.step + 1))
        self._capturing = armed
        if not self._graph_masked:
            return
        for sp in self.params.values():
            binding = binding_of(sp.param)
            if binding is not None:
                binding.capture = functools.partial(self._capture, sp.name) if armed else None

    def _capture(self, name: str, grad: Tensor) -> None:
        """Keep ``name``'s full gradient (before masking), summed over micro-batches."""
        held = self._dense_grads.get(name)
        self._dense_grads[name] = grad.detach().clone() if held is None else held.add_(grad.detach())

    def dense_grad(self, name: str) -> Tensor | None:
        """The dense gradient captured since the last step, if any."""
        return self._dense_grads.get(name)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if "generator" in state:
            self.generator.set_state(state["generator"])
        self._arm_dense_grads()


def _select_grad(grad: Tensor, sp: SparseParam) -> Tensor:
    if grad.requires_grad:  # create_graph=True: stay differentiable
        return torch.where(sp.mask, grad, 0.0)
    return select(grad, sp.mask)
