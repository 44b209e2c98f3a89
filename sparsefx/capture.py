"""nn.Module -> graph. The only module that knows torch.fx and torch.export quirks.

``capture`` tries, in order:

1. ``torch.fx.symbolic_trace``: fast, keeps ``nn.Linear``/``nn.Conv*`` as module calls.
   Parameters with a default that the example inputs do not supply are traced as constants, so
   ``if mask is not None:`` takes the branch the caller will really take.
2. ``torch.export`` (non-strict, dynamic dims where the model allows): handles shape-dependent
   control flow, item assignment, keyword arguments and dataclass outputs. Needs example inputs.
3. Partial capture: when the root's own forward cannot be captured (value-dependent Python control
   flow), the root keeps running eagerly and each child with parameters is captured on its own,
   recursively, with the inputs it received in one eager run.

Parameter and buffer names always stay the original fully qualified names::

    >>> cap = capture(torch.nn.Sequential(torch.nn.Linear(4, 2)))
    >>> cap.method, [n for n, _ in cap.root.named_parameters()]
    ('fx', ['0.weight', '0.bias'])
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import logging
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx, nn

from .dispatch import describe_call
from .errors import CaptureError
from .record_inputs import Inputs, record_inputs

__all__ = ["is_guard_check", "Captured", "capture", "capture_graph", "CAPTURE_METHODS"]

CAPTURE_METHODS = ("auto", "fx", "export")


@dataclass
class Captured:
    """What ``capture`` produced.

    ``root`` is the module to run: a GraphModule for ``fx``/``export``, or a shallow copy of the
    model whose captured children are GraphModules for ``partial``. ``graphs`` maps each captured
    module's path ("" for the root) to its GraphModule; ``inputs`` holds the example inputs each
    graph saw, when known. ``log`` says why each method was or was not used.
    """

    root: nn.Module
    method: str
    graphs: dict[str, fx.GraphModule]
    inputs: dict[str, Inputs] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    static: set[str] = field(default_factory=set)
    methods: dict[str, str] = field(default_factory=dict)


def capture(
    model: nn.Module,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    method: str = "auto",
) -> Captured:
    """Capture ``model`` into graphs, keeping parameter names. See the module docstring."""
    if method not in CAPTURE_METHODS:
        raise CaptureError(f"capture method {method!r} is not one of {', '.join(CAPTURE_METHODS)}")
    kwargs = dict(kwargs or {})
    has_inputs = bool(args or kwargs)
    log: list[str] = []
    if method in ("auto", "fx"):
        gm, why = _try_fx(model, args, kwargs)
        if gm is not None:
            return Captured(gm, "fx", {"": gm}, {"": (args, kwargs)} if has_inputs else {}, log)
        log.append(f"fx: {why}")
        if method == "fx":
            raise CaptureError(f"torch.fx.symbolic_trace failed on {type(model).__name__}: {why}")
    if not has_inputs:
        raise CaptureError(
            f"torch.fx.symbolic_trace failed on {type(model).__name__} ({why}); the torch.export "
            "fallback needs example inputs: pass example_inputs=(x,) (and example_kwargs=...)"
        )
    gm, why, static = _try_export(model, args, kwargs)
    if gm is not None:
        return Captured(gm, "export", {"": gm}, {"": (args, kwargs)}, log, {""} if static else set())
    log.append(f"export: {why}")
    if method == "export":
        raise CaptureError(f"torch.export failed on {type(model).__name__}: {why}")
    return _capture_partial(model, args, kwargs, log)


# --------------------------------------------------------------------------------------------- fx


def _try_fx(model: nn.Module, args: tuple, kwargs: dict) -> tuple[fx.GraphModule | None, str]:
    concrete = _concrete_args(model, args, kwargs)
    with _tracer_attributes_removed(model):
        try:
            with _state_unchanged(model):
                graph = _BufferTracer().trace(model, concrete_args=concrete or None)
        except Exception as exc:  # fx raises TraceError, TypeError, NotImplementedError, AttributeError ...
            return None, _one_line(exc)
        _restore_argument_names(graph, model)
        return fx.GraphModule(model, graph, model.__class__.__name__), ""


@contextlib.contextmanager
def _tracer_attributes_removed(model: nn.Module) -> Iterator[None]:
    """Take back the attributes fx's tracer set on ``model`` once the GraphModule has copied them.

    fx stows a tensor the forward builds (``torch.eye(3)``) as ``_tensor_constant0`` on the module it
    traces: the private tree, here. Left there, ``rehome`` would take it for an attribute of the tree
    and drop the graph's own copy; it belongs to the graph only (``sparsefx.shell``).
    """
    before = set(model.__dict__)
    try:
        yield
    finally:
        for name in set(model.__dict__) - before:
            del model.__dict__[name]


def _restore_argument_names(graph: fx.Graph, model: nn.Module) -> None:
    """fx renames a baked-in argument (``flag`` becomes ``flag_1``); give it its name back so that
    calls passing it by keyword still work."""
    names = set(inspect.signature(model.forward).parameters)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    taken = {n.target for n in placeholders}
    for node in placeholders:
        base, _, suffix = str(node.target).rpartition("_")
        if suffix.isdigit() and base in names and base not in taken:
            taken.add(base)
            node.target = base


class _BufferTracer(fx.Tracer):
    """Reads of buffers become graph nodes, so in-place updates of them (``running.mul_(0.9)``) are
    recorded instead of being run once on the real tensor while tracing. ``h += 1`` is recorded as the
    in-place ``operator.iadd`` (see ``_InPlaceProxy``)."""

    proxy_buffer_attributes = True

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _InPlaceProxy(node, self)


INPLACE_OPERATORS = {
    "__iadd__": operator.iadd,
    "__isub__": operator.isub,
    "__imul__": operator.imul,
    "__itruediv__": operator.itruediv,
    "__ifloordiv__": operator.ifloordiv,
    "__imod__": operator.imod,
    "__ipow__": operator.ipow,
    "__iand__": operator.iand,
    "__ior__": operator.ior,
    "__ixor__": operator.ixor,
    "__ilshift__": operator.ilshift,
    "__irshift__": operator.irshift,
}
"""Augmented assignments fx's own Proxy leaves to Python's fallback, and the in-place op each records."""


class _InPlaceProxy(fx.Proxy):
    """A Proxy whose augmented assignments are recorded as the in-place operator.

    fx's Proxy has no ``__iadd__``, so Python runs ``h += 1`` as ``h = h + 1``: a new value, while on a
    tensor eager writes ``h`` in place and every alias of it (``y = h`` before) sees the change. The
    graph would silently compute something else. ``operator.iadd`` runs the same in-place update.
    """


def _inplace_method(op: Any) -> Any:
    def method(self: fx.Proxy, other: Any) -> fx.Proxy:
        return self.tracer.create_proxy("call_function", op, (self, other), {})

    method.__name__ = f"__{op.__name__}__"
    return method


for _name, _op in INPLACE_OPERATORS.items():
    setattr(_InPlaceProxy, _name, _inplace_method(_op))


@contextlib.contextmanager
def _state_unchanged(model: nn.Module) -> Iterator[None]:
    """Fail a trace that assigned to a parameter or buffer (``self.count += 1`` stores a Proxy) or
    changed one in place; put the original tensors back either way."""
    before = [(m, dict(m._parameters), dict(m._buffers)) for m in model.modules()]
    versions = {
        id(t): t._version for _, ps, bs in before for t in (*ps.values(), *bs.values()) if t is not None
    }
    try:
        yield
    finally:
        changed = []
        for module, params, buffers in before:
            for kind, now, then in (
                ("parameter", module._parameters, params),
                ("buffer", module._buffers, buffers),
            ):
                changed += [f"{kind} {k!r}" for k in set(now) | set(then) if now.get(k) is not then.get(k)]
                now.clear()
                now.update(then)
        changed += [
            f"tensor {id(t):#x}"
            for _, ps, bs in before
            for t in (*ps.values(), *bs.values())
            if t is not None and t._version != versions[id(t)]
        ]
    if changed:
        raise CaptureError(
            f"forward assigns to or updates {changed[0]} outside what fx can record (torch.export can)"
        )


def _concrete_args(model: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Forward parameters fx should bake in: defaults the call leaves out, and supplied values that
    are not tensors (``None``, flags, sizes). ``sparsefx.dispatch`` keys graphs by exactly these."""
    params = list(inspect.signature(model.forward).parameters.values())
    concrete = {}
    for i, p in enumerate(params):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in kwargs:
            value = kwargs[p.name]
        elif i < len(args) and p.kind != p.KEYWORD_ONLY:
            value = args[i]
        elif p.default is not p.empty:
            concrete[p.name] = p.default
            continue
        else:
            continue
        if _bakeable(value):
            concrete[p.name] = value
    return concrete


