"""One captured module, one graph per call structure: captured again, lazily, for a new kind of call.

A graph is valid for the calls like the one it was captured from: fx bakes unsupplied defaults
and the functional ``training`` flags in; ``torch.export`` also bakes in non-tensor arguments,
dtypes and, when it cannot keep a dim dynamic, the shapes. ``CapturedModule`` keys each call by
the module's mode and the structure of its arguments (``call_key``), runs the graph captured for
that key, and captures a new one the first time a key is seen, as ``torch.compile``'s guards do.
Every graph reads the same parameters, buffers and masks (see ``sparsefx.shell.rehome``), so
the masks, the weights and the optimizer state stay shared::

    >>> call_key(True, (torch.ones(2, 3),), {"mask": None})
    (True, ((torch.float32, 2),), (('mask', None),))
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx, nn

from .shell import move_extras

__all__ = ["CapturedModule", "Variant", "call_key", "shapes_of", "captured_modules", "describe_call"]

logger = logging.getLogger("sparsefx")

Key = tuple[Any, ...]


@dataclass(frozen=True)
class Variant:
    """A graph for one key: how it was captured, and whether it only holds for the shapes it saw."""

    graph_module: fx.GraphModule
    method: str
    static_shapes: bool = False


Build = Callable[[nn.Module, tuple, dict, str], Variant]
"""``build(tree, args, kwargs, prefer)``: capture ``tree`` for this call and run the passes."""


def call_key(training: bool, args: tuple, kwargs: dict) -> Key:
    """The mode and the structure of a call: what a captured graph may have baked in."""
    return (
        training,
        tuple(_leaf(a) for a in args),
        tuple((k, _leaf(kwargs[k])) for k in sorted(kwargs)),
    )


def shapes_of(args: tuple, kwargs: dict) -> tuple:
    """Every tensor's shape, in ``pytree`` order: the extra key of a graph with static shapes."""
    return tuple(tuple(t.shape) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))


def _leaf(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.dim())
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, enum.Enum)):
        return value if value is None or isinstance(value, str) else (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_leaf(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, _leaf(value[k])) for k in sorted(value, key=repr)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value),
            tuple((f.name, _leaf(getattr(value, f.name))) for f in dataclasses.fields(value)),
        )
    return ("object", type(value))


