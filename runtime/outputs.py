"""A program's outputs in the model's own structure, rebuilt from ``program.output_tree``.

``output_tree`` is plain JSON data recorded at lowering: ``tensor`` (an index into ``program.outputs``),
``const`` (a JSON value), ``tuple``, ``list`` and ``dict`` nodes, ``cat`` nodes (tensors the host puts
together along ``dim``: the parts of a streamed matmul, ``passes/lower/host_join.py``), and
``dataclass``/``object`` nodes that name a class, its field names (``keys``) and their values
(``items``). A program file is untrusted, so a class named by the tree is instantiated only if it is on
``ALLOWED``:

- the Hugging Face key/value caches ``DynamicCache`` (with its ``DynamicLayer``s) and
  ``EncoderDecoderCache``, rebuilt through their public constructors and ``update``;
- ``transformers`` ``ModelOutput`` subclasses (``CausalLMOutputWithPast``, ``Seq2SeqLMOutput`` ...)
  defined in ``transformers.modeling_outputs`` or in a ``transformers`` module already imported;
- ``collections.OrderedDict``.

Classes are looked up, never imported (except ``transformers.modeling_outputs`` and
``transformers.cache_utils``), and nothing is unpickled. Any other class (a user's own dataclass, another
cache type) is rebuilt exactly in the process that lowered the program, from the model's own output
structure (``program.output_spec``, which is never saved); in a program loaded from a file or parsed
from text it comes back as a ``dict`` of its fields, with a ``UserWarning`` naming the class::

    >>> import torch
    >>> tree = {"type": "dict", "keys": ["a", "b"],
    ...         "items": [{"type": "tensor", "index": 0}, {"type": "const", "value": None}]}
    >>> rebuild_outputs(tree, [torch.ones(1)])
    {'a': tensor([1.]), 'b': None}
"""

from __future__ import annotations

import collections
import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from sparsefx.errors import EmulationError

__all__ = ["rebuild_outputs", "split_outputs", "ALLOWED", "MAX_DEPTH"]

MAX_DEPTH = 64
"""The deepest output tree rebuilt; a deeper one (a hostile file) is an ``EmulationError``."""

_CACHES = "transformers.cache_utils"
_IMPORTABLE = frozenset({"transformers.modeling_outputs", _CACHES})
"""Modules a class path may be looked up in even when not imported yet (known, side-effect free)."""


class _NotRebuilt(Exception):
    """A class node that is not rebuilt as its class (not allowed, or its fields do not fit)."""


def _dynamic_layer(cls: type, fields: dict[str, Any]) -> Any:
    _expect(cls, fields, {"keys", "values"})
    layer = cls()
    layer.update(fields["keys"], fields["values"])
    return layer


def _dynamic_cache(cls: type, fields: dict[str, Any]) -> Any:
    _expect(cls, fields, {"layers"})
    layers = fields["layers"]
    if not isinstance(layers, list) or not all(hasattr(x, "keys") and hasattr(x, "values") for x in layers):
        raise _NotRebuilt(f"{cls.__name__}.layers is not a list of layers")
    return cls([(layer.keys, layer.values) for layer in layers])  # one layer per pair, as the model's own


def _encoder_decoder_cache(cls: type, fields: dict[str, Any]) -> Any:
    _expect(cls, fields, {"self_attention_cache", "cross_attention_cache"})
    base = _lookup(f"{_CACHES}.Cache")
    parts = fields["self_attention_cache"], fields["cross_attention_cache"]
    if base is None or not all(isinstance(c, base) for c in parts):
        raise _NotRebuilt(f"{cls.__name__}'s self- and cross-attention caches are not caches")
    return cls(*parts)


def _model_output(cls: type, fields: dict[str, Any]) -> Any:
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise _NotRebuilt(f"{cls.__name__} does not take {sorted(fields)}: {exc}") from None


def _ordered_dict(cls: type, fields: dict[str, Any]) -> Any:
    return collections.OrderedDict(fields)


