"""Walk a captured graph on example inputs and turn each node into kernels through ``rules.RULES``.

The walk runs the graph (eval mode, no grad) node by node, so every value has its concrete shape and
dtype. A node that depends on no program input (shape arithmetic, ``arange``, causal masks, parameters)
folds to its concrete value; a data node goes to its rule. What the graph returns becomes the
program's outputs and ``output_tree`` (plain JSON data that rebuilds the model's output structure)::

    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    >>> walk = walk_graph(gm, (torch.ones(2, 3),), {})
    >>> [(p.name, p.op) for p in walk.builder.pending], walk.outputs, walk.output_tree
    ([('_0', 'elementwise')], ['_0'], {'type': 'tensor', 'index': 0})
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx import _pytree as fx_pytree
from torch.utils import _pytree as pytree

from sparsefx.errors import LoweringError

from ..effects import INPLACE_OPERATORS
from .builder import Builder, Ref
from .op_names import canonical_function, canonical_method, canonical_module
from .rules import RULES, Call

__all__ = ["Walk", "walk_graph", "SHAPE_OPS"]

SHAPE_OPS = frozenset({"size", "dim", "numel", "sym_size", "sym_numel", "sym_stride", "stride"})
"""Ops whose result is known from shapes alone: always folded, even on data values."""

RANDOM = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli", "normal",
    "uniform", "multinomial", "poisson", "normal_", "uniform_", "bernoulli_", "exponential_", "random_",
})  # fmt: skip
"""Ops that draw random numbers: a program has no generator, and folding one would freeze its draw."""

METADATA = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout", "is_sparse"})
"""Tensor attributes that describe a value without reading it: ``getattr`` of these folds."""


@dataclass
class Walk:
    """What walking a graph gives: the kernels, the output value names and the output structure."""

    builder: Builder
    outputs: list[str]
    output_tree: Any
    written_state: list[str] = dataclasses.field(default_factory=list)
    output_spec: Any = None
    """The exported graph's own ``pytree`` output spec: rebuilds any output class exactly, in this process."""


def flat_inputs(gm: fx.GraphModule, args: tuple, kwargs: dict) -> list[Any]:
    codegen = gm.graph._codegen
    in_spec = getattr(getattr(codegen, "pytree_info", None), "in_spec", None)
    if in_spec is not None:
        return list(fx_pytree.tree_flatten_spec((args, kwargs), in_spec))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    bound = inspect.signature(gm.forward).bind(*args, **kwargs)
    values = []
    for i, n in enumerate(placeholders):
        name = str(n.target).lstrip("*")
        if name in bound.arguments:
            values.append(bound.arguments[name])
        elif i < len(args):
            values.append(args[i])
        elif n.args:
            values.append(n.args[0])
        else:
            raise LoweringError(f"no example input for the graph's input {name!r}")
    return values


def _op_name(gm: fx.GraphModule, node: fx.Node) -> tuple[str, Any]:
    if node.op == "call_function":
        return canonical_function(node.target), None
    if node.op == "call_method":
        return canonical_method(str(node.target)), None
    module = gm.get_submodule(str(node.target))
    name = canonical_module(module)
    if name is None:
        raise LoweringError(
            f"cannot lower node {node.format_node()}: leaf module {node.target!r} of class "
            f"{type(module).__name__} has no lowering rule"
        )
    return name, module


