"""The invariants of a ``DataflowProgram``; each failure is a ``VerifyError`` naming the kernel and the PE.

Checked on every program: names and op kinds, values defined before use, regions inside the mesh
and (pipelined) not overlapping, colors within the hardware's limit, and every consumer of a value
listed on a route of that value. With payloads (not for a program parsed from text) also: each PE's
SRAM, the sparse kernels' CSC slices (offsets monotone, indices sorted and in range), and the
routes' router entries (on the mesh, each hop received by the next PE on the same color, no two
routes on one color at one PE at once, sources in the producer's region, and each consumer's region
reached)::

    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> p = DataflowProgram(MeshSpec(2, 2), HardwareSpec(), "pipelined", "block")
    >>> p.kernels.append(Kernel("k", "elementwise", Region(1, 1, 2, 1), (), (1,), "float32"))
    >>> verify_program(p)
    Traceback (most recent call last):
    ...
    sparsefx.errors.VerifyError: kernel 'k': region [1,1 2x1] leaves the 2x2 mesh at PE (2, 1)
"""

from __future__ import annotations

import torch

from sparsefx.errors import VerifyError

from .memory import pe_bytes
from .mesh import Dir
from .program import MODES, OPS, DataflowProgram, Kernel, Region, Route
from .routes import expand

__all__ = ["verify_program"]


def verify_program(p: DataflowProgram) -> None:
    """Check ``p``; see the module docstring."""
    _check_header(p)
    _check_kernels(p)
    if p.mode == "pipelined":
        _check_overlap(p)
    _check_colors(p)
    _check_consumers(p)
    if not p.has_payloads:
        return
    for k in p.kernels:
        _check_memory(p, k)
        if k.op == "sparse_matmul":
            _check_csc(p, k)
    _check_routes(p)


def _fail(kernel: str, why: str) -> VerifyError:
    return VerifyError(f"kernel {kernel!r}: {why}")


def _check_header(p: DataflowProgram) -> None:
    if p.mode not in MODES:
        raise VerifyError(f"mode {p.mode!r} is not one of {', '.join(MODES)}")
    names = [s.name for s in p.inputs]
    if len(set(names)) != len(names):
        raise VerifyError(f"program inputs {names} repeat a name")


def _check_kernels(p: DataflowProgram) -> None:
    defined = {s.name for s in p.inputs}
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
        for role, array in k.arrays.items():
            if array not in p.specs:
                raise _fail(k.name, f"array {role!r} names {array!r}, which the program does not hold")
        defined.add(k.name)
    for out in p.outputs:
        if out not in defined:
            raise VerifyError(f"program output {out!r} is not an input or a kernel")


def _check_region(p: DataflowProgram, name: str, r: Region) -> None:
    if r.width < 1 or r.height < 1:
        raise _fail(name, f"region {r} is empty")
    if r.x < 0 or r.y < 0:
        raise _fail(name, f"region {r} starts off the {p.mesh} mesh at PE ({r.x}, {r.y})")
    if r.x + r.width > p.mesh.width:
        raise _fail(name, f"region {r} leaves the {p.mesh} mesh at PE ({p.mesh.width}, {r.y})")
    if r.y + r.height > p.mesh.height:
        raise _fail(name, f"region {r} leaves the {p.mesh} mesh at PE ({r.x}, {p.mesh.height})")


def _check_overlap(p: DataflowProgram) -> None:
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


def _check_colors(p: DataflowProgram) -> None:
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


def _check_consumers(p: DataflowProgram) -> None:
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


def _producer(p: DataflowProgram, value: str) -> str:
    return "host" if any(s.name == value for s in p.inputs) else value


def _check_memory(p: DataflowProgram, k: Kernel) -> None:
    need = pe_bytes(p, k)
    worst = int(torch.argmax(need))
    if int(need[worst]) > p.hardware.sram_bytes:
        x, y = k.region.coords(worst)
        raise _fail(
            k.name,
            f"PE ({x}, {y}) needs {int(need[worst])} bytes of SRAM; a PE has {p.hardware.sram_bytes}",
        )


def _check_csc(p: DataflowProgram, k: Kernel) -> None:
    n = k.region.pes
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


def _check_routes(p: DataflowProgram) -> None:
    """Router entries of all routes: on the mesh, once per route, hops received, ends right, and no two
    routes on one color at one PE at once. A streaming program's routes are expanded a step at a time
    (with the routes of every step), so the entries of one step are in memory at once: on ``wse2`` each
    step's routes cover most of the mesh's 754K PEs."""
    if not p.routes:
        return
    counts = torch.tensor([r.count for r in p.routes], dtype=torch.int64)
    first = torch.tensor([r.first for r in p.routes], dtype=torch.int64)  # each route's first run
    steps = torch.tensor([r.step for r in p.routes], dtype=torch.int64)
    if p.mode != "streaming":
        _check_conflicts(p, _check_batch(p, torch.arange(len(p.routes)), first, counts))
        return
    always = _check_batch(p, (steps < 0).nonzero().squeeze(1), first, counts)
    for step in torch.unique(steps[steps >= 0]).tolist():
        entries = _check_batch(p, (steps == step).nonzero().squeeze(1), first, counts)
        _check_conflicts(p, torch.cat([always, entries]))
    if not bool((steps >= 0).any()):
        _check_conflicts(p, always)