ALLOWED: dict[str, Callable[[type, dict[str, Any]], Any]] = {
    f"{_CACHES}.DynamicLayer": _dynamic_layer,
    f"{_CACHES}.DynamicCache": _dynamic_cache,
    f"{_CACHES}.EncoderDecoderCache": _encoder_decoder_cache,
    "collections.OrderedDict": _ordered_dict,
}
"""Class path -> ``build(cls, fields)``: the classes rebuilt from any program, file or not. ``transformers``
``ModelOutput`` subclasses are allowed besides (module docstring)."""


def _expect(cls: type, fields: dict[str, Any], names: set[str]) -> None:
    if set(fields) != names:
        raise _NotRebuilt(f"{cls.__name__} has fields {sorted(fields)}, not {sorted(names)}")


def _lookup(path: str) -> Any:
    """The object at ``module.qualname`` ``path`` among imported modules (and ``_IMPORTABLE``), or None.

    Attributes are read from ``__dict__``s, so a lazy module (``transformers``) imports nothing more."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        module = sys.modules.get(name)
        if module is None and name in _IMPORTABLE:
            try:
                module = importlib.import_module(name)
            except ImportError:
                return None
        if module is None:
            continue
        obj: Any = module
        for attr in parts[cut:]:
            found = getattr(obj, "__dict__", {})
            obj = found.get(attr) if isinstance(found, Mapping) else None  # no __getattr__: no lazy import
        return obj
    return None


def _is_model_output(cls: type) -> bool:
    return cls.__module__.startswith("transformers.") and any(
        b.__name__ == "ModelOutput" and b.__module__.startswith("transformers.") for b in cls.__mro__
    )


def _builder(path: str) -> tuple[type, Callable[[type, dict[str, Any]], Any]] | None:
    """The class at ``path`` and how to build it, if it is allowed (module docstring)."""
    if path in ALLOWED:
        cls = _lookup(path)
        return (cls, ALLOWED[path]) if isinstance(cls, type) else None
    if not path.startswith("transformers."):
        return None
    cls = _lookup(path)
    if isinstance(cls, type) and f"{cls.__module__}.{cls.__qualname__}" == path and _is_model_output(cls):
        return cls, _model_output
    return None


def rebuild_outputs(tree: Any, outputs: list[Any], spec: Any = None) -> Any:
    """The model's output structure from ``output_tree`` and the output values (in ``program.outputs``).

    ``spec`` is the model's own ``pytree`` output spec, known only in the process that lowered the
    program: with it, classes that are not allowed are rebuilt exactly as the model returns them.
    """
    refused: dict[str, str] = {}
    value = _build(tree, outputs, refused, 0)
    if refused and spec is not None:
        leaves = _leaves(tree, outputs, 0)
        if len(leaves) == spec.num_leaves:
            return pytree.tree_unflatten(leaves, spec)
    if refused:
        named = "; ".join(f"{path} ({why})" for path, why in refused.items())
        warnings.warn(
            f"the program's outputs hold classes sparsefx does not rebuild from a program file or text: "
            f"{named}; each comes back as a dict of its fields. Rebuilt: {', '.join(sorted(ALLOWED))} "
            "and transformers ModelOutput classes; any class, in the process that lowered the program",
            stacklevel=4,
        )
    return value


def split_outputs(
    outputs: list[str], tree: Any, parts: Mapping[str, tuple[tuple[str, ...], int]]
) -> tuple[list[str], Any]:
    """``outputs`` and ``tree`` with each output ``name`` in ``parts`` (``name -> (names, dim)``) sent as
    the values ``names``, which the host puts together along ``dim`` (a ``cat`` node)::

        >>> split_outputs(["y", "z"], {"type": "tuple", "items": [{"type": "tensor", "index": 0},
        ...               {"type": "tensor", "index": 1}]}, {"y": (("y0", "y1"), 1)})[0]
        ['y0', 'y1', 'z']
    """
    new: list[str] = []
    nodes: dict[int, dict[str, Any]] = {}  # each old output index -> the node that now gives it
    for i, name in enumerate(outputs):
        names, dim = parts.get(name, ((name,), None))
        items = [{"type": "tensor", "index": len(new) + j} for j in range(len(names))]
        new += names
        nodes[i] = items[0] if dim is None else {"type": "cat", "dim": dim, "items": items}

    def node(t: Any) -> Any:
        if isinstance(t, dict) and t.get("type") == "tensor" and type(t.get("index")) is int:
            return nodes.get(t["index"], t)
        if isinstance(t, dict) and isinstance(t.get("items"), list):
            return {**t, "items": [node(item) for item in t["items"]]}
        return t

    return new, node(tree)


def _node(tree: Any, depth: int) -> str:
    if depth > MAX_DEPTH:
        raise EmulationError(f"the output tree is nested deeper than {MAX_DEPTH} levels")
    if not isinstance(tree, dict) or "type" not in tree:
        raise EmulationError(f"output tree node {str(tree)[:200]} has no type")
    kind = tree["type"]
    if kind not in ("tensor", "cat", "const", "tuple", "list", "dict", "dataclass", "object"):
        raise EmulationError(
            f"output tree node type {kind!r} is not tensor, cat, const, tuple, list, dict, dataclass "
            "or object"
        )
    return kind


def _items(tree: dict[str, Any]) -> list[Any]:
    items = tree.get("items", [])
    if not isinstance(items, list):
        raise EmulationError(f"output tree node {tree['type']!r} has items {str(items)[:200]}, not a list")
    return items


def _tensor(tree: dict[str, Any], outputs: list[Any]) -> Any:
    index = tree.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(outputs):
        raise EmulationError(f"output tree names output {index!r}; the program has {len(outputs)}")
    return outputs[index]


def _cat(tree: dict[str, Any], outputs: list[Any], depth: int) -> torch.Tensor:
    """A ``cat`` node's tensors, put together along its ``dim``."""
    items = _items(tree)
    parts = [_build(item, outputs, {}, depth + 1) for item in items]
    dim = tree.get("dim")
    if not parts or not all(isinstance(t, torch.Tensor) for t in parts):
        raise EmulationError(f"output tree cat node has items {str(items)[:200]}; it needs tensors")
    if not isinstance(dim, int) or isinstance(dim, bool) or not -parts[0].dim() <= dim < parts[0].dim():
        raise EmulationError(f"output tree cat node has dim {dim!r}; its tensors have {parts[0].dim()} dims")
    try:
        return torch.cat(parts, dim)
    except RuntimeError as exc:
        raise EmulationError(f"output tree cat node: its tensors do not fit together ({exc})") from None


