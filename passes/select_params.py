"""Pass: mark the parameters the sparsity plan selects, and the graph nodes that read them.

After it runs, ``gm.meta["sparsefx.selected"]`` maps each selected parameter's path inside ``gm``
to its ``ParamDecision``, and each ``get_attr`` node of a selected parameter carries
``node.meta["sparsefx.param"]`` (the parameter's fully qualified name in the whole model)::

    >>> from sparsefx.config import load_config
    >>> plan = load_config(0.5).resolve(torch.nn.Linear(4, 4).named_parameters())
    >>> gm = fx.symbolic_trace(torch.nn.Linear(4, 4))
    >>> sorted(SelectSparseParams(plan)(gm).graph_module.meta["sparsefx.selected"])
    ['weight']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import fx

from sparsefx.config import SparsityPlan

from .manager import PassResult
from .meta import PARAM, SELECTED

__all__ = ["SelectSparseParams", "SELECTED"]


@dataclass(frozen=True)
class SelectSparseParams:
    """Annotate ``gm`` with the plan's sparse parameters; ``prefix`` is ``gm``'s path in the model."""

    plan: SparsityPlan
    prefix: str = ""
    name: str = "select-sparse-params"
    requires: ClassVar[tuple[str, ...]] = ()
    ensures: ClassVar[tuple[str, ...]] = (SELECTED,)

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        selected = {}
        for local, _ in gm.named_parameters(remove_duplicate=False):
            fqn = self.prefix + local
            if fqn in self.plan and self.plan[fqn].sparse:
                selected[local] = self.plan[fqn]
        before = dict(gm.meta.get(SELECTED, {}))
        gm.meta[SELECTED] = selected
        for node in gm.graph.nodes:
            if node.op == "get_attr" and node.target in selected:
                node.meta[PARAM] = self.prefix + node.target
        return PassResult(gm, modified=before.keys() != selected.keys(), info={"selected": sorted(selected)})
