"""The target machine: a 2-D mesh of PEs (``MeshSpec``) and what each part costs (``HardwareSpec``).

PE ``(x, y)`` sits in column ``x`` (counted eastward from 0) and row ``y`` (counted southward from 0);
its linear index is ``y * width + x``. Each PE has a router with five ports: the four neighbours and
the ramp to its own core. Directions are bit flags, so a router entry's receive and transmit sets are
small integers::

    >>> mesh = MeshSpec(4, 3)
    >>> mesh.pe_index(1, 2), mesh.coords(9)
    (9, (1, 2))
    >>> int(Dir.E | Dir.RAMP), Dir.parse("E|RAMP") == Dir.E | Dir.RAMP
    (18, True)
    >>> hw = hardware("wse2")
    >>> hw.sram_bytes, hw.colors, hw.simd("float16"), hw.cycles_to_seconds(850)
    (49152, 24, 4, 1e-06)

A mesh has at most ``MAX_MESH_PES`` PEs, those of the largest preset (``wse3``, 762x1172), unless the
environment variable ``SPARSEFX_MAX_MESH_PES`` raises the limit: a program's per-PE arrays and the
verifier's grids grow with the mesh, so a mistyped or hostile size is refused by name before anything
is allocated::

    >>> MeshSpec(30000, 30000)
    Traceback (most recent call last):
    ...
    sparsefx.errors.LoweringError: mesh 30000x30000 has 900,000,000 PEs; sparsefx takes at most 893,064, ...

The ``HardwareSpec`` defaults are the cost model's inputs. Each one says where it comes from, or
that it is an assumption; override any of them with ``dataclasses.replace`` or keyword arguments.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass, field
from typing import Any

from sparsefx.errors import LoweringError

__all__ = [
    "Dir",
    "MeshSpec",
    "HardwareSpec",
    "PRESETS",
    "hardware",
    "mesh_spec",
    "xy_path",
    "DIRS",
    "MAX_MESH_PES",
    "MAX_MESH_PES_ENV",
    "MAX_COLORS",
    "max_mesh_pes",
]

MAX_MESH_PES = 762 * 1172
"""The most PEs a mesh may have by default: the largest preset's (``wse3``)."""

MAX_COLORS = 2**16
"""Most routable colors a ``HardwareSpec`` may have (WSE-2 and WSE-3 have 24)."""

MAX_MESH_PES_ENV = "SPARSEFX_MAX_MESH_PES"
"""The environment variable that raises the limit (a positive int; a value below ``MAX_MESH_PES`` does
not lower it)."""


def max_mesh_pes() -> int:
    """The most PEs a mesh may have: ``MAX_MESH_PES``, or ``$SPARSEFX_MAX_MESH_PES`` where that is more."""
    text = os.environ.get(MAX_MESH_PES_ENV, "").strip()
    if not text:
        return MAX_MESH_PES
    if not text.isdigit() or len(text) > 18 or int(text) < 1:
        raise LoweringError(f"{MAX_MESH_PES_ENV}={text[:40]!r} is not valid; it must be a positive integer")
    return max(int(text), MAX_MESH_PES)


def _check_mesh_size(width: int, height: int) -> None:
    """A mesh of more PEs than ``max_mesh_pes()`` is a ``LoweringError`` (the environment is read only
    for a mesh larger than every preset)."""
    pes = width * height
    if pes <= MAX_MESH_PES:
        return
    limit = max_mesh_pes()
    if pes <= limit:
        return
    source = (
        f"{MAX_MESH_PES_ENV} allows"
        if limit > MAX_MESH_PES
        else f"the largest preset, wse3 (762x1172), has; set the environment variable {MAX_MESH_PES_ENV} "
        "to a larger count to allow more"
    )
    raise LoweringError(
        f"mesh {width}x{height} has {pes:,} PEs; sparsefx takes at most {limit:,}, as {source}"
    )


