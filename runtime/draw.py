"""Pictures of a program: a Graphviz DOT of kernels and routes, and a mesh picture with a per-PE heatmap.

``program_graph`` is a ``networkx.MultiDiGraph`` (one node per kernel and host end, one edge per
route leg with its color), ``write_dot`` writes it as DOT, and ``draw_mesh`` draws kernel regions,
every one named, over a per-PE nnz or SRAM heatmap with matplotlib (the ``plot`` extra)::

    >>> import sparsefx
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 4)), 0.5, torch.ones(2, 8))
    >>> g = program_graph(sparsefx.lower(sm, torch.ones(2, 8), mesh=(4, 4)))
    >>> sorted(g.nodes), g.number_of_edges()
    (['host:in', 'host:out', 'masked_linear'], 2)
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from sparsefx.atomic import atomic_write
from sparsefx.errors import ProgramWriteError

from .csc import pe_nnz
from .memory import pe_bytes
from .program import ProgramData

__all__ = ["program_graph", "write_dot", "pe_grid", "draw_mesh", "draw_grid", "mesh_figure"]


def program_graph(program: ProgramData) -> Any:
    """Kernels and host ends as nodes; each value route's (producer, consumer) leg as an edge."""
    import networkx as nx

    g = nx.MultiDiGraph()
    g.add_node("host:in", label="host inputs")
    g.add_node("host:out", label="host outputs")
    for k in program.kernels:
        r = k.region
        nnz = f"\\nnnz {k.stats['nnz']:,}" if "nnz" in k.stats else ""
        g.add_node(k.name, label=f"{k.name}\\n{k.op} {r.width}x{r.height} @ {r.x},{r.y}{nnz}")
    for route in program.routes:
        if route.kind != "value":
            continue
        src = "host:in" if route.src == "host" else route.src
        for dst in route.dsts:
            g.add_edge(src, "host:out" if dst == "host" else dst, label=f"{route.value} c{route.color}")
    return g


def _quote(text: str) -> str:
    return json.dumps(text).replace("\\\\n", "\\n")


def write_dot(program: ProgramData, path: str | os.PathLike[str]) -> None:
    """Write ``program_graph`` as a Graphviz DOT file (render with ``dot -Tsvg``)."""
    g = program_graph(program)
    lines = ["digraph program {", "  rankdir=LR;", "  node [shape=box, fontname=monospace];"]
    for node, data in g.nodes(data=True):
        lines.append(f"  {_quote(node)} [label={_quote(data['label'])}];")
    for a, b, data in g.edges(data=True):
        lines.append(f"  {_quote(a)} -> {_quote(b)} [label={_quote(data['label'])}];")
    lines.append("}")
    text = ("\n".join(lines) + "\n").encode()
    atomic_write(Path(path), lambda file: file.write(text), ProgramWriteError, "DOT file")


def pe_grid(program: ProgramData, what: str = "nnz") -> torch.Tensor:
    """``[height, width]`` per-PE values: ``"nnz"`` (nonzeros held) or ``"sram"`` (bytes needed).

    In streaming mode kernels share PEs one at a time, so a PE shows its largest value over kernels.
    """
    if what not in ("nnz", "sram"):
        raise ValueError(f"what={what!r}: use 'nnz' or 'sram'")
    grid = torch.zeros(program.mesh.height, program.mesh.width, dtype=torch.int64)
    for k in program.kernels:
        r = k.region
        if what == "nnz":
            if k.op != "sparse_matmul":
                continue
            values = pe_nnz(program.array(k, "nz_ptr"))
        else:
            values = pe_bytes(program, k)
        window = grid[r.y : r.y + r.height, r.x : r.x + r.width]
        torch.maximum(window, values.view(r.height, r.width), out=window)
    return grid


def draw_mesh(program: ProgramData, path: str | os.PathLike[str], what: str = "nnz") -> None:
    """A PNG of the mesh: the per-PE heatmap with each kernel's region outlined and named."""
    label = "nonzeros per PE" if what == "nnz" else "SRAM bytes per PE"
    title = (
        f"{len(program.kernels)} kernels on a {program.mesh} mesh, {program.mode}, {program.placement}"
        f" placement: {'nonzeros' if what == 'nnz' else 'SRAM'} per PE"
    )
    draw_grid(program, pe_grid(program, what), path, label, title)


