"""Pass, PassResult and PassManager: a straight-line pipeline over one fx.GraphModule.

A pass is a small frozen dataclass with a kebab-case ``name`` whose ``__call__`` returns a
``PassResult``. The manager records each pass's graph text, runs ``verify`` after each pass in
debug mode, and turns failures into one ``PassError`` that names the pass, the node and the passes
that ran before::

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

from sparsefx.errors import PassError, VerifyError
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
    """Anything with a kebab-case ``name`` that maps a GraphModule to a ``PassResult``."""

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
    """Run passes in order; keep ``history`` as ``[(pass name, graph text)]``."""

    def __init__(
        self,
        passes: Sequence[Pass],
        *,
        debug: bool = False,
        verify: Callable[[fx.GraphModule], None] | None = None,
        label: str = "",
    ) -> None:
        self.passes = list(passes)
        self.debug = debug
        self.verify = verify or verify_graph
        self.label = label
        self.history: list[tuple[str, str]] = []

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        modified = False
        done: list[str] = []
        for p in self.passes:
            result = self._run_one(p, gm, done)
            gm, modified = result.graph_module, modified or result.modified
            self.history.append((p.name, gm.code))
            done.append(p.name)
        return PassResult(gm, modified)

    def _run_one(self, p: Pass, gm: fx.GraphModule, done: list[str]) -> PassResult:
        where = f" in graph {self.label!r}" if self.label else ""
        ran = f" (passes run so far: {', '.join(done) or 'none'})"
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
        except PassError:
            raise
        except Exception as exc:
            raise PassError(f"{p.name} failed{where}: {type(exc).__name__}: {exc}{ran}") from exc
        return result


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
