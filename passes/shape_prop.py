"""Pass: propagate fake tensors through the graph, with symbolic batch and sequence dims.

Every node gets ``node.meta["val"]`` (a FakeTensor, or a tuple of them). Batch (dim 0 of every
input) and sequence (dim 1 of token ids ``[B, T]`` and of ``[B, T, D]`` inputs; dim 2 of a
``[B, C, L]`` input that a conv1d reads) are symbolic where the model allows, so the accounting
pass can give FLOPs as sympy expressions in ``batch`` and ``seq``. ``gm.meta["sparsefx.symbols"]``
maps the shape environment's symbols to those names. No real compute runs and no memory is spent
on activations::

    >>> gm = fx.symbolic_trace(torch.nn.Linear(4, 3))
    >>> gm = PropagateShapes(((torch.randn(8, 4),), {}), symbolic=True)(gm).graph_module
    >>> [[sym_expr(gm, d) for d in n.meta["val"].shape] for n in gm.graph.nodes if n.op == "call_function"]
    [[batch, 3]]
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import sympy
import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from sparsefx.op_table import conv1d_sources

from .manager import PassResult
from .meta import INPUT_ERROR, SHAPE_ENV, SHAPES, SYMBOL_VALUES, SYMBOLS

__all__ = [
    "INPUT_ERROR",
    "PropagateShapes",
    "BATCH",
    "SEQ",
    "SHAPE_ENV",
    "SYMBOLS",
    "SYMBOL_VALUES",
    "sym_expr",
]

BATCH = sympy.Symbol("batch", positive=True, integer=True)
SEQ = sympy.Symbol("seq", positive=True, integer=True)


@dataclass(frozen=True)
class PropagateShapes:
    """Fill ``node.meta["val"]`` from example ``(args, kwargs)``; a no-op when there are none.

    ``symbolic=False`` (the default in ``compile``) runs meta tensors through the graph: fast, and
    sizes are plain ints. ``symbolic=True`` uses fake tensors with symbolic batch and sequence
    dims, several times slower, for FLOP formulas in ``batch`` and ``seq``. Each mode falls back
    to the next (symbolic, meta, static fake) when a model defeats it.
    """

    inputs: tuple[tuple[Any, ...], dict[str, Any]] | None
    symbolic: bool = False
    name: str = "propagate-shapes"
    requires: ClassVar[tuple[str, ...]] = ()
    ensures: ClassVar[tuple[str, ...]] = (SHAPES,)

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        if self.inputs is None:
            gm.meta[SHAPES] = "none: no example inputs"
            return PassResult(gm, modified=False)
        args, kwargs = self.inputs
        modes = ("symbolic", "meta", "fake") if self.symbolic else ("meta", "fake")
        gm.meta.pop(INPUT_ERROR, None)
        for mode in modes:
            try:
                with _quiet_fake_tensor_logs():
                    _MODES[mode](gm, args, kwargs)
                gm.meta[SHAPES] = mode
                return PassResult(gm, modified=False)
            except Exception as exc:  # a model can defeat any one mode: guards, missing meta kernels
                gm.meta[SHAPES] = f"failed: {type(exc).__name__}: {exc}"
                error = exc
        if type(error) in _INPUT_ERRORS:  # a kernel's own check, not a mode the model defeats
            where = getattr(error, "_sparsefx_node", None)
            at = f"at {where.name} ({_target_name(where)}): " if where is not None else ""
            gm.meta[INPUT_ERROR] = f"{at}{str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        return PassResult(gm, modified=False)


def _target_name(node: fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))


_INPUT_ERRORS = (RuntimeError, ValueError, IndexError, TypeError, AssertionError)


@contextlib.contextmanager
def _quiet_fake_tensor_logs() -> Iterator[None]:
    """Fake tensors log a traceback at ERROR before raising; the pass reports the failure itself."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _run_fake(gm: fx.GraphModule, args: tuple, kwargs: dict, symbolic: bool) -> None:
    env = ShapeEnv() if symbolic else None
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    names: dict[sympy.Symbol, sympy.Symbol] = {}
    values: dict[sympy.Symbol, int] = {}
    seq_dims = _seq_dims(gm, args, kwargs) if symbolic else {}
    fake_args, fake_kwargs = pytree.tree_map(
        lambda v: _fake(mode, v, names, values, symbolic, seq_dims.get(id(v))), (args, kwargs)
    )
    flat = _flat_inputs(gm, fake_args, fake_kwargs)
    with mode, torch.no_grad():
        _Recorder(gm).run(*flat)
    _set_symbols(gm, env, names, values)


def _run_meta(gm: fx.GraphModule, args: tuple, kwargs: dict) -> None:
    meta_args, meta_kwargs = pytree.tree_map(_to_meta, (args, kwargs))
    with torch.no_grad():
        _MetaRecorder(gm).run(*_flat_inputs(gm, meta_args, meta_kwargs))
    _set_symbols(gm, None, {}, {})


