"""The invariants of a ``DataflowProgram``; each failure is a ``VerifyError`` naming the kernel and the PE.

Checked on every program: names and op kinds, values defined before use, sizes and size attrs in
range, a sparse matmul's arrays all named, regions inside the mesh and (pipelined) not overlapping,
colors within the hardware's limit, routes between known kernels within the runs table, and every
consumer of a value listed on a route of that value. With payloads (not for a program parsed from
text) also: the sparse kernels' CSC slices (offsets monotone, indices sorted and in range), each PE's
SRAM, and the routes' runs (straight, on the mesh) and router entries (each hop received by the next
PE on the same color, no two routes on one color at one PE at once, sources in the producer's region,
and each consumer's region reached).

Every size is checked before it sizes an allocation, so a hostile file costs memory in proportion to
its size plus the per-PE arrays of its mesh (``MeshSpec`` bounds the mesh): the runs of one color are
expanded at a time, after their lengths are summed (a color's routes hold at most one entry per PE)::

    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> p = ProgramData(MeshSpec(2, 2), HardwareSpec(), "pipelined", "block")
    >>> p.kernels.append(Kernel("k", "elementwise", Region(1, 1, 2, 1), (), (1,), "float32"))
    >>> verify_program(p)
    Traceback (most recent call last):
    ...
    sparsefx.errors.VerifyError: kernel 'k': region [1,1 2x1] leaves the 2x2 mesh at PE (2, 1)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparsefx.errors import ProgramFormatError, VerifyError

from .cost import EPILOGUES, features_of
from .encoding import PACKED_ROLES, int32_if_fits, is_packed, sparse_arrays
from .memory import pe_bytes
from .mesh import Dir
from .program import MODES, OPS, ArraySpec, Kernel, ProgramData, Region, Route
from .routes import RUN_FIELDS, expand
from .tiles import row_tiles
from .verify_loops import first_clash, route_checks

__all__ = ["verify_program", "MAX_VALUE_ELEMENTS", "MAX_ROWS_IN_FLIGHT", "SPARSE_ROLES"]

MAX_VALUE_ELEMENTS = 2**31
"""Most elements a value (a program input or a kernel's result) may have."""

MAX_ROWS_IN_FLIGHT = 2**24
"""Most rows a kernel may take per block (``attrs["rows_in_flight"]``)."""

SPARSE_ROLES = ("values", "row_idx", "nz_ptr", "col_ptr", "col_ptr_off", "out_lo", "out_hi")
"""The arrays every sparse matmul in CSC form names (``in_lo`` and ``in_hi`` come together or not at all);
one stored packed names ``encoding.PACKED_ROLES`` instead."""

# attrs the SRAM model and the CSC checks read as sizes: name -> (least, most)
_SIZE_ATTRS = {
    "rows_in_flight": (1, MAX_ROWS_IN_FLIGHT),
    "result_rows": (1, MAX_ROWS_IN_FLIGHT),
    "split": (0, 64),
    "in_features": (0, MAX_VALUE_ELEMENTS),
    "out_features": (0, MAX_VALUE_ELEMENTS),
    "row_tiles": (1, 1 << 16),
}
_SLACK = 64  # entries a batch may hold past twice the mesh's PEs before it is refused unexpanded
_GROUP_ENTRIES = 1 << 20  # router entries of a streaming program's steps expanded together, at most
_STRAIGHT = {0: (0, 0), int(Dir.N): (0, -1), int(Dir.E): (1, 0), int(Dir.S): (0, 1), int(Dir.W): (-1, 0)}


def verify_program(p: ProgramData) -> None:
    """Check ``p``; see the module docstring."""
    _check_header(p)
    _check_kernels(p)
    if p.mode == "pipelined":
        _check_overlap(p)
    _check_colors(p)
    _check_route_fields(p)
    _check_consumers(p)
    if not p.has_payloads:
        return
    for k in p.kernels:
        if k.op == "sparse_matmul":
            _check_csc(p, k)
        _check_memory(p, k)
    _check_routes(p)


def _fail(kernel: str, why: str) -> VerifyError:
    return VerifyError(f"kernel {kernel!r}: {why}")


def _check_header(p: ProgramData) -> None:
    if p.mode not in MODES:
        raise VerifyError(f"mode {p.mode!r} is not one of {', '.join(MODES)}")
    names = [s.name for s in p.inputs]
    if len(set(names)) != len(names):
        raise VerifyError(f"program inputs {names} repeat a name")


def _check_kernels(p: ProgramData) -> None:
    defined = {s.name for s in p.inputs}
    for s in p.inputs:
        _check_shape(s.shape, f"program input {s.name!r}")
    for k in p.kernels:
        if k.name in defined:
            raise _fail(
                k.name, "the name is used twice (kernels and inputs name values, so names are unique)"
            )
        if k.op not in OPS:
            raise _fail(k.name, f"op {k.op!r} is not an op kind; kinds are {', '.join(OPS)}")
        for v in k.inputs:
            if v not in defined:
                raise _fail(k.name, f"reads {v!r}, which no input or earlier kernel defines")
        _check_region(p, k.name, k.region)
        _check_shape(k.shape, f"kernel {k.name!r}: its value")
        _check_size_attrs(k)
        for role, array in k.arrays.items():
            if array not in p.specs:
                raise _fail(k.name, f"array {role!r} names {array!r}, which the program does not hold")
        if k.op == "sparse_matmul":
            _check_sparse_roles(k)
            _check_epilogue(k)
        _check_mapping(p, k)
        defined.add(k.name)
    for out in p.outputs:
        if out not in defined:
            raise VerifyError(f"program output {out!r} is not an input or a kernel")


def _check_mapping(p: ProgramData, k: Kernel) -> None:
    """Row tiles fit the region (``tiles.row_tiles``) of a kernel that runs in them; the host gathers
    an embedding's table rows only where weights stream (``layout.weight_bytes``)."""
    if "row_tiles" in k.attrs:
        if k.op in ("sparse_matmul", "constant"):
            raise _fail(k.name, f"a {k.op} kernel does not run in row tiles; drop attrs['row_tiles']")
        try:
            row_tiles(k, features_of(k.shape))
        except ProgramFormatError as e:
            raise VerifyError(str(e)) from None
    gather = k.attrs.get("gather")
    if gather is not None and (gather != "host" or k.op != "embedding" or p.mode != "streaming"):
        raise _fail(
            k.name,
            f"attrs['gather']={gather!r} on a {p.mode} {k.op} kernel; only an embedding of a streaming "
            "program takes gather='host'",
        )


def _check_shape(shape: tuple[int, ...], what: str) -> None:
    """Dims are ints >= 0 and the value has at most ``MAX_VALUE_ELEMENTS`` elements (counting a dim of 0
    as 1, so that no product of its dims, such as its features, is larger)."""
    elements = 1
    for d in shape:
        if type(d) is not int or d < 0:
            raise VerifyError(f"{what} has shape {_short(shape)}; dims are ints >= 0")
        elements *= max(d, 1)
    if elements > MAX_VALUE_ELEMENTS:
        raise VerifyError(
            f"{what} has shape {_short(shape)}; a value has at most {MAX_VALUE_ELEMENTS:,} elements "
            "(a dim of 0 counted as 1)"
        )


def _check_size_attrs(k: Kernel) -> None:
    for name, (least, most) in _SIZE_ATTRS.items():
        if name not in k.attrs:
            continue
        value = k.attrs[name]
        if type(value) is not int or not least <= value <= most:
            raise _fail(k.name, f"attrs[{name!r}] is {_short(value)}; expected an int in [{least}, {most}]")
    if k.op == "sparse_matmul" and "in_lo" not in k.arrays:
        for name in ("in_features", "out_features"):
            if name not in k.attrs:
                raise _fail(k.name, f"attrs has no {name!r}; a sparse matmul records its {name}")


def _check_epilogue(k: Kernel) -> None:
    """A sparse matmul's ``attrs["epilogue"]``, if any: ``{"fn": one of cost.EPILOGUES, "kwargs": {...}}``."""
    e = k.attrs.get("epilogue")
    if e is None:
        return
    ok = isinstance(e, dict) and e.get("fn") in EPILOGUES and isinstance(e.get("kwargs", {}), dict)
    if not ok or set(e) - {"fn", "kwargs"}:
        raise _fail(
            k.name,
            f"attrs['epilogue'] is {_short(e)}; expected {{'fn': one of {sorted(EPILOGUES)}, "
            "'kwargs': {...}}",
        )


def _check_sparse_roles(k: Kernel) -> None:
    if is_packed(k.arrays):
        missing = [role for role in PACKED_ROLES if role not in k.arrays]
        stray = sorted(set(k.arrays) & (set(SPARSE_ROLES) - set(PACKED_ROLES)))
        if missing or stray:
            raise _fail(
                k.name,
                f"a packed sparse matmul names the arrays {', '.join(PACKED_ROLES)} (and a bias) and no "
                f"CSC arrays; {', '.join(missing) or 'none'} missing, {', '.join(stray) or 'none'} stray",
            )
        return
    missing = [role for role in SPARSE_ROLES if role not in k.arrays]
    if ("in_lo" in k.arrays) != ("in_hi" in k.arrays):
        missing.append("in_hi" if "in_lo" in k.arrays else "in_lo")
    if missing:
        raise _fail(
            k.name,
            f"a sparse matmul names the arrays {', '.join(SPARSE_ROLES)} (and in_lo with in_hi); "
            f"{', '.join(missing)} missing",
        )
    if "out_features" not in k.attrs and "bias" in k.arrays:
        raise _fail(k.name, "attrs has no 'out_features'; a sparse matmul with a bias records it")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_region(p: ProgramData, name: str, r: Region) -> None:
    if r.width < 1 or r.height < 1:
        raise _fail(name, f"region {r} is empty")
    if r.x < 0 or r.y < 0:
        raise _fail(name, f"region {r} starts off the {p.mesh} mesh at PE ({r.x}, {r.y})")
    if r.x + r.width > p.mesh.width:
        raise _fail(name, f"region {r} leaves the {p.mesh} mesh at PE ({p.mesh.width}, {r.y})")
    if r.y + r.height > p.mesh.height:
        raise _fail(name, f"region {r} leaves the {p.mesh} mesh at PE ({r.x}, {p.mesh.height})")


def _check_overlap(p: ProgramData) -> None:
    owner = torch.full((p.mesh.height, p.mesh.width), -1, dtype=torch.int32)
    for i, k in enumerate(p.kernels):
        r = k.region
        window = owner[r.y : r.y + r.height, r.x : r.x + r.width]
        taken = (window >= 0).nonzero()
        if len(taken):
            dy, dx = (int(v) for v in taken[0])
            other = p.kernels[int(window[dy, dx])].name
            raise _fail(k.name, f"region {r} overlaps kernel {other!r} at PE ({r.x + dx}, {r.y + dy})")
        window.fill_(i)


def _check_colors(p: ProgramData) -> None:
    limit = p.hardware.colors
    for route in p.routes:
        if not 0 <= route.color < limit:
            where = route.src if route.src != "host" else (route.dsts[0] if route.dsts else route.name)
            raise _fail(
                where,
                f"route {route.name!r} uses color {route.color}; the hardware has {limit} (0-{limit - 1})",
            )
    for k in p.kernels:
        for t in k.tasks:
            if not 0 <= t.color < limit:
                raise _fail(
                    k.name, f"task {t.name!r} uses color {t.color}; the hardware has {limit} (0-{limit - 1})"
                )


def _check_route_fields(p: ProgramData) -> None:
    """Each route runs between known ends, on rows of the runs table, at a step of the program."""
    if not p.routes:
        return
    kernels = {k.name for k in p.kernels}
    values = kernels | {s.name for s in p.inputs}
    spec = p.specs.get("routes.runs", ArraySpec("int32", (0, len(RUN_FIELDS))))  # none: routes without runs
    if (
        spec.dtype not in ("int64", "int32", "int16")
        or len(spec.shape) != 2
        or spec.shape[1] != len(RUN_FIELDS)
    ):
        raise VerifyError(
            f"array 'routes.runs' is {spec.dtype}{list(spec.shape)}; expected an int array of "
            f"[runs, {len(RUN_FIELDS)}] ({', '.join(RUN_FIELDS)})"
        )
    rows = spec.shape[0]
    for r in p.routes:
        owner = _owner(r) if _owner(r) in kernels else r.name
        if r.src != "host" and r.src not in kernels:
            raise _fail(owner, f"route {r.name!r} starts at {r.src!r}, which is not a kernel or the host")
        strays = [d for d in r.dsts if d != "host" and d not in kernels]
        if strays:
            raise _fail(owner, f"route {r.name!r} goes to {strays[0]!r}, which is not a kernel or the host")
        if r.value not in values:
            raise _fail(owner, f"route {r.name!r} carries {r.value!r}, which no input or kernel defines")
        if r.kind not in ("value", "internal"):
            raise _fail(owner, f"route {r.name!r} has kind {r.kind!r}; kinds are value and internal")
        if not (r.first >= 0 and r.count >= 0 and r.first + r.count <= rows):
            raise _fail(
                owner,
                f"route {r.name!r} takes runs[{r.first}:{r.first + r.count}]; 'routes.runs' has rows "
                f"[0:{rows}]",
            )
        if not -1 <= r.step < max(len(p.kernels), 1):
            raise _fail(
                owner,
                f"route {r.name!r} is used at step {r.step}; steps are -1 (always) to {len(p.kernels) - 1}",
            )


def _check_consumers(p: ProgramData) -> None:
    if not p.routes:
        return
    carried: dict[tuple[str, str], Route] = {}
    for route in p.routes:
        for d in route.dsts:
            carried[(route.value, d)] = route
    for k in p.kernels:
        for v in k.inputs:
            if (v, k.name) not in carried:
                raise _fail(k.name, f"no route carries its input {v!r} from {_producer(p, v)!r}")


def _producer(p: ProgramData, value: str) -> str:
    return "host" if any(s.name == value for s in p.inputs) else value


def _check_memory(p: ProgramData, k: Kernel) -> None:
    need = pe_bytes(p, k)
    worst = int(torch.argmax(need))
    if int(need[worst]) > p.hardware.sram_bytes:
        x, y = k.region.coords(worst)
        raise _fail(
            k.name,
            f"PE ({x}, {y}) needs {int(need[worst])} bytes of SRAM; a PE has {p.hardware.sram_bytes}",
        )


def _check_csc(p: ProgramData, k: Kernel) -> None:
    n = k.region.pes
    if is_packed(k.arrays) and len(p.array(k, "pe_nnz")) != n:
        raise _fail(k.name, f"pe_nnz has {len(p.array(k, 'pe_nnz'))} entries; the region has {n} PEs")
    try:
        sparse_arrays(p, k)
    except ProgramFormatError as e:
        raise VerifyError(str(e)) from None  # it names the kernel
    nz_ptr = p.array(k, "nz_ptr").to(torch.int64)
    col_off = p.array(k, "col_ptr_off").to(torch.int64)
    col_ptr = p.array(k, "col_ptr").to(torch.int64)
    row_idx = p.array(k, "row_idx").to(torch.int64)
    out_lo, out_hi = p.array(k, "out_lo").to(torch.int64), p.array(k, "out_hi").to(torch.int64)
    out_span = out_hi - out_lo
    outputs = int(k.attrs.get("out_features", 0))
    if len(out_lo) == n == len(out_hi):
        wrong = ((out_lo < 0) | (out_lo > outputs) | (out_span < 0) | (out_span > outputs)).nonzero()
        if len(wrong):
            pe = int(wrong[0])
            raise _fail(
                k.name,
                f"output range [{int(out_lo[pe])}, {int(out_hi[pe])}) of PE "
                f"{k.region.coords(pe)} is not a range of at most {outputs} of its outputs",
            )
    if "in_lo" in k.arrays:
        lo, hi = p.array(k, "in_lo").to(torch.int64), p.array(k, "in_hi").to(torch.int64)
        features = int(k.attrs.get("in_features", 0))
        bad = (
            ((lo < 0) | (hi < lo) | (hi > features)).nonzero()
            if len(lo) == n == len(hi)
            else torch.zeros(1, 1)
        )
        if len(bad):
            pe = int(bad[0]) if len(lo) == n else 0
            raise _fail(k.name, f"input range of PE {k.region.coords(pe)} is not inside [0, {features}]")
        if not torch.equal(col_off[1:] - col_off[:-1], hi - lo + 1):
            raise _fail(k.name, "col_ptr_off does not give each PE its input range + 1 column offsets")
    if len(nz_ptr) != n + 1 or len(col_off) != n + 1 or len(out_span) != n:
        raise _fail(
            k.name, f"per-PE offset arrays have {len(nz_ptr)}/{len(col_off)} entries; the region has {n} PEs"
        )
    for name, ptr, total in (("nz_ptr", nz_ptr, len(row_idx)), ("col_ptr_off", col_off, len(col_ptr))):
        bad = ((ptr[1:] - ptr[:-1]) < 0).nonzero()
        if len(bad) or int(ptr[0]) != 0 or int(ptr[-1]) != total:
            pe = int(bad[0]) if len(bad) else n - 1
            raise _fail(k.name, f"{name} is not monotone from 0 to {total} at PE {k.region.coords(pe)}")
    nnz = nz_ptr[1:] - nz_ptr[:-1]
    cols = col_off[1:] - col_off[:-1]
    pe_of_col = torch.repeat_interleave(torch.arange(n), cols)
    first = col_off[:-1][pe_of_col]
    local = torch.arange(len(col_ptr)) - first
    last_of_pe = torch.zeros(len(col_ptr), dtype=torch.bool)
    last_of_pe[(col_off[1:] - 1)[cols > 0]] = True
    start_bad = (local == 0) & (col_ptr != 0)
    end_bad = last_of_pe & (col_ptr != nnz[pe_of_col])
    step_bad = torch.zeros_like(start_bad)
    step_bad[1:] = (~last_of_pe[:-1]) & (col_ptr[1:] < col_ptr[:-1])
    bad = (start_bad | end_bad | step_bad).nonzero()
    if len(bad):
        pe = int(pe_of_col[int(bad[0])])
        raise _fail(k.name, f"col_ptr of PE {k.region.coords(pe)} is not monotone from 0 to its nnz")
    pe_of_nz = torch.repeat_interleave(torch.arange(n), nnz)
    out_of_range = ((row_idx < 0) | (row_idx >= out_span[pe_of_nz])).nonzero()
    if len(out_of_range):
        pe = int(pe_of_nz[int(out_of_range[0])])
        raise _fail(
            k.name,
            f"row_idx of PE {k.region.coords(pe)} has {int(row_idx[int(out_of_range[0])])}, "
            f"outside its {int(out_span[pe])} output rows",
        )
    # sorted within each column: global position of each nonzero's column segment
    seg = torch.zeros(len(row_idx), dtype=torch.int64)
    if len(col_ptr):
        starts = nz_ptr[:-1][pe_of_col] + col_ptr  # each col_ptr entry as a global nonzero offset
        marks = torch.zeros(len(row_idx) + 1, dtype=torch.int64)
        marks.index_add_(0, starts.clamp(max=len(row_idx)), torch.ones_like(starts))
        seg = torch.cumsum(marks[:-1], 0)
    same = seg[1:] == seg[:-1]
    unsorted = (same & (row_idx[1:] <= row_idx[:-1])).nonzero()
    if len(unsorted):
        pe = int(pe_of_nz[int(unsorted[0]) + 1])
        raise _fail(k.name, f"row_idx of PE {k.region.coords(pe)} is not strictly increasing within a column")


def _owner(route: Route) -> str:
    return route.dsts[0] if route.src == "host" and route.dsts else route.src


@dataclass(frozen=True)
class _Table:
    """The runs table and, per route, its first run, run count, router entries and whether it ends at
    the host."""

    runs: torch.Tensor
    first: torch.Tensor
    counts: torch.Tensor
    entries: list[int]
    to_host: torch.Tensor


def _check_routes(p: ProgramData) -> None:
    """Router entries of all routes: on the mesh, once per route, hops received, ends right, and no two
    routes on one color at one PE at once. The runs are checked straight and on the mesh first, then
    expanded one color at a time (a streaming program's, one color of consecutive steps at a time, up
    to ``_GROUP_ENTRIES`` entries, with that color's routes of every step), each step summed before it
    is expanded: no PE holds two entries of one color at once, so a step of far more entries than the
    mesh has PEs is refused unexpanded."""
    if not p.routes:
        return
    empty = torch.zeros((0, len(RUN_FIELDS)), dtype=torch.int64)
    runs = p.arrays.get("routes.runs", empty).to(torch.int64)
    counts = torch.tensor([r.count for r in p.routes], dtype=torch.int64)
    first = torch.tensor([r.first for r in p.routes], dtype=torch.int64)  # each route's first run
    entries = _check_runs(p, runs, first, counts)
    table = _Table(runs, first, counts, entries, torch.tensor(["host" in r.dsts for r in p.routes]))
    for color in sorted({r.color for r in p.routes}):
        always, by_step = _batches(p, color)
        _refuse_past_bound(p, always, sum(table.entries[i] for i in always))
        held = _check_batch(p, table, always)
        _check_conflicts(p, held)  # the routes of every step (pipelined: all) among themselves, once
        if not by_step:
            continue
        order = torch.argsort(held[:, 2])  # one color: a PE is the key
        held_pe, held_route = held[order, 2], held[order, 3]
        for steps in _step_groups(p, table, by_step, len(held)):
            batch = _check_batch(p, table, sorted(i for step in steps for i in by_step[step]))
            _check_step_conflicts(p, batch, held_pe, held_route)


def _step_groups(p: ProgramData, table: _Table, by_step: dict[int, list[int]], held: int) -> list[list[int]]:
    """Consecutive steps whose routes are expanded together: each step's entries (with the ``held``
    ones) within the bound ``_check_batch`` refuses past, a group's within ``_GROUP_ENTRIES``."""
    groups: list[list[int]] = []
    size = 0
    for step in sorted(by_step):
        n = sum(table.entries[i] for i in by_step[step])
        _refuse_past_bound(p, by_step[step], n + held)
        if groups and size + n <= _GROUP_ENTRIES:
            groups[-1].append(step)
            size += n
        else:
            groups.append([step])
            size = n
    return groups


def _refuse_past_bound(p: ProgramData, batch: list[int], total: int) -> None:
    """One color's entries at one step hold at most one per PE: far more is refused before they are
    expanded (a little over is expanded, to name the PE that holds two)."""
    if batch and total > 2 * p.mesh.pes + _SLACK:
        r = p.routes[batch[0]]
        raise _fail(
            _owner(r),
            f"the routes on color {r.color} (route {r.name!r} among them) hold {total:,} router entries"
            f"{' at once' if p.mode == 'streaming' else ''}; the {p.mesh} mesh has {p.mesh.pes:,} PEs, "
            "so some PE holds two entries of that color",
        )


def _batches(p: ProgramData, color: int) -> tuple[list[int], dict[int, list[int]]]:
    """The routes on ``color`` in use at every step, and by step the others (streaming only)."""
    always, by_step = [], {}
    for i, r in enumerate(p.routes):
        if r.color != color:
            continue
        if r.step < 0 or p.mode != "streaming":
            always.append(i)
        else:
            by_step.setdefault(r.step, []).append(i)
    return always, by_step


def _check_runs(p: ProgramData, runs: torch.Tensor, first: torch.Tensor, counts: torch.Tensor) -> list[int]:
    """Every run a route takes is straight and on the mesh; returns each route's router entries (the sum
    of its runs' lengths)."""
    width, height = p.mesh.width, p.mesh.height
    d, length = runs[:, 2], runs[:, 3]
    dx, dy = torch.zeros_like(d), torch.zeros_like(d)
    known = torch.zeros_like(d, dtype=torch.bool)
    for bits, (sx, sy) in _STRAIGHT.items():
        at = d == bits
        known |= at
        dx[at], dy[at] = sx, sy
    last = (length - 1).clamp(min=0)
    x1, y1 = runs[:, 0] + dx * last, runs[:, 1] + dy * last
    on = (runs[:, 0] >= 0) & (runs[:, 0] < width) & (runs[:, 1] >= 0) & (runs[:, 1] < height)
    on &= (x1 >= 0) & (x1 < width) & (y1 >= 0) & (y1 < height)
    bad = ~known | (length < 0) | ((d == 0) & (length > 1)) | ((length > 0) & ~on)
    totals = []
    for r, f, n in zip(p.routes, first.tolist(), counts.tolist()):
        wrong = bad[f : f + n].nonzero()
        if len(wrong):
            row = f + int(wrong[0])
            x0, y0, bits, size = (int(v) for v in runs[row, :4])
            going = Dir.format(bits) if bits in _STRAIGHT else str(bits)
            raise _fail(
                _owner(r),
                f"route {r.name!r}: run {row} of 'routes.runs' ({size} PEs from ({x0}, {y0}) going "
                f"{going}): {_run_flaw(bits, size, p)}",
            )
        totals.append(int(length[f : f + n].sum()))
    return totals


def _run_flaw(bits: int, size: int, p: ProgramData) -> str:
    if bits not in _STRAIGHT or (bits == 0 and size > 1):
        return f"direction {bits} is not one of N=1, E=2, S=4, W=8"
    if size < 0:
        return f"length {size} is negative"
    return f"it leaves the {p.mesh} mesh"


def _check_batch(p: ProgramData, table: _Table, batch: list[int]) -> torch.Tensor:
    """The per-route checks of the routes ``batch`` (global indices, ascending, one color), expanded
    (``_refuse_past_bound`` has counted them first); returns their ``(step, color, pe, route)``
    entries."""
    if not batch:
        return torch.zeros((0, 4), dtype=torch.int64)
    routes = torch.tensor(batch, dtype=torch.int64)
    first, n = table.first[routes], table.counts[routes]
    local = torch.repeat_interleave(torch.arange(len(routes)), n)
    rows = first[local] + torch.arange(int(n.sum())) - (torch.cumsum(n, 0) - n)[local]
    runs = table.runs[rows]
    run_route = routes[local]
    pe, rx, tx = expand(runs, p.mesh)
    lengths = runs[:, 3].to(torch.int64).clamp(min=0)
    route = torch.repeat_interleave(run_route, lengths)
    off = (pe < 0).nonzero()
    if len(off):
        r = p.routes[int(route[int(off[0])])]
        raise _fail(_owner(r), f"route {r.name!r} leaves the {p.mesh} mesh")
    pes = p.mesh.pes
    within = torch.repeat_interleave(local, lengths)  # each entry's route, as its place in ``routes``
    # a run's PEs but its last send only to the next PE of the same run, which ``expand`` has receive from
    # it: only run ends can send where no PE receives
    ends = torch.cumsum(lengths, 0)[lengths > 0] - 1
    to_host = table.to_host[routes[within[ends]]]
    checked = route_checks(within, pe, rx, tx, ends, to_host, p.mesh.width, p.mesh.height)
    if checked is None:  # the tensor form: sorted by (route, PE)
        key = int32_if_fits(within * pes + pe, len(routes) * pes)
        order = torch.argsort(key)
        skey = key[order]
        twice = (skey[1:] == skey[:-1]).nonzero()
        _check_twice(p, batch, int(skey[int(twice[0])]) if len(twice) else -1)
        bad = _hop_flags(
            within[ends], pe[ends], tx[ends], rx[order], skey, to_host, p.mesh.width, p.mesh.height
        )
        _report_hop(p, routes, within[ends], pe[ends], bad)
    else:
        _check_twice(p, batch, checked[0])
        _report_hop(p, routes, within[ends], pe[ends], checked[1])
    per = torch.zeros(len(routes), dtype=torch.int64).index_add_(0, local, lengths)  # entries per route
    bounds = torch.cumsum(per, 0)
    ramp = int(Dir.RAMP)
    sources = ((rx & ramp) != 0).nonzero().squeeze(1)  # entries, ascending: each route's in a run
    sinks = ((tx & ramp) != 0).nonzero().squeeze(1)
    source_ends = torch.searchsorted(sources, bounds).tolist()
    sink_ends = torch.searchsorted(sinks, bounds).tolist()
    s0 = k0 = 0
    for i, g in enumerate(routes.tolist()):
        r = p.routes[g]
        s1, k1 = source_ends[i], sink_ends[i]
        _check_ends(p, r, _owner(r), pe[sources[s0:s1]], pe[sinks[k0:k1]])
        s0, k0 = s1, k1
    steps = torch.tensor([p.routes[g].step for g in routes.tolist()], dtype=torch.int64)
    colors = torch.tensor([p.routes[g].color for g in routes.tolist()], dtype=torch.int64)
    at_route = torch.repeat_interleave(torch.arange(len(routes)), per)
    return torch.stack([steps[at_route], colors[at_route], pe, route], 1)


def _check_twice(p: ProgramData, batch: list[int], key: int) -> None:
    """Raise for the route and PE of ``key`` (``place * pes + pe``, its place in ``batch``) when a route
    sets that PE's router twice (-1: none does)."""
    if key < 0:
        return
    pes = p.mesh.pes
    at, r = key % pes, p.routes[batch[key // pes]]
    raise _fail(
        _owner(r),
        f"route {r.name!r} sets the router of PE ({at % p.mesh.width}, {at // p.mesh.width}) twice on "
        f"color {r.color}",
    )


def _hop_flags(
    route: torch.Tensor,
    pe: torch.Tensor,
    tx: torch.Tensor,
    sorted_rx: torch.Tensor,
    sorted_key: torch.Tensor,
    to_host: torch.Tensor,
    width: int,
    height: int,
) -> torch.Tensor:
    """``[4, senders]``: whether each sender's hop N, E, S or W is received by no neighbour's entry of
    its route (off the mesh: unless its route ends at the host, ``to_host``); ``route``: each sender's
    place in its batch, as ``sorted_key`` (``place * pes + pe``, ascending) counts them. The tensor form
    of ``verify_loops.route_checks``."""
    pes = width * height
    x, y = pe % width, pe // width
    bad = torch.zeros((4, len(pe)), dtype=torch.bool)
    for i, d in enumerate(_HOPS):
        sends = (tx & int(d)) != 0
        if not bool(sends.any()):
            continue
        dx, dy = d.step
        nx, ny = x + dx, y + dy
        edge = (nx < 0) | (nx >= width) | (ny < 0) | (ny >= height)
        want = (route * pes + (ny * width + nx).clamp(0, pes - 1)).to(sorted_key.dtype)
        at = torch.searchsorted(sorted_key, want).clamp(max=len(sorted_key) - 1)
        found = (sorted_key[at] == want) & ((sorted_rx[at] & int(d.opposite)) != 0)
        bad[i] = (sends & ~edge & ~found) | (sends & edge & ~to_host)
    return bad


_HOPS = (Dir.N, Dir.E, Dir.S, Dir.W)


def _report_hop(
    p: ProgramData, routes: torch.Tensor, route: torch.Tensor, pe: torch.Tensor, bad: torch.Tensor
) -> None:
    """Raise for the first sender (by direction N, E, S, W, then in order) whose hop ``bad`` marks."""
    width = p.mesh.width
    for i, d in enumerate(_HOPS):
        hit = bad[i].nonzero()
        if len(hit):
            j = int(hit[0])
            r = p.routes[int(routes[route[j]])]
            raise _fail(
                _owner(r),
                f"route {r.name!r} sends {d.name} from PE ({int(pe[j]) % width}, {int(pe[j]) // width}) "
                f"on color {r.color}, but no PE of the route receives it there",
            )


def _check_ends(p: ProgramData, route: Route, owner: str, sources: torch.Tensor, sinks: torch.Tensor) -> None:
    """The route takes data from its producer's region (its first and last source PE) and reaches each
    destination's region; ``sources`` and ``sinks``: its PEs whose router takes from, and gives to, the
    core, in order."""
    width = p.mesh.width
    if route.src != "host":
        region = p.kernel(route.src).region if route.kind == "value" else None
        if region is not None:
            for s in sources[:1].tolist() + sources[-1:].tolist():
                if not region.contains(s % width, s // width):
                    raise _fail(
                        owner,
                        f"route {route.name!r} takes data from the core of PE "
                        f"({s % width}, {s // width}), outside {route.src!r}'s region {region}",
                    )
    sx, sy = sinks % width, sinks // width
    for d in route.dsts:
        if d == "host":
            continue
        r = p.kernel(d).region
        hit = (sx >= r.x) & (sx < r.x + r.width) & (sy >= r.y) & (sy < r.y + r.height)
        if not bool(hit.any()):
            raise _fail(d, f"route {route.name!r} of {route.value!r} never reaches its region {r}")


def _check_conflicts(p: ProgramData, entries: torch.Tensor) -> None:
    """No PE holds two routes on the same color, for entries all in use at once (a pipelined program's,
    or a streaming program's routes of every step); ``_check_step_conflicts`` takes single steps'."""
    _clash(p, entries[:, 1] * p.mesh.pes + entries[:, 2], entries[:, 3])


def _check_step_conflicts(
    p: ProgramData, entries: torch.Tensor, held_pe: torch.Tensor, held_route: torch.Tensor
) -> None:
    """Entries of one color at single steps: no two routes at one PE at the same step, and none at a
    PE where a route of every step is (``held_pe``, ascending, and its ``held_route``)."""
    pes = p.mesh.pes
    _clash(p, entries[:, 0] * pes + entries[:, 2], entries[:, 3])
    if len(held_pe) and len(entries):
        at = torch.searchsorted(held_pe, entries[:, 2]).clamp_(max=len(held_pe) - 1)
        hit = ((held_pe[at] == entries[:, 2]) & (held_route[at] != entries[:, 3])).nonzero()
        if len(hit):
            j = int(hit[0])
            _report_clash(p, int(held_route[at[j]]), int(entries[j, 3]), int(entries[j, 2]))


def _clash(p: ProgramData, key: torch.Tensor, who: torch.Tensor) -> None:
    """Raise if two entries of different routes (``who``) share a ``key`` (its last factor the PE)."""
    found = first_clash(key, who, p.mesh.pes) or _first_clash_sorted(key, who)
    if found[0] >= 0:
        _report_clash(p, found[1], found[2], found[0] % p.mesh.pes)


def _first_clash_sorted(key: torch.Tensor, who: torch.Tensor) -> tuple[int, int, int]:
    """``verify_loops.first_clash`` in tensor form: a stable sort by key, then the first neighbours of
    one key and two routes."""
    order = torch.argsort(int32_if_fits(key, int(key.max()) + 1 if len(key) else 0), stable=True)
    k, w = key[order], who[order]
    clash = ((k[1:] == k[:-1]) & (w[1:] != w[:-1])).nonzero()
    if not len(clash):
        return -1, 0, 0
    j = int(clash[0])
    return int(k[j]), int(w[j]), int(w[j + 1])


def _report_clash(p: ProgramData, first: int, second: int, pe: int) -> None:
    a, b = p.routes[first], p.routes[second]
    owner = a.src if a.src != "host" else a.dsts[0]
    raise _fail(
        owner,
        f"routes {a.name!r} and {b.name!r} both use color {a.color} at PE "
        f"({pe % p.mesh.width}, {pe // p.mesh.width})",
    )