class CapturedModule(nn.Module):
    """Runs ``tree``'s forward through the graph captured for each kind of call.

    It shares ``tree``'s parameter, buffer and child dicts, so ``state_dict``, ``.to()`` and
    ``.train()`` see exactly ``tree``'s tensors and modules. ``first`` is the graph captured at
    compile time, under ``key`` (or, when ``key`` is None, for the first call that matches
    ``accepts``).
    """

    def __init__(
        self,
        tree: nn.Module,
        first: Variant,
        key: Key | None,
        build: Build,
        *,
        path: str = "",
        shapes: tuple | None = None,
    ) -> None:
        super().__init__()
        self._parameters = tree._parameters
        self._buffers = tree._buffers
        self._non_persistent_buffers_set = tree._non_persistent_buffers_set
        self._modules = tree._modules
        self.training = tree.training
        object.__setattr__(self, "tree", tree)
        object.__setattr__(self, "first", first)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "_build", build)
        object.__setattr__(self, "_pending", first if key is None else None)
        object.__setattr__(self, "_variants", {})
        object.__setattr__(self, "_shaped", {})
        object.__setattr__(self, "listeners", [])
        if key is not None:
            self._store(key, first, shapes)

    @property
    def variants(self) -> list[Variant]:
        """Every graph captured so far, the compile-time one first."""
        seen = [self.first]
        for v in [*self._variants.values(), *(v for d in self._shaped.values() for v in d.values())]:
            if all(v is not s for s in seen):
                seen.append(v)
        return seen

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        key = call_key(self.training, args, kwargs)
        variant = self._variants.get(key)
        if variant is None or key in self._shaped:  # a graph for exactly these shapes comes first
            variant = self._lookup_shaped(key, args, kwargs) or variant
        if variant is None:
            variant = self._capture(key, args, kwargs, reason="a new kind of call")
        if variant.method != "export" or variant.static_shapes:
            return variant.graph_module(*args, **kwargs)
        try:
            return variant.graph_module(*args, **kwargs)
        except (AssertionError, RuntimeError) as exc:
            if not _is_guard_failure(exc):
                raise
        variant = self._capture(key, args, kwargs, reason="shapes its graph cannot take", static=True)
        return variant.graph_module(*args, **kwargs)

    def graph_for(self, args: tuple, kwargs: dict) -> Variant:
        """The graph a call with these inputs runs in the current mode, captured now if there is none.

        Call the module once with the same inputs first when its graph was exported with dynamic
        shapes: a shape its guards reject is only found, and recaptured, by a call.
        """
        key = call_key(self.training, args, kwargs)
        variant = self._variants.get(key)
        if variant is None or key in self._shaped:
            variant = self._lookup_shaped(key, args, kwargs) or variant
        if variant is None:
            variant = self._capture(key, args, kwargs, reason="a new kind of call")
        return variant

    def _lookup_shaped(self, key: Key, args: tuple, kwargs: dict) -> Variant | None:
        by_shape = self._shaped.get(key)
        if by_shape is not None:
            return by_shape.get(shapes_of(args, kwargs))
        pending = self._pending
        if pending is not None and key[0] == pending.graph_module.training and _plain_tensor_call(key):
            object.__setattr__(self, "_pending", None)
            self._store(key, pending, None)
            return pending
        return None

    def _capture(self, key: Key, args: tuple, kwargs: dict, *, reason: str, static: bool = False) -> Variant:
        where = f"{self.path!r}" if self.path else "the model"
        mode = "train" if self.training else "eval"
        self.tree.training = self.training  # the mode the forward reads while it is captured
        variant = self._build(self.tree, args, kwargs, self.first.method)
        shapes = shapes_of(args, kwargs) if (static or variant.static_shapes) else None
        if static and not variant.static_shapes:
            variant = dataclasses.replace(variant, static_shapes=True)
        self._store(key, variant, shapes)
        logger.info(
            "captured %s again (%s) for %s in %s mode: %s",
            where,
            variant.method,
            reason,
            mode,
            describe_call(args, kwargs),
        )
        for listener in self.listeners:
            listener(self, variant)
        return variant

    def _store(self, key: Key, variant: Variant, shapes: tuple | None) -> None:
        if variant.static_shapes or shapes is not None:
            self._shaped.setdefault(key, {})[shapes] = variant
        else:
            self._variants[key] = variant

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> CapturedModule:
        super()._apply(fn, recurse)
        for variant in self.variants:
            move_extras(variant.graph_module, fn)
        return self


def _plain_tensor_call(key: Key) -> bool:
    """A call with positional tensors only: what a graph captured without example inputs takes."""
    _, args, kwargs = key
    return not kwargs and all(isinstance(a, tuple) and isinstance(a[0], torch.dtype) for a in args)


def _is_guard_failure(exc: BaseException) -> bool:
    text = str(exc)
    return "Guard failed" in text or text.startswith("Expected input at")


def describe_call(args: tuple, kwargs: dict) -> str:
    """A call's arguments in one line: ``(float32[2, 8], mask=None)``."""
    def one(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
        return type(v).__name__ if not isinstance(v, (bool, int, float, str)) and v is not None else repr(v)

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return f"({', '.join(parts)})"


def captured_modules(root: nn.Module) -> dict[str, CapturedModule]:
    """``{path: CapturedModule}`` under ``root`` (the root itself under "")."""
    return {
        path: m for path, m in root.named_modules(remove_duplicate=False) if isinstance(m, CapturedModule)
    }