def _describe(gm: fx.GraphModule, node: fx.Node) -> str:
    """A short name for a kernel's origin: the node and what it calls."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        return f"{node.name}: {node.target} ({type(module).__name__})"
    if node.op == "call_method":
        return f"{node.name}: .{node.target}()"
    target = getattr(node.target, "__qualname__", None) or str(node.target)
    module = getattr(node.target, "__module__", None)
    prefix = f"{module}." if module and not str(target).startswith(module) else ""
    return f"{node.name}: {prefix}{target}"


def _mutates(node: fx.Node, module: Any) -> bool:
    """Whether ``node`` writes its first argument in place (``x.relu_()``, ``F.relu(x, inplace=True)``,
    ``h += 1`` as fx records it, ``aten.add_.Tensor``)."""
    if module is not None:
        return bool(getattr(module, "inplace", False))
    if node.op == "call_method":
        return str(node.target).endswith("_") and not str(node.target).endswith("__")
    target = node.target
    if target in INPLACE_OPERATORS:
        return True
    if isinstance(target, torch._ops.OpOverload):
        first = target._schema.arguments[:1]
        return bool(first) and first[0].alias_info is not None and first[0].alias_info.is_write
    name = getattr(target, "__name__", "")
    if getattr(target, "__module__", None) == "_operator":  # operator.and_ (a & b) writes nothing
        return False
    return node.kwargs.get("inplace") is True or (name.endswith("_") and not name.endswith("__"))


def _writes_state(node: fx.Node, module: Any) -> bool:
    """Whether ``node`` writes in place into a parameter or buffer of the model (a ``get_attr``)."""
    if node.op not in ("call_function", "call_method", "call_module") or not node.args:
        return False
    first = node.args[0]
    if not isinstance(first, fx.Node) or first.op != "get_attr":
        return False
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.is_mutable
    return _mutates(node, module) or getattr(node.target, "__name__", "") in ("copy_", "setitem")


def _follow_mutation(
    node: fx.Node, module: Any, low: dict, env: dict, overwritten: dict, order: dict[fx.Node, int]
) -> None:
    """After an in-place op, later readers of the tensor it wrote read the op's result.

    Every node whose value is that tensor (the op's input, an alias of it such as ``y = h`` or
    ``aten.alias``) reads the result from now on. A node whose value only shares memory with it (a view
    of it, or the tensor it is a view of) changes too, which the program cannot follow: if such a node
    is read afterwards, that is a ``LoweringError`` naming the op rather than a silently different result.
    """
    if not _mutates(node, module) or not node.args or not isinstance(node.args[0], fx.Node):
        return
    target, result = node.args[0], low[node]
    written = env.get(target)
    if not isinstance(written, torch.Tensor) or not isinstance(result, Ref):
        return
    overwritten[id(written)] = (written, result)
    for other, value in env.items():
        if other is node:
            continue
        if other is target or _same_tensor(value, written):
            low[other] = result
            continue
        if _read_after(other, order[node], order) and any(_overlaps(t, written) for t in _tensors(value)):
            raise LoweringError(
                f"cannot lower node {node.format_node()}: it writes in place into {target.name!r} "
                f"({_op_label(node)}), and {other.name!r}, read afterwards, shares its memory (a view of it, "
                "or the tensor it views): a program cannot follow a write through a view; use the "
                "out-of-place form"
            )


def _op_label(node: fx.Node) -> str:
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return str(node.target)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _same_tensor(value: Any, written: torch.Tensor) -> bool:
    """``value`` is ``written`` itself, or a view of exactly its elements in the same layout."""
    if value is written:
        return True
    if not isinstance(value, torch.Tensor) or torch.strided not in (value.layout, written.layout):
        return False
    return (
        value.untyped_storage().data_ptr() == written.untyped_storage().data_ptr()
        and value.dtype == written.dtype
        and value.shape == written.shape
        and value.stride() == written.stride()
        and value.storage_offset() == written.storage_offset()
    )


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share at least one element of memory."""
    if a.layout != torch.strided or b.layout != torch.strided or a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    if a.element_size() != b.element_size():
        return True  # a reinterpreting view (x.view(torch.int32)): assume the worst
    (a_lo, a_hi), (b_lo, b_hi) = _span(a), _span(b)
    if a_hi < b_lo or b_hi < a_lo:
        return False
    size = max(a_hi, b_hi) + 1
    if size > _EXACT_OVERLAP_LIMIT:
        return True  # interleaved views of a huge storage: assume the worst rather than index it all
    index = torch.arange(size)
    used = torch.zeros(size, dtype=torch.bool)
    used[index.as_strided(a.shape, a.stride(), a.storage_offset()).reshape(-1)] = True
    return bool(used[index.as_strided(b.shape, b.stride(), b.storage_offset()).reshape(-1)].any())


_EXACT_OVERLAP_LIMIT = 1 << 24
"""Storage elements up to which ``_overlaps`` marks the elements views use (interleaved column slices)."""


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The first and last storage element ``t`` can touch (strides are not negative)."""
    offset = t.storage_offset()
    return offset, offset + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _read_after(other: fx.Node, position: int, order: dict[fx.Node, int]) -> bool:
    """Whether a node after graph position ``position`` reads ``other``'s data (not only its shape)."""
    for user in other.users:
        if order[user] <= position:
            continue
        if user.op == "call_method" and user.target in SHAPE_OPS:
            continue
        if user.op == "call_function" and user.target is getattr and user.args[1] in METADATA:
            continue
        return True
    return False


def _has_ref(value: Any) -> bool:
    return any(isinstance(leaf, Ref) for leaf in pytree.tree_leaves(value))


