"""The dataflow program: what runs where on the mesh, and the data each PE holds.

A program (``ProgramData``) is the mesh and hardware it targets, the host's input and output streams, an
ordered list of ``Kernel``s and the ``Route``s between them. Each kernel computes one value (named
like the kernel) on a rectangular ``Region`` of PEs. Its per-PE data lives in flat arrays with
offsets, stored once in ``program.arrays`` (``name -> tensor``) and described by
``program.specs`` (``name -> ArraySpec``); a kernel names its arrays by role in ``kernel.arrays``.
There is no Python object per PE, per nonzero or per route entry.

Values are laid out in lanes: a value of shape ``S`` is viewed as ``[rows, features]`` with
``features = prod(S[split:])``; lane ``r`` of ``L`` carries the features
``[r * features // L, (r + 1) * features // L)`` of every row (``lane_bounds``). A route carries one
value on one color; on a pipelined program, lane ``r`` travels along mesh row ``region.y + r``.

The op kinds are listed in ``OPS`` (their machine rules in ``runtime/op_kinds.py``);
``docs/architecture.md`` describes the sparse matmul's mapping (CSC per PE, 16-bit local row
indices). This module is plain data: it knows nothing of the checks (``runtime/verify.py``), the
text form (``runtime/text.py``) or the file (``runtime/archive.py``). The public
``DataflowProgram`` (``runtime/dataflow.py``, also ``sparsefx.DataflowProgram``) is this data with
``verify()``, ``str()`` and ``save()``; lowering and the loaders build it::

    >>> p = ProgramData(MeshSpec(4, 4), HardwareSpec(), "pipelined", "block")
    >>> p.inputs.append(Stream("x", (2, 8), "float32"))
    >>> p.kernels.append(Kernel("relu", "elementwise", Region(0, 0, 1, 4), ("x",), (2, 8), "float32",
    ...                         attrs={"fn": "relu", "lanes": 4}))
    >>> p.outputs.append("relu"); p.output_tree = {"type": "tensor", "index": 0}
    >>> p.value("relu").shape, p.consumers("x")
    ((2, 8), ['relu'])
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .encoding import sparse_arrays
from .mesh import HardwareSpec, MeshSpec
from .op_kinds import KINDS

__all__ = [
    "OPS",
    "MODES",
    "PLACEMENTS",
    "DTYPES",
    "Region",
    "Stream",
    "ArraySpec",
    "Task",
    "Route",
    "Kernel",
    "ProgramData",
    "lane_bounds",
]

OPS: dict[str, str] = {name: row.description for name, row in KINDS.items()}
"""Op kind -> what a kernel of that kind computes (from ``runtime/op_kinds.py``'s ``KINDS``)."""

MODES = ("pipelined", "streaming")
PLACEMENTS = ("block", "balanced")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
"""dtype names programs use -> torch dtypes."""


def lane_bounds(features: int, lanes: int) -> torch.Tensor:
    """``[lanes + 1]`` offsets: lane ``r`` carries features ``[b[r], b[r + 1])``.

    >>> lane_bounds(10, 4).tolist()
    [0, 2, 5, 7, 10]
    """
    return torch.arange(lanes + 1, dtype=torch.int64) * features // lanes


@dataclass(frozen=True)
class Region:
    """A rectangle of PEs: columns ``[x, x + width)``, rows ``[y, y + height)``."""

    x: int
    y: int
    width: int
    height: int

    @property
    def pes(self) -> int:
        """How many PEs the region has."""
        return self.width * self.height

    def contains(self, x: int, y: int) -> bool:
        """Whether PE ``(x, y)`` is in the region."""
        return self.x <= x < self.x + self.width and self.y <= y < self.y + self.height

    def coords(self, local: int) -> tuple[int, int]:
        """Mesh ``(x, y)`` of the region's ``local``-th PE (row-major inside the region)."""
        return self.x + local % self.width, self.y + local // self.width

    def __str__(self) -> str:
        return f"[{self.x},{self.y} {self.width}x{self.height}]"


@dataclass(frozen=True)
class Stream:
    """A host input: its name (the model's argument), shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ArraySpec:
    """The dtype and shape of one flat per-PE data array."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the array's payload."""
        return math.prod(self.shape) * torch.empty((), dtype=DTYPES[self.dtype]).element_size()


@dataclass(frozen=True)
class Task:
    """A task a kernel's PEs run: on data arriving on ``color`` (``trigger="data"``) or when activated."""

    name: str
    color: int
    trigger: str = "data"


@dataclass(frozen=True)
class Route:
    """One value on one color, from its producer to its consumers.

    ``src`` is the producing kernel (or ``"host"`` for a program input), ``dsts`` the kernels it feeds
    (``"host"`` for a program output), ``kind`` ``"value"`` (between kernels) or ``"internal"`` (inside
    one kernel, such as a matmul's partial-sum reduction). ``step`` is the kernel index during which
    the route is in use in streaming mode (-1: always, as in pipelined mode). The router entries are
    the rows ``[first, first + count)`` of ``program.arrays["routes.runs"]`` (``runtime/routes.py``).
    """

    name: str
    color: int
    value: str
    src: str
    dsts: tuple[str, ...]
    kind: str = "value"
    lanes: int = 1
    first: int = 0
    count: int = 0
    step: int = -1


@dataclass
class Kernel:
    """One op on one region: computes the value ``name`` from ``inputs`` (value names).

    ``attrs`` hold the op's parameters (plain JSON data: ``fn``, ``dims``, ``eps``, ``lanes`` ...),
    ``arrays`` its per-PE data by role (``{"values": "k3.values", ...}``), ``stats`` what lowering
    measured (``nnz``, ``flops``, ``sram_max``, ``imbalance`` ...), ``source`` the graph node it came from.
    """

    name: str
    op: str
    region: Region
    inputs: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    attrs: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, str] = field(default_factory=dict)
    tasks: tuple[Task, ...] = ()
    stats: dict[str, Any] = field(default_factory=dict)
    source: str = ""