def _bakeable(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


# ----------------------------------------------------------------------------------------- export


def _try_export(model: nn.Module, args: tuple, kwargs: dict) -> tuple[fx.GraphModule | None, str, bool]:
    """Export with dynamic dims where the model allows them, else with static shapes (the flag)."""
    args, kwargs = _unalias(args, kwargs)
    hook = model.register_forward_hook(_register_output_types)
    try:
        errors = []
        for dynamic in (_auto_dims(model, args, kwargs), None):
            try:
                with _quiet_torch_logs():
                    ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic, strict=False)
                return ep.module(), "", dynamic is None
            except Exception as exc:  # export raises many unrelated types
                errors.append(_one_line(exc))
        return None, errors[-1], False
    finally:
        hook.remove()


def _unalias(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Copy example tensors that repeat (``labels=input_ids``): export would wire both inputs to one."""
    seen: set[int] = set()

    def fresh(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        if id(v) in seen:
            return v.clone()
        seen.add(id(v))
        return v

    return pytree.tree_map(fresh, (args, kwargs))


@contextlib.contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """A failed export prints its partial graph to stderr and logs warnings; keep only our one-line log."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def _auto_dims(model: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """``Dim.AUTO`` on every dim of every tensor input, keyed by forward parameter name."""
    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError:
        return None
    auto = torch.export.Dim.AUTO
    spec: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        spec[name] = pytree.tree_map(
            lambda v: {d: auto for d in range(v.dim())} if isinstance(v, torch.Tensor) else None, value
        )
    return spec


def _register_output_types(module: nn.Module, inputs: Any, output: Any) -> None:
    """Forward hook: make the containers in the output known to pytree before export flattens it.

    Dataclasses (Hugging Face model outputs) register as dataclasses. Any other object that holds
    tensors in its attributes (a key/value cache) registers as a node whose children are those
    attributes, rebuilt on the way out without calling ``__init__``.
    """
    for obj in _walk(output):
        cls = type(obj)
        if cls in pytree.SUPPORTED_NODES:
            continue
        if dataclasses.is_dataclass(obj):
            torch.export.register_dataclass(cls, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")
        elif _is_tensor_holder(obj):
            pytree.register_pytree_node(
                cls,
                _flatten_attrs,
                _unflatten_attrs,
                serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
                flatten_with_keys_fn=_flatten_attrs_with_keys,
            )


def _walk(obj: Any, depth: int = 0) -> Iterator[Any]:
    if depth > 16:
        return
    yield obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children: Any = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, dict):
        children = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj
    elif _is_tensor_holder(obj):
        children = vars(obj).values()
    else:
        children = ()
    for child in children:
        yield from _walk(child, depth + 1)


def _is_tensor_holder(obj: Any, depth: int = 0) -> bool:
    """A plain object (not a tensor, module or container) with a tensor somewhere in its attributes."""
    if depth > 8 or isinstance(obj, (torch.Tensor, nn.Module, type)) or not hasattr(obj, "__dict__"):
        return False
    return any(_holds_tensors(v, depth + 1) for v in vars(obj).values())


def _holds_tensors(value: Any, depth: int) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensors(v, depth + 1) for v in value.values())
    return _is_tensor_holder(value, depth)


def _flatten_attrs(obj: Any) -> tuple[list[Any], Any]:
    attrs = vars(obj)
    names = tuple(sorted(k for k, v in attrs.items() if _holds_tensors(v, 0)))
    rest = tuple(sorted((k, v) for k, v in attrs.items() if k not in names))
    return [attrs[k] for k in names], (type(obj), names, rest)


def _flatten_attrs_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], Any]:
    children, context = _flatten_attrs(obj)
    return [(pytree.GetAttrKey(name), c) for name, c in zip(context[1], children)], context


def _unflatten_attrs(children: Any, context: Any) -> Any:
    cls, names, rest = context
    obj = object.__new__(cls)
    vars(obj).update(rest)
    vars(obj).update(zip(names, children))
    return obj


# ---------------------------------------------------------------------------------------- partial


def _capture_partial(model: nn.Module, args: tuple, kwargs: dict, log: list[str]) -> Captured:
    """Keep the root eager; capture each child with parameters on its own, recursively.

    ``model`` is left as it is: the caller installs the graphs at their paths.
    """
    seen = _record_child_inputs(model, args, kwargs, log)
    graphs: dict[str, fx.GraphModule] = {}
    static: set[str] = set()
    methods: dict[str, str] = {}
    _capture_children(model, "", seen, log, graphs, static, methods)
    if not graphs:
        raise CaptureError(
            f"could not capture {type(model).__name__} or any of its children; tried: " + " | ".join(log)
        )
    log.append(f"partial: root runs eagerly; captured {', '.join(sorted(graphs))}")
    inputs = {path: seen[path] for path in graphs if path in seen}
    methods = {path: methods[path] for path in graphs}
    return Captured(model, "partial", graphs, inputs, log, static, methods)


def _capture_children(
    module: nn.Module,
    prefix: str,
    seen: dict[str, Inputs],
    log: list[str],
    graphs: dict[str, fx.GraphModule],
    static: set[str],
    methods: dict[str, str],
) -> None:
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if not any(True for _ in child.parameters()):
            continue
        child_args, child_kwargs = seen.get(path, ((), {}))
        gm, why = _try_fx(child, child_args, child_kwargs)
        if gm is None and path in seen:
            gm, why, shapes_fixed = _try_export(child, child_args, child_kwargs)
            if shapes_fixed:
                static.add(path)
            methods[path] = "export"
        if gm is not None:
            graphs[path] = gm
            methods.setdefault(path, "fx")
            continue
        log.append(f"{path}: {why}")
        _capture_children(child, f"{path}.", seen, log, graphs, static, methods)


def _record_child_inputs(model: nn.Module, args: tuple, kwargs: dict, log: list[str]) -> dict[str, Inputs]:
    """Run the model once and keep the first inputs each submodule received.

    The run leaves no trace: buffers (running statistics, counters) and the random number
    generators are put back as they were.
    """
    children = {path: sub for path, sub in model.named_modules() if path}
    saved = [
        (m, {k: v.clone() if v is not None else None for k, v in m._buffers.items()}) for m in model.modules()
    ]
    try:
        with record_inputs(children) as seen, torch.no_grad(), torch.random.fork_rng(devices=[]):
            model(*args, **kwargs)
    except Exception as exc:
        tried = " | ".join(log)
        raise CaptureError(
            f"{type(model).__name__} raised on the example inputs {describe_call(args, kwargs)}: "
            f"{_one_line(exc)} (capture tried: {tried})"
        ) from exc
    finally:
        for module, buffers in saved:
            for k, v in buffers.items():
                current = module._buffers.get(k)
                if current is not None and v is not None and current.shape == v.shape:
                    with torch.no_grad():
                        current.copy_(v)
                else:
                    module._buffers[k] = v
    return seen


def capture_graph(
    module: nn.Module, args: tuple, kwargs: dict, prefer: str = "fx"
) -> tuple[fx.GraphModule, str, bool]:
    """One graph of ``module`` for this call, ``prefer``'s method first: ``(gm, method, static shapes)``.

    This is how a compiled model captures again for a new kind of call (``sparsefx.dispatch``).
    """
    order = ("export", "fx") if prefer == "export" else ("fx", "export")
    errors = []
    for method in order:
        if method == "fx":
            gm, why = _try_fx(module, args, kwargs)
            static = False
        else:
            gm, why, static = _try_export(module, args, kwargs)
        if gm is not None:
            return gm, method, static
        errors.append(f"{method}: {why}")
    raise CaptureError(
        f"could not capture {type(module).__name__} again for a new kind of call: {' | '.join(errors)}"
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def is_guard_check(node: fx.Node) -> bool:
    """Whether ``node`` is ``torch.export``'s input-guard check (``_guards_fn``): it computes nothing.

    Graphs exported by recent torch versions call a ``_guards_fn`` submodule on the inputs to check
    the shapes the graph was specialized for; a consumer that fixes the shapes (lowering) skips it.
    """
    return node.op == "call_module" and str(node.target) == "_guards_fn" and not node.users
