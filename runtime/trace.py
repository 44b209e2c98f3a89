"""A run as a Chrome trace: the Trace Event Format JSON that Perfetto and ``chrome://tracing`` open.

One process (the mesh), one track (thread) per kernel in program order, a complete event (``"ph": "X"``)
per kernel from its start to its end, and in streaming mode a ``weight loads`` track with one event per
kernel whose arrays load from off-mesh memory. Times are microseconds at the program's clock::

    >>> import sparsefx
    >>> torch.manual_seed(0) and None
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()), 0.9)
    >>> program = sparsefx.lower(sm, torch.randn(8, 64), mesh=(8, 8))
    >>> stats = sparsefx.run(program, torch.randn(8, 64)).stats
    >>> events = trace_events(stats)["traceEvents"]
    >>> [e["name"] for e in events if e["ph"] == "X"] == [k.name for k in stats.kernels]
    True
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sparsefx.atomic import atomic_write
from sparsefx.errors import ProgramWriteError

from .stats import RunStats

__all__ = ["trace_events", "write_trace", "PID", "LOADS_TID"]

PID = 1
LOADS_TID = 0  # the weight-loads track; kernel i is on track i + 1


def _meta(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": PID, "tid": tid, "args": args}


def trace_events(stats: RunStats, title: str | None = None) -> dict[str, Any]:
    """The trace as plain data: ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``."""
    us = 1e6 / stats.clock_hz
    title = title or f"sparsefx run: {stats.mesh[0]}x{stats.mesh[1]} mesh, {stats.mode}"
    events = [_meta("process_name", LOADS_TID, {"name": title})]
    loads = [k for k in stats.kernels if k.load is not None and k.load[1] > k.load[0]]
    if loads:
        events += [
            _meta("thread_name", LOADS_TID, {"name": "weight loads"}),
            _meta("thread_sort_index", LOADS_TID, {"sort_index": LOADS_TID}),
        ]
    for k in loads:
        begin, end = k.load  # type: ignore[misc]
        events.append(
            {
                "name": f"load {k.name}",
                "cat": "weight_load",
                "ph": "X",
                "pid": PID,
                "tid": LOADS_TID,
                "ts": begin * us,
                "dur": (end - begin) * us,
                "args": {"kernel": k.name, "cycles": end - begin},
            }
        )
    for i, k in enumerate(stats.kernels):
        tid = i + 1
        events += [
            _meta("thread_name", tid, {"name": f"{k.name} ({k.op})"}),
            _meta("thread_sort_index", tid, {"sort_index": tid}),
        ]
        events.append(
            {
                "name": k.name,
                "cat": k.op,
                "ph": "X",
                "pid": PID,
                "tid": tid,
                "ts": k.start * us,
                "dur": (k.end - k.start) * us,
                "args": {
                    "cycles": k.cycles,
                    "busy_max": k.busy_max,
                    "critical": k.critical,
                    "waits_on": k.waits_on,
                    "axpys": k.axpys,
                    "skipped_axpys": k.skipped_axpys,
                },
            }
        )
    other = {
        "executor": stats.executor,
        "mode": stats.mode,
        "mesh": list(stats.mesh),
        "clock_hz": stats.clock_hz,
        "cycles": stats.cycles,
    }
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def write_trace(stats: RunStats, path: str | os.PathLike[str], title: str | None = None) -> None:
    """Write ``trace_events(stats)`` as a JSON file, atomically (open it in Perfetto or chrome://tracing)."""
    text = json.dumps(trace_events(stats, title), allow_nan=False).encode()
    atomic_write(Path(path), lambda file: file.write(text), ProgramWriteError, "trace")
