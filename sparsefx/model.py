"""SparseModel: the module ``sparsefx.compile`` returns.

It runs the captured, rewritten graph(s) and owns exactly the parameters and buffers of the
captured model under their original names, plus one ``<param>_mask`` buffer per sparse weight,
so optimizers, configs and checkpoints keep working::

    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 8)), 0.75)
    >>> sorted(sm.state_dict())
    ['0.bias', '0.weight', '0.weight_mask']
    >>> int(sm.masks["0.weight"].sum())
    16
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from .bound import binding_of
from .config import SparsityConfig, SparsityPlan
from .dispatch import CapturedModule, Variant, captured_modules
from .masks import mask_name
from .op_table import WEIGHT_ARG
from .passes.count_flops import NodeFlops, mask_nnz
from .passes.meta import FLOPS, SYMBOL_VALUES
from .shell import move_extras
from .symbolic import evaluate

__all__ = ["SparseModel", "ParamReport"]


@dataclass(frozen=True)
class ParamReport:
    """One sparse parameter: its target and actual sparsity, and what it costs per forward call."""

    name: str
    shape: tuple[int, ...]
    target: float
    actual: float
    nnz: int
    numel: int
    dense_flops: int | None
    sparse_flops: int | None


class SparseModel(nn.Module):
    """A compiled model. Call it like the original; see ``sparsefx.compile``.

    Its parameter, buffer and child dicts are those of the captured root, so ``state_dict`` keys,
    ``named_parameters`` and ``.to()`` all act on the same objects the graphs read.
    """

    def __init__(
        self,
        root: nn.Module,
        *,
        graphs: dict[str, fx.GraphModule],
        config: SparsityConfig | None,
        plan: SparsityPlan,
        capture_method: str,
        capture_log: list[str],
        graph_history: list[tuple[str, str]],
        example_inputs: dict[str, tuple[tuple, dict]] | None = None,
        sparsity: Any = None,
    ) -> None:
        super().__init__()
        self._parameters = root._parameters
        self._buffers = root._buffers
        self._non_persistent_buffers_set = root._non_persistent_buffers_set
        self._modules = root._modules
        self.training = root.training
        object.__setattr__(self, "_root", root)
        self.graphs = graphs
        self.config = config
        self.plan = plan
        self.capture_method = capture_method
        self.capture_log = capture_log
        self.graph_history = graph_history
        self.example_inputs = example_inputs or {}
        self.sparsity = sparsity
        for module in captured_modules(root).values():
            module.listeners.append(self._graph_added)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        root = self._root
        if type(root) is CapturedModule:  # no hooks of its own: skip a second Module.__call__
            return root.forward(*args, **kwargs)
        return root(*args, **kwargs)

    def train(self, mode: bool = True) -> SparseModel:
        self._root.training = mode
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> SparseModel:
        super()._apply(fn, recurse)
        if isinstance(self._root, CapturedModule):  # not a child: move its graph-only constants too
            for variant in self._root.variants:
                move_extras(variant.graph_module, fn)
        return self

    @property
    def graph_module(self) -> fx.GraphModule | None:
        """The whole-model graph, or None when the root runs eagerly (partial capture)."""
        return self.graphs.get("")

    def variants(self) -> dict[str, list[Variant]]:
        """``{path: [Variant]}``: every graph captured so far per captured module (see ``dispatch``)."""
        return {path: module.variants for path, module in captured_modules(self._root).items()}

    def weights_with_fresh_grads(self) -> frozenset[str]:
        """Sparse weights read only as the weight operand of named masked ops of every whole-model graph.

        The backward of those ops (linear, matmul, addmm, conv) computes the weight's gradient into
        a new tensor that nothing else holds, so the gradient hook may select it in place. A weight
        read any other way, in any graph captured so far, or a model captured in parts, is not listed.
        """
        if self.graph_module is None:
            return frozenset()
        fresh, other = set(), set()
        for variant in self.variants()[""]:
            _fresh_reads(variant.graph_module, self.plan.sparse, fresh, other)
        return frozenset(fresh - other)

    def _graph_added(self, module: CapturedModule, variant: Variant) -> None:
        """A graph captured for a new kind of call may read a weight another way: stop in-place selects."""
        if self.sparsity is None or not getattr(self.sparsity, "_graph_masked", False):
            return
        fresh = self.weights_with_fresh_grads()
        for name in self.plan.sparse:
            binding = binding_of(self.get_parameter(name))
            if binding is not None and name not in fresh:
                binding.fresh = False
        if hasattr(self.sparsity, "_fresh_grads"):
            self.sparsity._fresh_grads = self.sparsity._fresh_grads & fresh

    @property
    def masks(self) -> dict[str, torch.Tensor]:
        """``{param fqn: bool mask}`` for every sparse parameter (True keeps)."""
        return {name: self.get_buffer(mask_name(name)) for name in self.plan.sparse}

    def flop_rows(self) -> list[tuple[str, NodeFlops, dict]]:
        """``(graph path, NodeFlops, {symbol: example value})`` per counted node of every graph.

        ``NodeFlops.param`` is the fully qualified name of the weight the node reads, if any.
        """
        rows = []
        for path, gm in self.graphs.items():
            env = gm.meta.get(SYMBOL_VALUES, {})
            for row in gm.meta.get(FLOPS, ()):
                if row.param is not None and path:
                    row = dataclasses.replace(row, param=f"{path}.{row.param}")
                rows.append((path, row, env))
        return rows

    def final_code(self) -> str:
        """Every graph's code after its last pass, with a ``# graph <path>`` header when several."""
        if len(self.graphs) == 1:
            return next(iter(self.graphs.values())).code.strip("\n") + "\n"
        return "".join(f"# graph {path}\n{gm.code.strip()}\n\n" for path, gm in self.graphs.items())

    def sparsity_report(self) -> list[ParamReport]:
        """Per sparse parameter: shape, target, actual, nnz and dense/sparse forward FLOPs."""
        flops: dict[str, tuple[int, int]] = {}
        for _, row, env in self.flop_rows():
            if row.param is None:
                continue
            dense, sparse = flops.get(row.param, (0, 0))
            flops[row.param] = (dense + evaluate(row.dense, env), sparse + evaluate(row.sparse, env))
        reports = []
        for name, decision in self.plan.sparse.items():
            mask = self.get_buffer(mask_name(name))
            if self.sparsity is not None and name in self.sparsity.params:
                sp = self.sparsity.params[name]
                decision = dataclasses.replace(
                    decision, sparsity=self.sparsity.sparsity_at(sp, self.sparsity.step)
                )
            numel = mask.numel()
            nnz = mask_nnz(mask, decision)
            dense, sparse = flops.get(name, (None, None))
            actual = 1.0 - nnz / numel if numel else 0.0
            reports.append(
                ParamReport(name, decision.shape, decision.sparsity, actual, nnz, numel, dense, sparse)
            )
        return reports


def _fresh_reads(gm: fx.GraphModule, sparse: Any, fresh: set[str], other: set[str]) -> None:
    for node in gm.graph.nodes:
        if node.op != "get_attr" or node.target not in sparse:
            continue
        named = all(
            user.op == "call_function"
            and user.target in WEIGHT_ARG
            and user.args[WEIGHT_ARG[user.target]] is node
            and sum(a is node for a in (*user.args, *user.kwargs.values())) == 1
            for user in node.users
        )
        (fresh if named and node.users else other).add(node.target)
