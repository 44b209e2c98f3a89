"""Graph passes: fx.GraphModule -> fx.GraphModule, one pass per file, run by a PassManager."""

from .manager import NodeFailure, Pass, PassManager, PassResult, fail, verify_graph

__all__ = ["Pass", "PassResult", "PassManager", "NodeFailure", "fail", "verify_graph"]