def _build(tree: Any, outputs: list[Any], refused: dict[str, str], depth: int) -> Any:
    kind = _node(tree, depth)
    if kind == "tensor":
        return _tensor(tree, outputs)
    if kind == "cat":
        return _cat(tree, outputs, depth)
    if kind == "const":
        return tree.get("value")
    items = [_build(item, outputs, refused, depth + 1) for item in _items(tree)]
    if kind == "tuple":
        return tuple(items)
    if kind == "list":
        return items
    keys = tree.get("keys") or []
    if not isinstance(keys, list) or len(keys) != len(items):
        if kind == "dict":
            raise EmulationError(f"output tree dict node has keys {str(keys)[:200]} for {len(items)} items")
        return tuple(items)
    fields = dict(zip(keys, items))
    if kind == "dict":
        return fields
    return _instance(str(tree.get("class", "")), fields, refused)


def _instance(path: str, fields: dict[str, Any], refused: dict[str, str]) -> Any:
    """An allowed class built from ``fields``; any other comes back as ``fields`` (and is named)."""
    found = _builder(path)
    if found is None:
        refused[path] = "not an allowed class"
        return fields
    cls, build = found
    try:
        return build(cls, fields)
    except _NotRebuilt as exc:
        refused[path] = str(exc)
        return fields


def _leaves(tree: Any, outputs: list[Any], depth: int) -> list[Any]:
    """The tree's leaves in order (the model's own ``pytree`` leaf order)."""
    kind = _node(tree, depth)
    if kind == "tensor":
        return [_tensor(tree, outputs)]
    if kind == "cat":
        return [_cat(tree, outputs, depth)]
    if kind == "const":
        return [tree.get("value")]
    return [leaf for item in _items(tree) for leaf in _leaves(item, outputs, depth + 1)]