def draw_grid(
    program: ProgramData,
    grid: torch.Tensor,
    path: str | os.PathLike[str],
    label: str,
    title: str,
    notes: Mapping[str, str] | None = None,
) -> None:
    """A PNG of ``grid`` (``[height, width]`` per-PE values) over ``program``'s mesh, every kernel's region
    outlined and named (``mesh_figure``), written atomically."""
    fig = mesh_figure(program, grid, label, title, notes)
    import matplotlib.pyplot as plt

    try:
        atomic_write(
            Path(path), lambda file: fig.savefig(file, dpi=130, format="png"), ProgramWriteError, "picture"
        )
    finally:
        plt.close(fig)


def mesh_figure(
    program: ProgramData,
    grid: torch.Tensor,
    label: str,
    title: str,
    notes: Mapping[str, str] | None = None,
) -> Any:
    """The matplotlib figure ``draw_grid`` saves: the heatmap, each kernel's region outlined in its own
    color and labelled with its name (and ``notes[name]``, a figure such as its busy cycles).

    Pipelined kernels sit side by side, so each label goes inside its region, turned to run along a
    narrow one. Streaming kernels all start at column 0 and share the mesh one at a time, so their
    labels go in a key beside the mesh, in program order, each in its outline's color."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError as exc:  # the optional extra
        raise ImportError("drawing the mesh needs matplotlib: pip install 'sparsefx[plot]'") from exc
    notes = notes or {}
    stacked = program.mode == "streaming"
    aspect = program.mesh.height / program.mesh.width
    height = max(3.0, 11 * aspect * 0.8)
    key_columns = -(-len(program.kernels) // _KEY_ROWS) if stacked else 0
    inches = 11 + _KEY_INCHES * key_columns
    fig, ax = plt.subplots(figsize=(inches, height))
    shown = ax.imshow(grid.float().numpy(), cmap="viridis", interpolation="nearest", aspect="auto")
    fig.colorbar(shown, ax=ax, label=label)
    palette = plt.get_cmap("tab10")  # dark enough to read as text on white
    column_points = 72 * 11 * 0.8 / max(program.mesh.width, 1)  # about one mesh column, in points
    for i, k in enumerate(program.kernels):
        r, color = k.region, palette(i % 10)
        outline = Rectangle((r.x - 0.5, r.y - 0.5), r.width, r.height, fill=False, lw=0.6, edgecolor=color)
        ax.add_patch(outline)
        text = f"{k.name} {notes[k.name]}" if k.name in notes else k.name
        if stacked:
            column, row = divmod(i, _KEY_ROWS)
            text = f"{text}  ({r.width} cols)"
            fig.text(
                (11 + _KEY_INCHES * column) / inches,
                0.95 - row * 0.9 / _KEY_ROWS,
                text,
                color=color,
                fontsize=5,
                va="top",
                ha="left",
            )
            continue
        turned = r.height * aspect >= r.width / 2 or r.width < 4
        size = min(7.0, max(2.0, column_points * (r.width if turned else r.height * 4)))
        ax.text(
            r.x + (r.width - 1) / 2,
            r.y + (r.height - 1) / 2,
            text,
            color="white",
            fontsize=size,
            rotation=90 if turned else 0,
            ha="center",
            va="center",
            clip_on=True,
        )
    ax.set_xlabel("PE column (x)")
    ax.set_ylabel("PE row (y)")
    ax.set_title("\n".join(textwrap.fill(line, 150) for line in title.split("\n")), fontsize=8)
    if stacked:
        fig.subplots_adjust(left=0.6 / inches, right=10.8 / inches, top=0.9)
    else:
        fig.tight_layout()
    return fig


_KEY_ROWS = 60
"""Labels per column of a streaming picture's key."""
_KEY_INCHES = 2.2
"""Width of one column of the key."""
