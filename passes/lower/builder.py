"""What lowering rules build: kernels before placement (``Pending``), and the ``Builder`` that makes them.

A rule sees a node's arguments with every data value replaced by a ``Ref`` (the name of the kernel,
or program input, that computes it) and everything else as the concrete Python value or tensor.
It calls ``Builder.emit`` to add kernels and returns what the node evaluates to: a ``Ref``, a
constant, or a tuple or list of those::

    >>> b = Builder()
    >>> x = b.input("x", torch.ones(2, 3))
    >>> y = b.emit("relu", "elementwise", [x], torch.ones(2, 3), {"fn": "relu"}, source="relu")
    >>> y, b.pending[0].op, b.pending[0].shape
    (Ref('relu'), 'elementwise', (2, 3))
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from sparsefx.errors import LoweringError
from sparsefx.runtime.program import DTYPES, Stream

__all__ = ["Ref", "Pending", "SparseWeight", "Builder", "dtype_name"]


@dataclass(frozen=True)
class Ref:
    """A data value of the program: a host input or the result of the kernel of that name."""

    name: str

    def __repr__(self) -> str:
        return f"Ref({self.name!r})"


@dataclass
class SparseWeight:
    """A matmul's weight as ``[out, in]`` with its bool mask, bias and how the op reads them."""

    weight: torch.Tensor
    mask: torch.Tensor
    bias: torch.Tensor | None
    param: str = ""  # the parameter's name in the model, when it is one

    @functools.cached_property
    def nnz(self) -> int:
        """The mask's kept entries, counted once (a copy with another mask counts its own)."""
        return int(torch.count_nonzero(self.mask))


@dataclass
class Pending:
    """A kernel before it has a region: op, operands, result, parameters and payloads."""

    name: str
    op: str
    inputs: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    attrs: dict[str, Any]
    payload: dict[str, torch.Tensor] = field(default_factory=dict)
    sparse: SparseWeight | None = None
    source: str = ""
    flops: int = 0
    node: str = ""  # the graph node it was lowered from


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``; a dtype programs cannot hold is a ``LoweringError``."""
    for name, dt in DTYPES.items():
        if dt == dtype:
            return name
    raise LoweringError(f"dtype {dtype} cannot be lowered; programs hold {', '.join(DTYPES)}")


class Builder:
    """Collects the program's inputs and pending kernels in order, with unique names."""

    def __init__(self) -> None:
        self.inputs: list[Stream] = []
        self.pending: list[Pending] = []
        self.values: dict[str, tuple[tuple[int, ...], str]] = {}
        self._consts: dict[int, tuple[torch.Tensor, Ref]] = {}
        self.source = ""
        self.node = ""

    def input(self, name: str, value: torch.Tensor) -> Ref:
        """Declare a host input stream."""
        stream = Stream(name, tuple(value.shape), dtype_name(value.dtype))
        self.inputs.append(stream)
        self.values[name] = (stream.shape, stream.dtype)
        return Ref(name)

    def unique(self, name: str) -> str:
        """``name``, or ``name_1``, ``name_2`` ... if it is taken."""
        base, i = name, 0
        while name in self.values:
            i += 1
            name = f"{base}_{i}"
        return name

    def emit(
        self,
        name: str,
        op: str,
        inputs: list[Ref],
        out: torch.Tensor,
        attrs: dict[str, Any],
        *,
        payload: dict[str, torch.Tensor] | None = None,
        sparse: SparseWeight | None = None,
        source: str | None = None,
        flops: int = 0,
    ) -> Ref:
        """Add a kernel computing ``out``'s shape and dtype from ``inputs``; return its ``Ref``."""
        if not isinstance(out, torch.Tensor):
            raise LoweringError(
                f"{source or self.source}: {op} does not produce a tensor ({type(out).__name__})"
            )
        name = self.unique(name)
        shape, dtype = tuple(out.shape), dtype_name(out.dtype)
        for r in inputs:
            if r.name not in self.values:
                raise LoweringError(f"{source or self.source}: reads {r.name!r}, which is not computed yet")
        self.pending.append(
            Pending(
                name,
                op,
                tuple(r.name for r in inputs),
                shape,
                dtype,
                attrs,
                dict(payload or {}),
                sparse,
                source if source is not None else self.source,
                flops,
                self.node,
            )
        )
        self.values[name] = (shape, dtype)
        return Ref(name)

    def const(self, tensor: torch.Tensor, name: str = "const") -> Ref:
        """A ``constant`` kernel holding ``tensor`` (one per tensor object)."""
        key = id(tensor)
        if key in self._consts:
            return self._consts[key][1]
        ref = self.emit(name, "constant", [], tensor, {}, payload={"value": tensor.detach().clone()})
        self._consts[key] = (tensor, ref)  # the tensor is held so that its id is not reused
        return ref

    def shape(self, ref: Ref) -> tuple[int, ...]:
        """Shape of a value."""
        return self.values[ref.name][0]