def walk_graph(
    gm: fx.GraphModule, args: tuple, kwargs: dict, skip: Callable[[fx.Node], bool] | None = None
) -> Walk:
    """Lower every node of ``gm`` called with ``args``/``kwargs``; see the module docstring.

    ``skip(node)`` names nodes that compute nothing the program needs (an exported graph's guard check).
    """
    b = Builder()
    interp = fx.Interpreter(gm, garbage_collect_values=False)
    interp.args_iter = iter(flat_inputs(gm, args, kwargs))
    low: dict[fx.Node, Any] = {}
    written: list[str] = []  # parameters and buffers the forward writes: the program cannot
    overwritten: dict[int, tuple[torch.Tensor, Ref]] = {}  # id -> (tensor, the value an op wrote)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    output = None
    with torch.no_grad():
        for node in gm.graph.nodes:
            b.source, b.node = _describe(gm, node), node.name
            if node.op == "output":
                output = node
                break
            real = interp.run_node(node)
            interp.env[node] = real
            if node.op == "placeholder":
                low[node] = b.input(node.name, real) if isinstance(real, torch.Tensor) else real
                continue
            if node.op == "get_attr" or (skip is not None and skip(node)):
                low[node] = overwritten.get(id(real), (None, real))[1]  # a buffer the forward wrote
                continue
            largs = fx.node.map_arg(node.args, lambda n: low[n])
            lkwargs = fx.node.map_arg(node.kwargs, lambda n: low[n])
            name, module = _op_name(gm, node)
            if _writes_state(node, module) and str(node.args[0].target) not in written:
                written.append(str(node.args[0].target))
            if name in RANDOM:
                raise LoweringError(
                    f"cannot lower node {node.format_node()}: the model draws random numbers ({name}) in "
                    "its forward, and a program has no random number generator"
                )
            if name == "getattr" and _has_ref(largs[:1]) and largs[1] not in METADATA:
                name = f"attr_{largs[1]}"  # x.T, x.mT ...: a data op, with its own rule (or an error)
            if (
                name in SHAPE_OPS
                or (name == "getattr" and largs[1] in METADATA)
                or not _has_ref((largs, lkwargs))
            ):
                low[node] = real
                continue
            rule = RULES.get(name)
            if rule is None:
                raise LoweringError(
                    f"cannot lower node {node.format_node()}: op {name!r} has no lowering rule; "
                    f"ops with rules: {', '.join(sorted(RULES))}"
                )
            low[node] = rule(b, Call(name, node, tuple(largs), dict(lkwargs), real, module))
            _follow_mutation(node, module, low, interp.env, overwritten, order)
    if output is None:
        raise LoweringError("the graph has no output node")
    outputs: list[str] = []
    value = fx.node.map_arg(output.args[0], lambda n: low[n])
    spec = getattr(getattr(gm.graph._codegen, "pytree_info", None), "out_spec", None)
    if spec is not None:
        leaves = iter(pytree.tree_leaves(value))
        tree = _from_spec(b, spec, leaves, outputs)
    else:
        tree = _tree(b, value, outputs)
    _drop_dead(b, outputs)
    return Walk(b, outputs, tree, written, spec)


def _leaf(b: Builder, value: Any, outputs: list[str]) -> Any:
    if isinstance(value, torch.Tensor):
        value = b.const(value, "output_const")
    if isinstance(value, Ref):
        outputs.append(value.name)
        return {"type": "tensor", "index": len(outputs) - 1}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"type": "const", "value": value}
    raise LoweringError(f"the model returns a {type(value).__name__}, which a program cannot output")


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _tree(b: Builder, value: Any, outputs: list[str]) -> Any:
    if isinstance(value, (Ref, torch.Tensor)):
        return _leaf(b, value, outputs)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return {
            "type": type(value).__name__ if type(value) in (list, tuple) else "tuple",
            "items": [_tree(b, v, outputs) for v in value],
        }
    if isinstance(value, dict):
        keys = list(value)
        return {"type": "dict", "keys": keys, "items": [_tree(b, value[k], outputs) for k in keys]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        keys = [f.name for f in dataclasses.fields(value)]
        return {
            "type": "dataclass",
            "class": _class_name(type(value)),
            "keys": keys,
            "items": [_tree(b, getattr(value, k), outputs) for k in keys],
        }
    return _leaf(b, value, outputs)


def _from_spec(b: Builder, spec: Any, leaves: Any, outputs: list[str]) -> Any:
    """The output tree of ``spec``'s structure: containers as they are; a dataclass or other object with
    its class, its field names (``keys``) and their values, in the spec's own leaf order."""
    if spec.is_leaf():
        return _leaf(b, next(leaves), outputs)
    items = [_from_spec(b, child, leaves, outputs) for child in spec.children_specs]
    if spec.type in (tuple, list):
        return {"type": spec.type.__name__, "items": items}
    if spec.type is dict:
        return {"type": "dict", "keys": list(spec.context), "items": items}
    kind = "dataclass" if dataclasses.is_dataclass(spec.type) else "object"
    return {"type": kind, "class": _class_name(spec.type), "keys": _field_names(spec), "items": items}


def _field_names(spec: Any) -> list[str]:
    """The names of ``spec``'s children, read from its context as pytree's registrations store them."""
    context = spec.context
    if isinstance(context, (list, tuple)) and all(isinstance(k, str) for k in context):
        return list(context)  # ModelOutput, OrderedDict
    fields = getattr(spec.type, "_fields", None)
    if isinstance(fields, tuple) and context is spec.type:  # a namedtuple
        return list(fields)
    if isinstance(context, (list, tuple)) and len(context) == 3 and context[0] is spec.type:
        return [str(k) for k in context[1]]  # an object capture registered: (class, names, other attrs)
    if isinstance(context, (list, tuple)) and len(context) == 2 and isinstance(context[1], list):
        names = context[0] if isinstance(context[0], list) else context[1]
        return [str(k) for k in names]  # a registered dataclass: (names, None fields); a defaultdict
    return []


def _drop_dead(b: Builder, outputs: list[str]) -> None:
    """Remove kernels nothing reaches the outputs from (unused split pieces, dead constants)."""
    live = set(outputs)
    for p in reversed(b.pending):
        if p.name in live:
            live.update(p.inputs)
    b.pending = [p for p in b.pending if p.name in live]
