"""Every ``gm.meta`` key that passes hand to each other, in one place.

A pass declares the keys it reads (``requires``) and writes (``ensures``); the ``PassManager``
checks both. ``KEYS`` maps each key to a one-line description::

    >>> SELECTED in KEYS and KEYS[FLOPS].startswith("tuple of NodeFlops")
    True
"""

from __future__ import annotations

__all__ = [
    "SELECTED",
    "PARAM",
    "SHAPES",
    "SHAPE_ENV",
    "SYMBOLS",
    "SYMBOL_VALUES",
    "INPUT_ERROR",
    "FLOPS",
    "UNCOUNTED",
    "KEYS",
]

SELECTED = "sparsefx.selected"
PARAM = "sparsefx.param"  # a node.meta key, not gm.meta: the selected parameter's fqn on its get_attr node
SHAPES = "sparsefx.shapes"
SHAPE_ENV = "sparsefx.shape_env"
SYMBOLS = "sparsefx.symbols"
SYMBOL_VALUES = "sparsefx.symbol_values"
INPUT_ERROR = "sparsefx.input_error"
FLOPS = "sparsefx.flops"
UNCOUNTED = "sparsefx.uncounted"

KEYS: dict[str, str] = {
    SELECTED: "{parameter path in gm: ParamDecision} of the plan's sparse parameters (select-sparse-params)",
    PARAM: "node.meta key: fully qualified name of the selected parameter a get_attr node reads",
    SHAPES: "how shapes were propagated: 'symbolic', 'meta', 'fake', 'none: ...' or 'failed: <error>'",
    SHAPE_ENV: "the ShapeEnv of symbolic propagation, or None (set only when propagation succeeded)",
    SYMBOLS: "{shape-env symbol: batch | seq} (set only when propagation succeeded)",
    SYMBOL_VALUES: "{batch | seq: value in the example inputs} (set only when propagation succeeded)",
    INPUT_ERROR: "why a kernel rejected the example inputs (a shape or dtype mismatch), if one did",
    FLOPS: "tuple of NodeFlops, one per counted node (count-flops)",
    UNCOUNTED: "names of matmul-like nodes count-flops could not cost because they have no shapes",
}
