"""The dense baseline: the same model with every weight kept, on the same mesh and mode, in its own plan.

The lowering plans it beside the real program (``passes/lower/dense_plan.py``): each kernel's
``attrs["dense"]`` holds the region, block size and number of passes the dense kernel gets when all
masks are ones and it is given the same effort (its own widths, its own block sizes, and with the
balanced placement ``"placement": "balanced"`` and its own row-cut limit ``"drift"``). An all-ones
weight's placement is a geometry, so ``dense_program`` describes it (``runtime/layout.py``,
``all_ones``) instead of storing a dense copy of every weight. A plan without ``"placement"`` (a
program lowered before the baseline had the balanced placement) keeps the block geometry. The clocks
then run it through the same cost rules as the real program. A dense kernel too big for the mesh's
SRAM in weight-streaming mode runs in ``passes`` over slices of its outputs, then a ``cat``; or, where
the kernel's value is a program output, its passes go to the host as they are made and the host puts
them together, as the real lowering does with its own parts (``passes/lower/host_join.py``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping

import torch

from .outputs import split_outputs
from .program import Kernel, ProgramData, Region

__all__ = ["dense_program", "dense_activity", "unavailable"]


def unavailable(program: ProgramData) -> str | None:
    """Why the program has no dense baseline, or None when it has one."""
    why = program.meta.get("dense_unavailable")
    if why:
        return str(why)
    if not all(isinstance(k.attrs.get("dense"), dict) for k in program.kernels):
        return "the program was lowered without a dense plan (lower it again with this version)"
    return None


def _plain(k: Kernel, region: Region, plan: dict) -> Kernel:
    mapping = ("dense", "rows_in_flight", "drift", "row_tiles", "result_rows")  # the plan has its own
    attrs = {key: value for key, value in k.attrs.items() if key not in mapping}
    for key in ("rows_in_flight", "row_tiles", "result_rows"):
        if key in plan:
            attrs[key] = plan[key]
    arrays = dict(k.arrays)
    if k.op == "sparse_matmul":
        attrs["all_ones"] = "balanced" if plan.get("placement") == "balanced" else True
        if plan.get("drift") is not None:
            attrs["drift"] = plan["drift"]
        attrs["bias"] = "bias" in k.arrays
        arrays = {}
    return dataclasses.replace(k, region=region, attrs=attrs, arrays=arrays, stats=dict(k.stats))


def _passes(k: Kernel, n: int) -> list[Kernel]:
    out = int(k.attrs["out_features"])
    pieces = []
    for i in range(n):
        a, b = i * out // n, (i + 1) * out // n
        attrs = dict(k.attrs, out_features=b - a, dense_offset=a)
        shape = (*k.shape[:-1], b - a)
        pieces.append(dataclasses.replace(k, name=f"{k.name}.dense{i}", shape=shape, attrs=attrs))
    cat = Kernel(
        k.name,
        "layout",
        k.region,
        tuple(p.name for p in pieces),
        k.shape,
        k.dtype,
        attrs={"fn": "cat", "dim": len(k.shape) - 1, "lanes": k.attrs.get("lanes", k.region.height)},
    )
    return pieces + [cat]


def dense_program(program: ProgramData) -> ProgramData | None:
    """The dense baseline of ``program`` (module docstring), or None if it has no dense plan."""
    if unavailable(program) is not None:
        return None
    kernels: list[Kernel] = []
    to_host: dict[str, tuple[tuple[str, ...], int]] = {}
    read = {v for k in program.kernels for v in k.inputs}
    for k in program.kernels:
        plan = k.attrs["dense"]
        region = Region(*plan["region"])
        dense = _plain(k, region, plan)
        n = int(plan.get("passes", 1))
        if n <= 1 or k.op != "sparse_matmul":
            kernels.append(dense)
            continue
        *pieces, cat = _passes(dense, n)
        kernels += pieces
        if k.name in program.outputs and k.name not in read:
            to_host[k.name] = (cat.inputs, cat.attrs["dim"])
        else:
            kernels.append(cat)
    out = copy.copy(program)
    out.kernels = kernels
    out.outputs, out.output_tree = split_outputs(program.outputs, program.output_tree, to_host)
    out.routes = []
    out.meta = dict(program.meta, baseline="dense")
    return out


def dense_activity(activity: Mapping[str, torch.Tensor], program: ProgramData) -> dict[str, torch.Tensor]:
    """The real program's zeros (``[rows, features]`` per value) under the dense program's names: a dense
    pass ``<name>.dense<i>`` computes a slice of ``<name>``'s features.

    The dense model's own activations would need the weights the masks prune, which a program does not
    hold, so the baseline filters the sparse run's zeros: activation sparsity counts on both sides and
    never inflates the weight-sparsity speedup."""
    out = dict(activity)
    for k in program.kernels:
        base = k.name.rsplit(".dense", 1)[0]
        if base == k.name or base not in activity:
            continue
        seen, f = activity[base], int(k.attrs["out_features"])
        first = int(k.attrs.get("dense_offset", 0))
        out[k.name] = seen[:, first : first + f]
    return out