def _set_symbols(gm: fx.GraphModule, env: ShapeEnv | None, names: dict, values: dict) -> None:
    gm.meta[SHAPE_ENV] = env
    gm.meta[SYMBOLS] = names
    gm.meta[SYMBOL_VALUES] = values


_MODES = {
    "symbolic": lambda gm, a, kw: _run_fake(gm, a, kw, symbolic=True),
    "meta": _run_meta,
    "fake": lambda gm, a, kw: _run_fake(gm, a, kw, symbolic=False),
}


class _Recorder(fx.Interpreter):
    def run_node(self, n: fx.Node) -> Any:
        try:
            result = super().run_node(n)
        except Exception as exc:
            if not hasattr(exc, "_sparsefx_node"):
                exc._sparsefx_node = n  # type: ignore[attr-defined]
            raise
        if n.op != "output":
            n.meta["val"] = result
        return result


class _MetaRecorder(_Recorder):
    """Runs on the meta device: attributes and module state are swapped for meta copies (no data)."""

    def fetch_attr(self, target: str) -> Any:
        return _to_meta(super().fetch_attr(target))

    def call_module(self, target: str, args: tuple, kwargs: dict) -> Any:
        module = self.module.get_submodule(target)
        state = {n: _to_meta(t) for n, t in (*module.named_parameters(), *module.named_buffers())}
        return torch.func.functional_call(module, state, args, kwargs)


def _to_meta(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) else value


def _fake(
    mode: FakeTensorMode, value: Any, names: dict, values: dict, symbolic: bool, seq_dim: int | None
) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if seq_dim is None and _has_seq_dim(value):
        seq_dim = 1
    dynamic = [DimDynamic.STATIC] * value.dim()
    if symbolic and value.dim() >= 1:
        dynamic[0] = DimDynamic.DYNAMIC
        if seq_dim is not None and seq_dim < value.dim():
            dynamic[seq_dim] = DimDynamic.DYNAMIC
    ctx = StatelessSymbolicContext(dynamic_sizes=dynamic)
    fake = mode.from_tensor(value, symbolic_context=ctx) if symbolic else mode.from_tensor(value)
    for dim, label in ((0, BATCH), (seq_dim, SEQ)):
        if dim is not None and dim < fake.dim() and isinstance(fake.shape[dim], torch.SymInt):
            expr = fake.shape[dim].node.expr
            if isinstance(expr, sympy.Symbol):
                names[expr] = label
                values.setdefault(label, int(value.shape[dim]))
    return fake


def _has_seq_dim(t: torch.Tensor) -> bool:
    """Token ids [B, T], or activations [B, T, D]."""
    return (t.dim() == 2 and not t.is_floating_point()) or t.dim() == 3


# What computes a conv1d: its dense sources, the masked op (a rewritten graph) and aten's generic
# convolution (a 3-d input makes it a conv1d).
_CONV1D_FUNCTIONS, _CONV1D_MODULES = conv1d_sources()


def _seq_dims(gm: fx.GraphModule, args: tuple, kwargs: dict) -> dict[int, int]:
    """``{id(input): 2}`` for every 3-d input a conv1d reads directly: it is ``[B, C, L]``, and the
    sequence is its length, not its channels (other inputs keep the ``[B, T, ...]`` rule)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    dims = {}
    for node, value in zip(placeholders, _flat_inputs(gm, args, kwargs)):
        if isinstance(value, torch.Tensor) and value.dim() == 3 and _feeds_conv1d(gm, node):
            dims[id(value)] = 2
    return dims


def _feeds_conv1d(gm: fx.GraphModule, node: fx.Node) -> bool:
    for user in node.users:
        if not user.args or user.args[0] is not node:
            continue
        if user.op == "call_function" and user.target in _CONV1D_FUNCTIONS:
            return True
        if user.op == "call_module" and isinstance(gm.get_submodule(str(user.target)), _CONV1D_MODULES):
            return True
    return False


def _flat_inputs(gm: fx.GraphModule, args: tuple, kwargs: dict) -> list[Any]:
    """Placeholders in graph order: positional args, then kwargs by name (export flattens them)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = list(args)
    for node in placeholders[len(args) :]:
        key = str(node.target).lstrip("*")
        values.append(kwargs.get(key, node.args[0] if node.args else None))
    return pytree.tree_leaves(values) if len(values) != len(placeholders) else values


def sym_expr(gm: fx.GraphModule, value: Any) -> sympy.Expr:
    """A size (int or SymInt) as a sympy expression in ``batch`` and ``seq``."""
    if isinstance(value, torch.SymInt):
        env: ShapeEnv | None = gm.meta.get(SHAPE_ENV)
        expr = value.node.expr
        if env is not None:
            expr = env.replace(expr)
        return sympy.sympify(expr).xreplace(gm.meta.get(SYMBOLS, {}))
    return sympy.Integer(int(value))