class Dir(enum.IntFlag):
    """Router ports. ``N`` is toward row 0, ``W`` toward column 0; ``RAMP`` is the PE's own core."""

    N = 1
    E = 2
    S = 4
    W = 8
    RAMP = 16

    @property
    def opposite(self) -> Dir:
        """The port a wavelet sent out of this one arrives on at the neighbour: ``E`` -> ``W``."""
        return _OPPOSITE[self]

    @property
    def step(self) -> tuple[int, int]:
        """``(dx, dy)`` of one hop out of this port."""
        return _STEP[self]

    @staticmethod
    def parse(text: str) -> Dir:
        """``"E|RAMP"`` -> ``Dir.E | Dir.RAMP``; ``"-"`` -> no port."""
        out = Dir(0)
        if text == "-":
            return out
        for part in text.split("|"):
            try:
                out |= Dir[part]
            except KeyError:
                raise ValueError(f"{part!r} is not a port; ports are N, E, S, W and RAMP") from None
        return out

    @staticmethod
    def format(bits: int) -> str:
        """The inverse of ``parse``: ``18`` -> ``"E|RAMP"``; ``0`` -> ``"-"``."""
        names = [d.name for d in DIRS if bits & d]
        return "|".join(names) if names else "-"


DIRS: tuple[Dir, ...] = (Dir.N, Dir.E, Dir.S, Dir.W, Dir.RAMP)
_OPPOSITE = {Dir.N: Dir.S, Dir.S: Dir.N, Dir.E: Dir.W, Dir.W: Dir.E, Dir.RAMP: Dir.RAMP}
_STEP = {Dir.N: (0, -1), Dir.S: (0, 1), Dir.E: (1, 0), Dir.W: (-1, 0), Dir.RAMP: (0, 0)}