@dataclass
class ProgramData:
    """A lowered model's data; see the module docstring. ``DataflowProgram`` adds verify, print and save."""

    mesh: MeshSpec
    hardware: HardwareSpec
    mode: str
    placement: str
    inputs: list[Stream] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    output_tree: Any = None
    kernels: list[Kernel] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    specs: dict[str, ArraySpec] = field(default_factory=dict)
    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    output_spec: Any = field(default=None, repr=False, compare=False)
    """The model's own ``pytree`` output spec, set by lowering and never saved: in the process that lowered
    the program it rebuilds output classes a file cannot name safely (``runtime/outputs.py``)."""

    # -- building -------------------------------------------------------------------------------
    def add_array(self, name: str, tensor: torch.Tensor) -> str:
        """Store a flat payload array under ``name`` (contiguous, on the CPU) and return the name."""
        tensor = tensor.detach().to("cpu").contiguous()
        dtype = next((k for k, v in DTYPES.items() if v == tensor.dtype), None)
        if dtype is None:
            raise TypeError(f"array {name!r} has dtype {tensor.dtype}, which programs do not store")
        self.arrays[name] = tensor
        self.specs[name] = ArraySpec(dtype, tuple(tensor.shape))
        return name

    # -- reading --------------------------------------------------------------------------------
    @property
    def has_payloads(self) -> bool:
        """Whether every array's data is present (False for a program parsed from text)."""
        return all(name in self.arrays for name in self.specs)

    def kernel(self, name: str) -> Kernel:
        """The kernel that computes ``name``."""
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)

    def value(self, name: str) -> Stream:
        """Name, shape and dtype of a value: a program input or a kernel's result."""
        for s in self.inputs:
            if s.name == name:
                return s
        k = self.kernel(name)
        return Stream(k.name, k.shape, k.dtype)

    def consumers(self, name: str) -> list[str]:
        """Kernels that read value ``name``, in program order."""
        return [k.name for k in self.kernels if name in k.inputs]

    def routes_of(self, kernel: str) -> Iterator[Route]:
        """Routes that start or end at ``kernel``."""
        return (r for r in self.routes if r.src == kernel or kernel in r.dsts)

    def array(self, kernel: Kernel, role: str) -> torch.Tensor:
        """The payload of ``kernel``'s array ``role``; for a sparse matmul stored packed, a CSC role
        (``row_idx``, ``col_ptr`` ...) comes decoded (``encoding.sparse_arrays``)."""
        if role not in kernel.arrays and "index" in kernel.arrays:
            return sparse_arrays(self, kernel)[role]
        return self.arrays[kernel.arrays[role]]

    def runs(self, route: Route) -> torch.Tensor:
        """The runs table rows of ``route``."""
        return self.arrays["routes.runs"][route.first : route.first + route.count]

    @property
    def colors_used(self) -> int:
        """How many distinct colors the routes and tasks use."""
        colors = {r.color for r in self.routes} | {t.color for k in self.kernels for t in k.tasks}
        return len(colors)
