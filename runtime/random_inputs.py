"""Fresh random inputs for a program, from the shapes and dtypes its input streams record.

Floats are standard normal, bools fair coins. Integers are ids: an input that reaches embedding
kernels (directly or through layout kernels, which move data and compute nothing) draws from
``[0, rows)`` of the smallest table it indexes; any other integer input draws 0 or 1, a range every
index, mask or count takes::

    >>> import sparsefx
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Embedding(10, 4)), 0.5, torch.zeros(2, 3).long())
    >>> program = sparsefx.lower(sm, torch.zeros(2, 3).long(), mesh=(4, 4))
    >>> id_bounds(program)
    {'input_1': 10}
    >>> x = random_inputs(program, seed=0)["input_1"]
    >>> x.shape, x.dtype, bool((x >= 0).all() and (x < 10).all())
    (torch.Size([2, 3]), torch.int64, True)
"""

from __future__ import annotations

import math

import torch

from .program import DTYPES, Kernel, ProgramData

__all__ = ["random_inputs", "id_bounds", "SAFE_ID_BOUND"]

SAFE_ID_BOUND = 2
"""Integer inputs that index no embedding draw from ``[0, SAFE_ID_BOUND)``."""


def _table_rows(k: Kernel, program: ProgramData) -> int | None:
    """Rows of an embedding kernel's table: its recorded shape, else its size over the row width."""
    shape = k.attrs.get("shapes", {}).get("table")
    if shape:
        return int(shape[0])
    spec = program.specs.get(k.arrays.get("table", ""))
    if spec is None or not k.shape or not k.shape[-1]:
        return None
    return math.prod(spec.shape) // int(k.shape[-1])


def id_bounds(program: ProgramData) -> dict[str, int]:
    """``{input name: rows}`` for each input that reaches an embedding's ids: the smallest table's rows."""
    readers: dict[str, list[Kernel]] = {}
    for k in program.kernels:
        for name in dict.fromkeys(k.inputs):
            readers.setdefault(name, []).append(k)
    bounds = {}
    for stream in program.inputs:
        rows = []
        todo, seen = [stream.name], set()
        while todo:
            value = todo.pop()
            if value in seen:
                continue
            seen.add(value)
            for k in readers.get(value, ()):
                if k.op == "embedding" and k.inputs[0] == value:
                    found = _table_rows(k, program)
                    rows += [found] if found else []
                elif k.op == "layout":
                    todo.append(k.name)
        if rows:
            bounds[stream.name] = min(rows)
    return bounds


def random_inputs(program: ProgramData, seed: int = 0) -> dict[str, torch.Tensor]:
    """``{input name: tensor}`` of the program's input shapes and dtypes, drawn with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    bounds = id_bounds(program)
    out = {}
    for s in program.inputs:
        dtype = DTYPES[s.dtype]
        if dtype == torch.bool:
            out[s.name] = torch.rand(s.shape, generator=gen) < 0.5
        elif dtype.is_floating_point:
            out[s.name] = torch.randn(s.shape, generator=gen).to(dtype)
        else:
            high = bounds.get(s.name, SAFE_ID_BOUND)
            out[s.name] = torch.randint(0, high, s.shape, generator=gen, dtype=dtype)
    return out