@dataclass(frozen=True)
class MeshSpec:
    """A ``width`` x ``height`` rectangle of PEs (columns x rows)."""

    width: int
    height: int

    def __post_init__(self) -> None:
        for name in ("width", "height"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LoweringError(f"mesh {name} {value!r} is not valid; it must be a positive integer")
        _check_mesh_size(self.width, self.height)

    @property
    def pes(self) -> int:
        """How many PEs the mesh has."""
        return self.width * self.height

    def pe_index(self, x: int, y: int) -> int:
        """Linear index of PE ``(x, y)``: ``y * width + x``."""
        return y * self.width + x

    def coords(self, index: int) -> tuple[int, int]:
        """``(x, y)`` of linear index ``index``."""
        return index % self.width, index // self.width

    def contains(self, x: int, y: int) -> bool:
        """Whether ``(x, y)`` is on the mesh."""
        return 0 <= x < self.width and 0 <= y < self.height

    def graph(self) -> Any:
        """The mesh as a ``networkx`` grid graph on ``(x, y)`` nodes (for analyses and pictures)."""
        import networkx as nx

        return nx.grid_2d_graph(self.width, self.height)

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"


def _default_simd() -> dict[str, int]:
    # fp16: REFERENCE §4, "FP16 SIMD is 4 wide on WSE-2". fp32: assumption, half the fp16 width
    # (the published figures give fp16 only).
    return {"float16": 4, "bfloat16": 4, "float32": 2}


@dataclass(frozen=True)
class HardwareSpec:
    """What a PE, a link and the mesh edge can do; the emulator's cost model reads only these.

    Defaults model WSE-2. Each field's comment gives its source or says it is an assumption.
    """

    name: str = "wse2"
    # Per-PE SRAM: 48 KB (Cerebras WSE-2 and WSE-3 datasheets; REFERENCE §4).
    sram_bytes: int = 48 * 1024
    # One 32-bit wavelet per link per direction per cycle (REFERENCE §4: a wavelet moves to a neighbour
    # in one cycle).
    wavelet_bits: int = 32
    link_wavelets_per_cycle: int = 1
    # 24 routable colors share each link (Cerebras SDK documentation; REFERENCE §4).
    colors: int = 24
    # The SDK converts cycles to time at 850 MHz (REFERENCE §4).
    clock_hz: float = 850e6
    # SIMD lanes per dtype; see _default_simd for the source of each.
    simd_widths: dict[str, int] = field(default_factory=_default_simd)
    # Cycles to start a task, paid once per task: pick it, read its trigger wavelet, set up its
    # vector descriptors (REFERENCE §4: a task runs when data arrives on its color). Assumption: the
    # figure is not published; 8 cycles is the order of a few pipeline stages.
    task_start_cycles: int = 8
    # Cycles to start one vector operation inside a running task (issue it, fill the SIMD pipeline
    # before the first result): each AXPY of a sparse matmul's task (REFERENCE §4: one AXPY per
    # nonzero), each SIMD operation of another kernel's task and each partial-sum add pays it once,
    # on top of ``ceil(rows / simd)``. Assumption: not published; 2 cycles, a short pipeline fill.
    vector_start_cycles: int = 2
    # Cycles per router hop. Source: REFERENCE §4 (a wavelet reaches a neighbour in one cycle).
    hop_cycles: int = 1
    # Host I/O at the mesh edge, bytes per second. Source: CS-2 system I/O, 12 x 100 GbE = 1.2 Tb/s.
    host_bytes_per_s: float = 150e9
    # Off-mesh weight memory to the mesh in weight-streaming mode, bytes per second.
    # Assumption: the same 1.2 Tb/s as host I/O (weights enter through the same edge).
    weight_bytes_per_s: float = 150e9
    # Bytes a PE's SRAM reads and writes per cycle, together. Derived: the WSE-2's published memory
    # bandwidth, 20 PB/s, over its 850,000 cores at 850 MHz (about 27.7 bytes a cycle). Assumption:
    # reads and writes share it, and a vector operation moves its operands through it
    # (``cost.vector_cycles``: an AXPY reads y and x and writes y).
    sram_bytes_per_cycle: float = 20e15 / 850_000 / 850e6

    def __post_init__(self) -> None:
        positive = ("sram_bytes", "wavelet_bits", "link_wavelets_per_cycle", "colors", "clock_hz")
        for name in positive + ("host_bytes_per_s", "weight_bytes_per_s", "sram_bytes_per_cycle"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise LoweringError(f"hardware {name} {value!r} is not valid; it must be a positive number")
        for name in ("task_start_cycles", "vector_start_cycles", "hop_cycles"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise LoweringError(f"hardware {name} {value!r} is not valid; it must be an integer >= 0")
        colors, bits = self.colors, self.wavelet_bits
        if not isinstance(colors, int) or colors > MAX_COLORS:
            raise LoweringError(f"hardware colors {colors!r} is not valid; it must be an int 1-{MAX_COLORS}")
        if not isinstance(bits, int) or bits % 8:
            raise LoweringError(f"hardware wavelet_bits {bits!r} is not valid; it must be a multiple of 8")
        for dtype, width in self.simd_widths.items():
            if not isinstance(width, int) or isinstance(width, bool) or width < 1:
                raise LoweringError(f"hardware simd width of {dtype} {width!r} is not valid; use an int >= 1")

    def simd(self, dtype: str) -> int:
        """SIMD lanes for ``dtype`` (``"float32"``, ``"float16"`` ...)."""
        try:
            return self.simd_widths[dtype]
        except KeyError:
            known = ", ".join(sorted(self.simd_widths))
            raise LoweringError(
                f"hardware {self.name!r} has no SIMD width for {dtype}; it knows {known}"
            ) from None

    def cycles_to_seconds(self, cycles: float) -> float:
        """Time of ``cycles`` at the clock."""
        return cycles / self.clock_hz

    @property
    def wavelet_bytes(self) -> int:
        """Bytes one wavelet carries."""
        return self.wavelet_bits // 8

    @property
    def host_wavelets_per_cycle(self) -> float:
        """Host I/O at the mesh edge in wavelets per cycle."""
        return self.host_bytes_per_s / self.clock_hz / self.wavelet_bytes

    @property
    def weight_wavelets_per_cycle(self) -> float:
        """Off-mesh weight bandwidth in wavelets per cycle (weight-streaming mode)."""
        return self.weight_bytes_per_s / self.clock_hz / self.wavelet_bytes

    def to_json(self) -> dict[str, Any]:
        """Plain data for manifests and the text form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HardwareSpec:
        """The inverse of ``to_json``; unknown keys are an error naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LoweringError(
                f"hardware has no field {unknown[0]!r}; fields are {', '.join(sorted(known))}"
            )
        return cls(**data)


_WSE3_SIMD = {
    "float16": 8,
    "bfloat16": 8,
    "float32": 4,
}  # fp16: REFERENCE §4 (8 wide); fp32: assumption, half

PRESETS: dict[str, tuple[MeshSpec, HardwareSpec]] = {
    # The SDK's WSE-2 fabric (REFERENCE §4).
    "wse2": (MeshSpec(757, 996), HardwareSpec()),
    # CS-3 (REFERENCE §4); its SRAM: 21 PB/s over 900,000 cores (WSE-3 datasheet), at the same clock.
    "wse3": (
        MeshSpec(762, 1172),
        HardwareSpec(name="wse3", simd_widths=_WSE3_SIMD, sram_bytes_per_cycle=21e15 / 900_000 / 850e6),
    ),
    # Small meshes of WSE-2 PEs, for tests and the reference executor.
    "tiny": (MeshSpec(4, 4), HardwareSpec(name="tiny")),
    "small": (MeshSpec(16, 16), HardwareSpec(name="small")),
    "medium": (MeshSpec(64, 64), HardwareSpec(name="medium")),
}


def hardware(spec: HardwareSpec | str | None = None) -> HardwareSpec:
    """A ``HardwareSpec`` from a spec, a preset name, or None (WSE-2)."""
    if spec is None:
        return HardwareSpec()
    if isinstance(spec, HardwareSpec):
        return spec
    if isinstance(spec, str) and spec in PRESETS:
        return PRESETS[spec][1]
    raise LoweringError(
        f"hardware {spec!r} is not a HardwareSpec or a preset; presets are {', '.join(PRESETS)}"
    )


def mesh_spec(spec: MeshSpec | tuple[int, int] | str) -> MeshSpec:
    """A ``MeshSpec`` from a spec, ``(width, height)``, ``"64x64"`` or a preset name."""
    if isinstance(spec, MeshSpec):
        return spec
    if isinstance(spec, str):
        if spec in PRESETS:
            return PRESETS[spec][0]
        parts = spec.lower().split("x")
        if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
            return MeshSpec(int(parts[0]), int(parts[1]))
        raise LoweringError(
            f"mesh {spec!r} is not WIDTHxHEIGHT (like 64x64) or a preset; presets are {', '.join(PRESETS)}"
        )
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        return MeshSpec(*spec)
    raise LoweringError(
        f"mesh {spec!r} is not valid; give (width, height), 'WxH', a MeshSpec or a preset name"
    )


def xy_path(src: tuple[int, int], dst: tuple[int, int]) -> list[tuple[int, int]]:
    """Dimension-ordered route from ``src`` to ``dst``: along the row first, then along the column.

    >>> xy_path((0, 0), (2, 1))
    [(0, 0), (1, 0), (2, 0), (2, 1)]
    """
    (x0, y0), (x1, y1) = src, dst
    sx = 1 if x1 >= x0 else -1
    sy = 1 if y1 >= y0 else -1
    path = [(x, y0) for x in range(x0, x1 + sx, sx)]
    path += [(x1, y) for y in range(y0 + sy, y1 + sy, sy)]
    return path
