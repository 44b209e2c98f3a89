"""Time the stages of the real ``sparsefx.compile``, and a cProfile helper.

``staged_compile`` calls ``sparsefx.compile`` with three names in ``sparsefx.compiler`` patched for
the duration of the call: ``capture`` and the algorithm's ``bind`` (which prunes) are wrapped in timers, and
``PassManager`` is replaced by a subclass that wraps every pass in ``_Timed`` (which keeps the
pass's ``name``). Whatever pipeline the compiler builds is what gets timed, so the breakdown cannot
drift from the library. The manager's own work (recording ``gm.code`` after each pass) shows as
``pass-manager overhead``; everything else (config, plan, checks, wrapping) as ``rest of compile``.
"""

from __future__ import annotations

import contextlib
import cProfile
import functools
import inspect
import os
import pstats
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch import fx

import sparsefx
import sparsefx.compiler as compiler
from sparsefx.model import SparseModel

__all__ = ["staged_compile", "profile_compile", "ProfileRow"]

Stages = dict[str, float]


@dataclass
class _Timed:
    """A pass that adds its own wall time to ``stages[name]``."""

    inner: Any
    stages: Stages

    @property
    def name(self) -> str:
        return self.inner.name

    def __call__(self, gm: fx.GraphModule) -> Any:
        start = time.perf_counter()
        try:
            return self.inner(gm)
        finally:
            self.stages[self.name] = self.stages.get(self.name, 0.0) + time.perf_counter() - start


def _timer(fn: Callable[..., Any], stages: Stages, label: Callable[[Any], str]) -> Callable[..., Any]:
    """``fn`` that adds its wall time to ``stages[label(result)]``."""

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        key = label(result)
        stages[key] = stages.get(key, 0.0) + time.perf_counter() - start
        return result

    return timed


@contextlib.contextmanager
def _instrumented(stages: Stages, pass_time: Stages, manager_time: list[float]) -> Iterator[None]:
    """Patch ``sparsefx.compiler`` so one compile fills the three timing records."""
    base = compiler.PassManager

    class TimedManager(base):  # type: ignore[misc, valid-type]
        def __init__(self, passes: Any, **kwargs: Any) -> None:
            super().__init__([_Timed(p, pass_time) for p in passes], **kwargs)

        def __call__(self, gm: fx.GraphModule) -> Any:
            start = time.perf_counter()
            try:
                return super().__call__(gm)
            finally:
                manager_time.append(time.perf_counter() - start)

    saved = {name: getattr(compiler, name) for name in ("capture", "build_algorithm", "PassManager")}
    compiler.capture = _timer(saved["capture"], stages, lambda c: f"capture ({c.method})")

    def timed_build(cfg: Any) -> Any:
        algorithm = saved["build_algorithm"](cfg)
        algorithm.bind = _timer(algorithm.bind, stages, lambda _: "bind algorithm (prune weights)")
        return algorithm

    compiler.build_algorithm = timed_build
    compiler.PassManager = TimedManager
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(compiler, name, value)


def staged_compile(model: Any, config: Any, args: tuple, kwargs: dict) -> tuple[SparseModel, Stages]:
    """Run ``sparsefx.compile`` instrumented; return the model and ``{stage: seconds}`` in pipeline order."""
    stages: Stages = {}
    pass_time: Stages = {}
    manager_time: list[float] = []
    start = time.perf_counter()
    with _instrumented(stages, pass_time, manager_time):
        sm = sparsefx.compile(model, config, args, example_kwargs=kwargs)
    total = time.perf_counter() - start
    capture_keys = [k for k in stages if k.startswith("capture")]
    ordered = {k: stages[k] for k in capture_keys}
    ordered.update(pass_time)
    ordered["pass-manager overhead"] = sum(manager_time) - sum(pass_time.values())
    ordered.update({k: v for k, v in stages.items() if k not in capture_keys})
    ordered["rest of compile"] = total - sum(ordered.values())
    return sm, ordered


@dataclass(frozen=True)
class ProfileRow:
    """One library function in a cProfile run."""

    function: str
    where: str
    ncalls: int
    tottime: float
    cumtime: float


def _library_roots() -> list[str]:
    """Source folders of ``sparsefx`` and ``sparsefx.passes`` (the passes live outside the package folder)."""
    files = (inspect.getfile(sparsefx), inspect.getfile(compiler.PassManager))
    return sorted({os.path.dirname(os.path.abspath(f)) for f in files})


def profile_compile(fn: Callable[[], Any], top: int) -> tuple[float, list[ProfileRow]]:
    """Run ``fn`` under cProfile; return its time and the ``top`` library functions by cumulative time.

    File names are relative to the folder that holds the library folders (the repository).
    """
    roots = _library_roots()
    base = os.path.commonpath([os.path.dirname(r) for r in roots])
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.runcall(fn)
    total = time.perf_counter() - start
    rows = []
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        path = os.path.abspath(filename)
        if any(path.startswith(root + os.sep) for root in roots):
            rows.append(ProfileRow(func, f"{os.path.relpath(path, base)}:{line}", nc, tt, ct))
    rows.sort(key=lambda r: r.cumtime, reverse=True)
    return total, rows[:top]
