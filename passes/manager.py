"""Pass, PassResult and PassManager: a straight-line pipeline over one fx.GraphModule.

A pass is a small frozen dataclass with a kebab-case ``name`` whose ``__call__`` returns a
``PassResult``; its class-level ``requires`` and ``ensures`` name the ``gm.meta`` keys (``passes/meta.py``)
it reads and writes. The manager checks those before and after each pass, records each pass's
``text`` (the graph code by default), runs ``verify`` after each pass in debug mode, and turns
failures into one ``PassError`` that names the pass, the node and the passes that ran before::

    >>> pm = PassManager([])
    >>> pm(fx.symbolic_trace(torch.nn.Linear(2, 2))).modified
    False
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import fx

from sparsefx.errors import LoweringError, PassError, VerifyError
from sparsefx.masks import mask_problem, param_of

__all__ = ["Pass", "PassResult", "PassManager", "NodeFailure", "fail", "attr_at"]

logger = logging.getLogger("sparsefx")


@dataclass(frozen=True)
class PassResult:
    """The graph module after a pass, and whether the pass changed it."""

    graph_module: fx.GraphModule
    modified: bool
    info: dict[str, Any] = field(default_factory=dict)


class Pass(Protocol):
    """Anything with a kebab-case ``name`` that maps a GraphModule to a ``PassResult``.

    Optional class attributes ``requires`` and ``ensures`` (tuples of ``gm.meta`` keys) state its
    contract; a pass without them is not checked.
    """

    name: str

    def __call__(self, gm: fx.GraphModule) -> PassResult: ...


class NodeFailure(Exception):
    """Raised inside a pass to say which node it failed on; the manager turns it into PassError."""

    def __init__(self, node: fx.Node, why: str) -> None:
        super().__init__(why)
        self.node = node
        self.why = why


def fail(node: fx.Node, why: str) -> NodeFailure:
    """``raise fail(node, "why")`` from a pass."""
    return NodeFailure(node, why)


class PassManager:
    """Run passes in order; keep ``history`` as ``[(pass name, text)]``.

    The manager is generic over what the passes transform: ``text`` renders it for the history
    (``gm.code`` by default), ``verify`` checks it in debug mode (``verify_graph`` by default), and
    the ``requires``/``ensures`` contracts are checked against its ``meta`` dict when it has one.
    """

    def __init__(
        self,
        passes: Sequence[Pass],
        *,
        debug: bool = False,
        verify: Callable[[Any], None] | None = None,
        text: Callable[[Any], str] | None = None,
        label: str = "",
    ) -> None:
        self.passes = list(passes)
        self.debug = debug
        self.verify = verify or verify_graph
        self.text = text or _code
        self.label = label
        self.history: list[tuple[str, str]] = []

    def __call__(self, gm: Any) -> PassResult:
        modified = False
        done: list[str] = []
        for p in self.passes:
            result = self._run_one(p, gm, done)
            gm, modified = result.graph_module, modified or result.modified
            self.history.append((p.name, self.text(gm)))
            done.append(p.name)
        return PassResult(gm, modified)

    def _check_contract(self, p: Pass, gm: Any, done: list[str], before: bool) -> None:
        keys = getattr(p, "requires" if before else "ensures", ())
        meta = getattr(gm, "meta", None)
        if not keys or not isinstance(meta, dict):
            return
        missing = [key for key in keys if key not in meta]
        if not missing:
            return
        where = f" in graph {self.label!r}" if self.label else ""
        ran = f" (passes run so far: {', '.join(done) or 'none'})"
        if not before:
            raise PassError(f"{p.name} did not set {', '.join(missing)} in meta, as it ensures{where}{ran}")
        key = missing[0]
        makers = [q.name for q in self.passes if key in getattr(q, "ensures", ())]
        hint = f"; {' or '.join(makers)} ensures it" if makers else "; no pass in this pipeline ensures it"
        raise PassError(f"{p.name} requires meta key {key!r}, which is missing{where}{hint}{ran}")

    def _run_one(self, p: Pass, gm: Any, done: list[str]) -> PassResult:
        where = f" in graph {self.label!r}" if self.label else ""
        ran = f" (passes run so far: {', '.join(done) or 'none'})"
        self._check_contract(p, gm, done, before=True)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = p(gm)
            for w in caught:  # a warning from inside a pass is sparsefx's to fix, not the user's to read
                if self.debug:
                    raise PassError(f"{p.name} warned{where}: {w.category.__name__}: {w.message}{ran}")
                logger.debug("%s warned%s: %s: %s", p.name, where, w.category.__name__, w.message)
            if self.debug:
                self.verify(result.graph_module)
        except NodeFailure as exc:
            raise PassError(
                f"{p.name} failed on node {exc.node.format_node()}{where}: {exc.why}{ran}"
            ) from exc
        except VerifyError as exc:
            raise PassError(f"{p.name} produced an invalid graph{where}: {exc}{ran}") from exc
        except (PassError, LoweringError):  # a model lowering cannot take: the user's to read as is
            raise
        except Exception as exc:
            raise PassError(f"{p.name} failed{where}: {type(exc).__name__}: {exc}{ran}") from exc
        self._check_contract(p, result.graph_module, done, before=False)
        return result


def _code(gm: fx.GraphModule) -> str:
    return gm.code


def verify_graph(gm: fx.GraphModule) -> None:
    """Structural checks: fx lint, every get_attr target exists, masks are bool and shaped like weights."""
    try:
        gm.graph.lint()
    except Exception as exc:
        raise VerifyError(f"graph lint failed: {exc}") from exc
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        try:
            value = attr_at(gm, node.target)
        except AttributeError as exc:
            raise VerifyError(f"node {node.format_node()}: no attribute {node.target!r}") from exc
        weight_name = param_of(str(node.target))
        if weight_name is not None and isinstance(value, torch.Tensor):
            _check_mask(gm, node, value, weight_name)


def _check_mask(gm: fx.GraphModule, node: fx.Node, mask: torch.Tensor, weight_name: str) -> None:
    try:
        weight = attr_at(gm, weight_name)
    except AttributeError:
        return
    problem = mask_problem(mask, weight)
    if problem is not None:
        raise VerifyError(f"node {node.format_node()}: {problem}")


def attr_at(gm: torch.nn.Module, target: str) -> Any:
    """The attribute a ``get_attr`` target names, e.g. ``"blocks.0.fc.weight"``."""
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