def _check_batch(
    p: DataflowProgram, routes: torch.Tensor, first: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """The per-route checks of ``routes`` (global indices, ascending); returns their ``(step, color, pe,
    route)`` entries."""
    if len(routes) == 0:
        return torch.zeros((0, 4), dtype=torch.int64)
    n = counts[routes]
    local = torch.repeat_interleave(torch.arange(len(routes)), n)
    rows = first[routes][local] + torch.arange(int(n.sum())) - (torch.cumsum(n, 0) - n)[local]
    runs = p.arrays["routes.runs"][rows]
    run_route = routes[local]
    pe, rx, tx = expand(runs, p.mesh)
    lengths = runs[:, 3].to(torch.int64).clamp(min=0)
    route = torch.repeat_interleave(run_route, lengths)
    off = (pe < 0).nonzero()
    if len(off):
        r = p.routes[int(route[int(off[0])])]
        raise _fail(_owner(r), f"route {r.name!r} leaves the {p.mesh} mesh")
    pes = p.mesh.pes
    key = route * pes + pe
    order = torch.argsort(key)
    skey = key[order]
    twice = (skey[1:] == skey[:-1]).nonzero()
    if len(twice):
        at, r = int(skey[int(twice[0])]) % pes, p.routes[int(skey[int(twice[0])]) // pes]
        raise _fail(
            _owner(r),
            f"route {r.name!r} sets the router of PE ({at % p.mesh.width}, "
            f"{at // p.mesh.width}) twice on color {r.color}",
        )
    _check_hops(p, route, pe, tx, rx[order], skey)
    per = torch.zeros(len(routes), dtype=torch.int64).index_add_(0, local, lengths)  # entries per route
    bounds = torch.cumsum(per, 0)
    start = 0
    for i, g in enumerate(routes.tolist()):
        end = int(bounds[i])
        r = p.routes[g]
        _check_ends(p, r, _owner(r), pe[start:end], rx[start:end], tx[start:end])
        start = end
    steps = torch.tensor([p.routes[g].step for g in routes.tolist()], dtype=torch.int64)
    colors = torch.tensor([p.routes[g].color for g in routes.tolist()], dtype=torch.int64)
    at_route = torch.repeat_interleave(torch.arange(len(routes)), per)
    return torch.stack([steps[at_route], colors[at_route], pe, route], 1)


def _check_hops(
    p: DataflowProgram,
    route: torch.Tensor,
    pe: torch.Tensor,
    tx: torch.Tensor,
    sorted_rx: torch.Tensor,
    sorted_key: torch.Tensor,
) -> None:
    """Every hop a PE sends is received by the neighbour's entry of the same route (or leaves to the host)."""
    width, height, pes = p.mesh.width, p.mesh.height, p.mesh.pes
    x, y = pe % width, pe // width
    to_host = torch.tensor(["host" in r.dsts for r in p.routes])[route]
    for d in (Dir.N, Dir.E, Dir.S, Dir.W):
        sends = (tx & int(d)) != 0
        if not bool(sends.any()):
            continue
        dx, dy = d.step
        nx, ny = x + dx, y + dy
        edge = (nx < 0) | (nx >= width) | (ny < 0) | (ny >= height)
        want = route * pes + (ny * width + nx).clamp(0, pes - 1)
        at = torch.searchsorted(sorted_key, want).clamp(max=len(sorted_key) - 1)
        found = (sorted_key[at] == want) & ((sorted_rx[at] & int(d.opposite)) != 0)
        bad = (sends & ~edge & ~found) | (sends & edge & ~to_host)
        hit = bad.nonzero()
        if len(hit):
            j = int(hit[0])
            r = p.routes[int(route[j])]
            raise _fail(
                _owner(r),
                f"route {r.name!r} sends {d.name} from PE ({int(x[j])}, {int(y[j])}) "
                f"on color {r.color}, but no PE of the route receives it there",
            )


def _check_ends(
    p: DataflowProgram, route: Route, owner: str, pe: torch.Tensor, rx: torch.Tensor, tx: torch.Tensor
) -> None:
    width = p.mesh.width
    ramp = int(Dir.RAMP)
    sources = pe[(rx & ramp) != 0]
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
    sinks = pe[(tx & ramp) != 0]
    for d in route.dsts:
        if d == "host":
            continue
        r = p.kernel(d).region
        sx, sy = sinks % width, sinks // width
        hit = (sx >= r.x) & (sx < r.x + r.width) & (sy >= r.y) & (sy < r.y + r.height)
        if not bool(hit.any()):
            raise _fail(d, f"route {route.name!r} of {route.value!r} never reaches its region {r}")


def _check_conflicts(p: DataflowProgram, entries: torch.Tensor) -> None:
    """No PE holds two routes on the same color at the same step (step -1 overlaps every step)."""
    if p.mode == "streaming":
        always = entries[entries[:, 0] < 0]
        steps = sorted({int(s) for s in entries[:, 0].tolist() if s >= 0})
        groups = [torch.cat([always, entries[entries[:, 0] == s]]) for s in steps] or [always]
    else:
        groups = [entries]
    for g in groups:
        key = g[:, 1] * p.mesh.pes + g[:, 2]
        order = torch.argsort(key, stable=True)
        k, who = key[order], g[order, 3]
        clash = ((k[1:] == k[:-1]) & (who[1:] != who[:-1])).nonzero()
        if len(clash):
            j = int(clash[0])
            a, b = p.routes[int(who[j])], p.routes[int(who[j + 1])]
            pe = int(k[j]) % p.mesh.pes
            owner = a.src if a.src != "host" else a.dsts[0]
            raise _fail(
                owner,
                f"routes {a.name!r} and {b.name!r} both use color {a.color} at PE "
                f"({pe % p.mesh.width}, {pe // p.mesh.width})",
            )
