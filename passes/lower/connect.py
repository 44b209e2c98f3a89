"""Routes and colors: how each value gets from its producer to its consumers, and on which color.

A value travels in lanes, lane ``r`` along mesh row ``r``. In a pipelined program every route runs
eastward: it takes data from the producer's cores across the producer's columns (a sparse matmul's
running row sums, or rows of an elementwise result), passes other kernels' regions untouched, and
delivers to every core of each consumer's columns (the consumer's input multicast). A program
input enters at the mesh's west edge; a program output leaves at its east edge. In a streaming
program each kernel runs alone from column 0: a value runs westward from its producer's columns to
column 0, and the consumer's own ``input`` route multicasts it east across its region.

Kernels that reduce across lanes (matmuls, norms, softmax, pools, reductions, layout changes: the kinds
``runtime/op_kinds.py`` marks ``moves_across_lanes``, listed in ``REDUCING``) have two internal routes
per column, a southward and a northward bus. Colors come from greedy coloring of the routes' conflict
graph (routes whose rectangles share a PE, at the same step in streaming mode)::

    >>> greedy_colors([(0, 0, 2, 2, -1), (1, 0, 3, 2, -1), (3, 0, 4, 2, -1)])
    [0, 1, 0]
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import torch

from sparsefx.errors import LoweringError
from sparsefx.runtime.mesh import Dir, MeshSpec
from sparsefx.runtime.op_kinds import REDUCING, op_kind
from sparsefx.runtime.program import Kernel, Region, Route, Task
from sparsefx.runtime.routes import run

__all__ = [
    "RouteDraft",
    "value_routes",
    "internal_routes",
    "greedy_colors",
    "assign",
    "tasks_for",
    "REDUCING",
]


@dataclass
class RouteDraft:
    """A route before its color: its runs and the rectangle (and step) it occupies."""

    name: str
    value: str
    src: str
    dsts: tuple[str, ...]
    kind: str
    lanes: int
    runs: list[list[int]]
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive)
    step: int = -1


def _lanes(shape: tuple[int, ...], lanes: int) -> int:
    features = shape[-1] if shape else 1
    return max(1, min(lanes, features))


def value_routes(
    kernels: list[Kernel],
    inputs: dict[str, tuple[int, ...]],
    outputs: list[str],
    mesh: MeshSpec,
    lanes: int,
    mode: str,
) -> list[RouteDraft]:
    """One route per value in a pipelined program; one per (value, consumer) in a streaming one."""
    index = {k.name: i for i, k in enumerate(kernels)}
    consumers: dict[str, list[int]] = {}
    for i, k in enumerate(kernels):
        for v in dict.fromkeys(k.inputs):
            consumers.setdefault(v, []).append(i)
    shapes = dict(inputs) | {k.name: k.shape for k in kernels}
    drafts = []
    for value, shape in shapes.items():
        users = consumers.get(value, [])
        to_host = value in outputs
        if not users and not to_host:
            continue
        n = _lanes(shape, lanes)
        src = kernels[index[value]] if value in index else None
        if mode == "streaming":
            drafts += _streaming(value, src, [kernels[i] for i in users], to_host, index, n, mesh)
        else:
            drafts.append(_pipelined(value, src, [kernels[i] for i in users], to_host, n, mesh))
    return drafts


def _pipelined(
    value: str, src: Kernel | None, users: list[Kernel], to_host: bool, n: int, mesh: MeshSpec
) -> RouteDraft:
    start = src.region.x if src is not None else 0
    inject_end = src.region.x + src.region.width if src is not None else 0
    stops = sorted((u.region.x, u.region.x + u.region.width) for u in users)
    segments, cursor = [], start  # (from, to, tap from): one run per consumer, then on to the host
    for a, b in stops:
        segments.append((cursor, b, a))
        cursor = b
    if to_host or not segments:
        segments.append((cursor, mesh.width if to_host else max(cursor + 1, inject_end), None))
    end = segments[-1][1]
    runs = []
    for r in range(n):
        for i, (a, b, tap) in enumerate(segments):
            last = i == len(segments) - 1
            tx_last = Dir.E if not last or to_host else Dir(0)
            rx_first = (Dir.RAMP if src is not None else Dir.W) if i == 0 else Dir.W
            taps = (tap - a, b - a) if tap is not None else (0, 0)
            injects = (0, min(b, inject_end) - a) if a < inject_end else (0, 0)
            runs.append(
                run(a, r, Dir.E, b - a, rx_first=rx_first, tx_last=tx_last, taps=taps, injects=injects)
            )
    dsts = tuple(u.name for u in users) + (("host",) if to_host else ())
    src_name = src.name if src is not None else "host"
    return RouteDraft(f"{value}.out", value, src_name, dsts, "value", n, runs, (start, 0, end, n))


def _streaming(
    value: str,
    src: Kernel | None,
    users: list[Kernel],
    to_host: bool,
    index: dict[str, int],
    n: int,
    mesh: MeshSpec,
) -> list[RouteDraft]:
    drafts = []
    src_name = src.name if src is not None else "host"
    width = src.region.width if src is not None else 1
    for u in users:
        step = index[u.name]
        if src is None:  # from the host at the west edge, into column 0
            runs = [run(0, r, Dir.E, 1, rx_first=Dir.W, tx_last=Dir.RAMP) for r in range(n)]
            box = (0, 0, 1, n)
        else:
            runs = [
                run(width - 1, r, Dir.W, width, rx_first=Dir.RAMP, tx_last=Dir.RAMP, injects=(0, width))
                for r in range(n)
            ]
            box = (0, 0, width, n)
        drafts.append(
            RouteDraft(f"{value}.to.{u.name}", value, src_name, (u.name,), "value", n, runs, box, step)
        )
    if to_host and src is not None:
        runs = [
            run(0, r, Dir.E, mesh.width, rx_first=Dir.RAMP, tx_last=Dir.E, injects=(0, width))
            for r in range(n)
        ]
        drafts.append(
            RouteDraft(
                f"{value}.to.host",
                value,
                src_name,
                ("host",),
                "value",
                n,
                runs,
                (0, 0, mesh.width, n),
                index[src.name],
            )
        )
    return drafts


def internal_routes(kernels: list[Kernel], mode: str) -> list[RouteDraft]:
    """The buses inside kernels: lane-crossing buses, and the input multicast in streaming mode."""
    drafts = []
    for i, k in enumerate(kernels):
        r: Region = k.region
        step = i if mode == "streaming" else -1
        box = (r.x, r.y, r.x + r.width, r.y + r.height)
        if mode == "streaming" and k.inputs:
            runs = [
                run(r.x, r.y + y, Dir.E, r.width, rx_first=Dir.RAMP, tx_last=Dir.RAMP, taps=(0, r.width))
                for y in range(r.height)
            ]
            drafts.append(
                RouteDraft(
                    f"{k.name}.input", k.name, k.name, (k.name,), "internal", r.height, runs, box, step
                )
            )
        if not op_kind(k.op).moves_across_lanes or r.height < 2:
            continue
        for direction, y0 in ((Dir.S, r.y), (Dir.N, r.y + r.height - 1)):
            runs = [
                run(
                    r.x + x,
                    y0,
                    direction,
                    r.height,
                    rx_first=Dir.RAMP,
                    tx_last=Dir.RAMP,
                    taps=(0, r.height),
                    injects=(0, r.height),
                )
                for x in range(r.width)
            ]
            name = f"{k.name}.bus_{direction.name.lower()}"
            drafts.append(RouteDraft(name, k.name, k.name, (k.name,), "internal", r.width, runs, box, step))
    return drafts


def greedy_colors(boxes: list[tuple[int, int, int, int, int]]) -> list[int]:
    """Colors for rectangles ``(x0, y0, x1, y1, step)``: overlapping ones (same step, or -1) differ."""
    if not boxes:
        return []
    t = torch.tensor(boxes, dtype=torch.int64)
    x0, y0, x1, y1, st = (t[:, i] for i in range(5))
    overlap = (x0[:, None] < x1[None, :]) & (x0[None, :] < x1[:, None])
    overlap &= (y0[:, None] < y1[None, :]) & (y0[None, :] < y1[:, None])
    overlap &= (st[:, None] == st[None, :]) | (st[:, None] < 0) | (st[None, :] < 0)
    overlap.fill_diagonal_(False)
    graph = nx.Graph()
    graph.add_nodes_from(range(len(boxes)))
    graph.add_edges_from(overlap.nonzero().tolist())
    colors = nx.greedy_color(graph, strategy="largest_first")
    return [colors[i] for i in range(len(boxes))]


def assign(drafts: list[RouteDraft], limit: int) -> tuple[list[Route], torch.Tensor]:
    """Color the drafts and pack their runs into one table: ``(routes, runs [n, 10] int32)``."""
    colors = greedy_colors([(*d.box, d.step) for d in drafts])
    if colors and max(colors) >= limit:
        worst = max(range(len(drafts)), key=lambda i: colors[i])
        raise LoweringError(
            f"routes need {max(colors) + 1} colors; the hardware has {limit}. Route {drafts[worst].name!r} "
            f"(columns {drafts[worst].box[0]}-{drafts[worst].box[2] - 1}) overlaps too many others: "
            "use mode='streaming' or a larger mesh"
        )
    routes, rows, first = [], [], 0
    for d, color in zip(drafts, colors):
        routes.append(
            Route(d.name, color, d.value, d.src, d.dsts, d.kind, d.lanes, first, len(d.runs), d.step)
        )
        rows += d.runs
        first += len(d.runs)
    table = torch.tensor(rows, dtype=torch.int32) if rows else torch.zeros((0, 10), dtype=torch.int32)
    return routes, table


def tasks_for(kernel: Kernel, routes: list[Route]) -> tuple[Task, ...]:
    """Tasks bound to the colors that trigger them: inputs arriving, partial sums arriving, emitting."""
    tasks = []
    for r in routes:
        if r.kind == "value" and kernel.name in r.dsts:
            tasks.append(Task(f"recv_{r.value}", r.color, "data"))
        elif r.kind == "internal" and r.src == kernel.name:
            tasks.append(Task(r.name.rsplit(".", 1)[-1], r.color, "data"))
    out = next((r for r in routes if r.kind == "value" and r.src == kernel.name), None)
    if out is not None:
        tasks.append(Task("emit", out.color, "local"))
    return tuple(tasks)
