"""``sparsefx demo``: the end-to-end job on a built-in model, in well under a minute on a laptop CPU.

Build a model, compile it with static sparsity, check that the compiled model equals the original
run with ``weight * mask``, train it with AdamW on a small synthetic task, check that pruned weights
stayed exactly zero, report FLOPs and parameters dense versus sparse, lower the trained model onto a
64x64 mesh, run the program on the emulated mesh on fresh inputs, check its outputs against the
model's, and report what sparsity buys, each figure beside its own ideal: the sparse layers' speedup
beside ``1 / (1 - s)``, the whole model's beside its dense/sparse FLOP ratio, and why the two differ
(matmuls kept dense, such as GPT's LM head, and work sparsity does not shrink); then where the gap
goes. Given ``out``, it writes the program file, the busy-cycles heatmap, the Chrome trace and the
JSON report there::

    >>> import io
    >>> r = run_demo("mlp", sparsity=0.5, steps=3, console=rich.console.Console(file=io.StringIO()))
    >>> r.max_abs_diff <= 1e-5, r.pruned_stay_zero, r.masks_unchanged, r.emulated_max_diff <= 1e-4
    (True, True, True, True)
    >>> r.cycles > 0, r.dense_cycles > 0, r.layers_ideal == 2.0, r.layers_speedup <= r.layers_ideal
    (True, True, True, True)

Tables and bars come from ``sparsefx.report`` and ``sparsefx.runtime.report``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rich.console
import torch
import torch.nn.functional as F
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import nn
from torch.func import functional_call

import sparsefx
from sparsefx.accounting import FlopReport
from sparsefx.errors import ConfigError, ProgramWriteError, VerifyError
from sparsefx.frozen.timing import speedup_rounds
from sparsefx.model import SparseModel
from sparsefx.models.gpt import GPT
from sparsefx.models.registry import build_model
from sparsefx.report import flop_table, is_ascii, make_console, sparsity_table
from sparsefx.trees import tensor_leaves

__all__ = ["DemoResult", "run_demo"]

TOLERANCE = 1e-5
LEARNING_RATE = 3e-3
STEPS = 300
SMALL_MODEL = 1_000_000  # parameters: a smaller model runs the demo on one intra-op thread (_few_threads)
EMULATION_RTOL, EMULATION_ATOL = 1e-4, 1e-5  # the emulated outputs against sm.eval()'s


@dataclass(frozen=True)
class DemoResult:
    """The figures of one demo run (losses on a fixed held-out batch; diffs are max absolute)."""

    model: str
    sparsity: float
    steps: int
    seed: int
    task: str
    capture_method: str
    n_sparse: int
    n_dense: int
    max_abs_diff: float
    max_abs_diff_trained: float
    loss_before: float
    loss_after: float
    pruned_stay_zero: bool
    masks_unchanged: bool
    flops: FlopReport
    emulated_max_diff: float
    cycles: int
    dense_cycles: int | None  # None: no dense baseline (the reason is printed)
    speedup: float | None  # the whole model's, over the dense baseline
    flop_ratio: float | None  # the whole model's ideal: its dense over sparse forward FLOPs
    layers_speedup: float | None  # the sparse layers' (the matmuls whose masks prune)
    layers_ideal: float | None  # their ideal, 1 / (1 - s)
    files: tuple[str, ...]  # what was written to ``out``
    seconds: float
    frozen_speedup: float = 0.0  # ``sparsefx.freeze``'s: dense eager time over frozen time on this CPU
    frozen_max_diff: float = 0.0  # the frozen model's outputs against the compiled model's

    @property
    def ideal(self) -> float | None:
        """The sparse layers' ideal speedup ``1 / (1 - s)`` (``layers_ideal``)."""
        return self.layers_ideal


def run_demo(
    model: str = "gpt-tiny",
    sparsity: float = 0.9,
    steps: int = STEPS,
    seed: int = 0,
    console: rich.console.Console | None = None,
    out: str | os.PathLike[str] | None = None,
) -> DemoResult:
    """Compile, check, train, account, lower and emulate ``model`` at ``sparsity``; print each stage to
    ``console``; write the program and the run's report files to the folder ``out`` (created) if given."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ConfigError(f"steps: {steps!r} is not a non-negative int")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed: {seed!r} is not a non-negative int")
    with _few_threads(model):
        return _run_demo(model, sparsity, steps, seed, console or make_console(), out)


def _run_demo(
    model: str,
    sparsity: float,
    steps: int,
    seed: int,
    console: rich.console.Console,
    out: str | os.PathLike[str] | None,
) -> DemoResult:
    start = time.perf_counter()
    spec = build_model(model, seed=seed)
    task = _make_task(spec, seed)
    reference = copy.deepcopy(spec.model).eval()
    config = {"algorithm": "static", "sparsity": sparsity, "seed": seed}
    sm = sparsefx.compile(spec.model, config, spec.args, example_kwargs=spec.kwargs)
    plan = sm.plan
    console.print(
        f"[bold]sparsefx demo[/]: {model} with static sparsity {sparsity:g} (seed {seed}); captured with "
        f"{sm.capture_method}; {len(plan.sparse)} sparse / {len(plan.dense)} dense parameters"
    )
    console.print(sparsity_table(sm, ascii_only=is_ascii(console)))

    generator = torch.Generator().manual_seed(seed + 1)
    check_args, _ = task.sample(generator)
    diff = _max_diff(sm, reference, check_args)
    _report_diff(console, "equivalence check (fresh random inputs, original model with weight*mask)", diff)

    masks_before = {name: mask.clone() for name, mask in sm.masks.items()}
    eval_args, eval_target = task.sample(torch.Generator().manual_seed(seed + 2))
    loss_before = _eval_loss(sm, task, eval_args, eval_target)
    console.print(f"training {steps} steps: AdamW lr {LEARNING_RATE:g}, {task.description}")
    _train(sm, task, steps, generator, console)
    loss_after = _eval_loss(sm, task, eval_args, eval_target)
    console.print(f"loss (held-out batch): before {loss_before:.4f} -> after {loss_after:.4f}")

    pruned_zero, unchanged = _check_masks(sm, masks_before)
    console.print(
        f"pruned weights stayed exactly zero: {_ok(pruned_zero)}; masks unchanged: {_ok(unchanged)}"
    )
    if not (pruned_zero and unchanged):
        raise VerifyError("training broke the sparsity invariants (pruned weights or masks changed)")
    diff_trained = _max_diff(sm, reference, check_args)
    _report_diff(console, "equivalence check after training (trained weights)", diff_trained)

    report = sparsefx.flops(sm)
    console.print(flop_table(report, title="FLOPs and parameters (per call on the example inputs)"))
    saved = report.dense_forward - report.sparse_forward
    console.print(
        f"forward FLOPs saved by sparsity: {saved:,} of {report.dense_forward:,} "
        f"({saved / max(report.dense_forward, 1):.1%})"
    )
    rows = _batch(spec.args, check_args)  # lower and run at the example inputs' batch, as counted above
    program = _lower(sm, _head(check_args, rows), console)
    run_args = _head(task.sample(torch.Generator().manual_seed(seed + 3))[0], rows)
    result, emulated_diff = _emulate(sm, program, run_args, console)
    stats = result.stats
    frozen_speedup, frozen_diff = _freeze(sm, reference, run_args, stats, console)
    files = _write_files(out, model, program, stats, console) if out is not None else ()
    seconds = time.perf_counter() - start
    console.print(f"done in {seconds:.1f} s")
    return DemoResult(
        model=model,
        sparsity=float(sparsity),
        steps=steps,
        seed=seed,
        task=task.description,
        capture_method=sm.capture_method,
        n_sparse=len(plan.sparse),
        n_dense=len(plan.dense),
        max_abs_diff=diff,
        max_abs_diff_trained=diff_trained,
        loss_before=loss_before,
        loss_after=loss_after,
        pruned_stay_zero=pruned_zero,
        masks_unchanged=unchanged,
        flops=report,
        emulated_max_diff=emulated_diff,
        cycles=stats.cycles,
        dense_cycles=stats.dense.dense_cycles if stats.dense else None,
        speedup=stats.dense.realized if stats.dense else None,
        flop_ratio=stats.dense.flop_ratio if stats.dense else None,
        layers_speedup=stats.dense.layers_realized if stats.dense else None,
        layers_ideal=stats.dense.layers_ideal if stats.dense else None,
        files=files,
        seconds=seconds,
        frozen_speedup=frozen_speedup,
        frozen_max_diff=frozen_diff,
    )


FREEZE_ROUNDS = 5
"""Interleaved rounds of the demo's CPU timing (dense eager against frozen), after a warm-up each."""


def _freeze(
    sm: SparseModel, reference: nn.Module, args: tuple, stats: Any, console: Any
) -> tuple[float, float]:
    """Freeze ``sm`` for the CPU, check it against ``sm`` and time it against the dense original, side by
    side with what the emulated mesh said; ``(speedup, max |diff|)``."""
    fast = sparsefx.freeze(sm.eval())
    with torch.inference_mode():
        diff = _max_abs(*_paired(fast(*args), sm(*args), "frozen model", "the compiled model returns"))
        ratios = speedup_rounds(lambda: reference(*args), lambda: fast(*args), FREEZE_ROUNDS)
    speedup = statistics.median(ratios)
    packed = sum(bool(r.kernels) for r in fast.freeze_report)
    mesh = f"{stats.dense.realized:.2f}x on the emulated mesh" if stats.dense else "no emulated baseline"
    _report_diff(console, "frozen model (sparsefx.freeze) against the compiled model", diff)
    if not diff <= TOLERANCE:
        raise VerifyError(f"the frozen model's outputs differ from the compiled model's by {diff:.2e}")
    console.print(
        f"real CPU: the frozen model runs {speedup:.2f}x the dense eager forward "
        f"({torch.get_num_threads()} thread(s), median of {FREEZE_ROUNDS} rounds; {packed} layers packed, "
        f"frozen in {fast.freeze_seconds:.1f} s), beside {mesh}"
    )
    return speedup, diff


# ---------------------------------------------------------------------------------------------------------
# Synthetic tasks: a noisy bigram language for GPTs, a teacher network's labels for classifiers


@dataclass(frozen=True)
class _BigramTask:
    """Next-token prediction on sequences where token t+1 = successor[token t], except a few random ones."""

    successor: torch.Tensor
    seq_len: int
    batch: int = 16
    noise: float = 0.1

    @property
    def description(self) -> str:
        return f"next-token prediction on a noisy bigram language ({int(self.noise * 100)}% random tokens)"

    def sample(self, gen: torch.Generator) -> tuple[tuple, torch.Tensor]:
        vocab = self.successor.numel()
        tokens = [torch.randint(0, vocab, (self.batch,), generator=gen)]
        for _ in range(self.seq_len):
            follow = self.successor[tokens[-1]]
            random = torch.randint(0, vocab, (self.batch,), generator=gen)
            tokens.append(torch.where(torch.rand(self.batch, generator=gen) < self.noise, random, follow))
        seq = torch.stack(tokens, dim=1)
        return (seq[:, :-1],), seq[:, 1:]

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.flatten(0, 1), target.flatten())


@dataclass(frozen=True)
class _TeacherTask:
    """Classify inputs by a fixed random teacher network of the same architecture (logits standardized)."""

    teacher: nn.Module
    input_shape: tuple[int, ...]
    center: torch.Tensor
    scale: torch.Tensor
    batch: int = 32

    @property
    def description(self) -> str:
        return f"classification by a fixed random teacher network ({self.center.numel()} classes)"

    def sample(self, gen: torch.Generator) -> tuple[tuple, torch.Tensor]:
        x = torch.randn((self.batch, *self.input_shape), generator=gen)
        with torch.no_grad():
            labels = ((self.teacher(x) - self.center) / self.scale).argmax(dim=-1)
        return (x,), labels

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target)


def _make_task(spec: Any, seed: int) -> _BigramTask | _TeacherTask:
    if isinstance(spec.model, GPT):
        vocab = spec.model.config.vocab_size
        successor = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
        return _BigramTask(successor, seq_len=min(64, spec.model.config.max_seq_len))
    first = spec.args[0] if spec.args else None
    with torch.no_grad():
        out = spec.model(*spec.args, **spec.kwargs) if first is not None else None
    if spec.kwargs or not _is_float(first) or not isinstance(out, torch.Tensor) or out.ndim != 2:
        raise ConfigError(
            f"demo: model {spec.name!r} is not a GPT or a classifier taking one float tensor and "
            "returning [batch, classes] logits; try gpt-tiny, mlp, cnn or conv1d"
        )
    teacher = build_model(spec.name, seed=seed + 1000).model.eval()
    calib = torch.randn((512, *first.shape[1:]), generator=torch.Generator().manual_seed(seed + 1000))
    with torch.no_grad():
        logits = teacher(calib)
    return _TeacherTask(teacher, tuple(first.shape[1:]), logits.mean(0), logits.std(0) + 1e-6)


def _batch(example: tuple, sample: tuple) -> int:
    """The example inputs' batch when a task sample has the same shape past the batch, else the sample's."""
    a, b = (example[0] if example else None), sample[0]
    if isinstance(a, torch.Tensor) and a.ndim == b.ndim and a.shape[1:] == b.shape[1:] and len(a) <= len(b):
        return len(a)
    return len(b)


def _head(args: tuple, rows: int) -> tuple:
    """The first ``rows`` of each input."""
    return tuple(a[:rows] for a in args)


def _is_float(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


# ---------------------------------------------------------------------------------------------------------
# Stages


def _train(sm: SparseModel, task: Any, steps: int, gen: torch.Generator, console: Any) -> None:
    optimizer = torch.optim.AdamW(sm.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    if sm.sparsity is not None:
        sm.sparsity.apply(optimizer)
    sm.train()
    columns = (
        TextColumn("train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    with _flush_denormals(), Progress(*columns, console=console) as progress:
        bar = progress.add_task("train", total=steps, loss="-")
        for _ in range(steps):
            args, target = task.sample(gen)
            loss = task.loss(sm(*args), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            progress.update(bar, advance=1, loss=f"{loss.item():.4f}")
    sm.eval()


@contextlib.contextmanager
def _few_threads(model: str) -> Iterator[None]:
    """One intra-op thread while a model under ``SMALL_MODEL`` parameters runs the demo.

    Its ops are too small to gain from more threads, and on a machine busy with other work the extra
    threads' waiting slows every op many times over: the whole gpt-tiny demo took 146 s on two
    threads and 24 s on one, on two cores shared with other processes.
    """
    params = sum(p.numel() for p in build_model(model, device="meta").model.parameters())
    if params >= SMALL_MODEL:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _flush_denormals() -> Iterator[None]:
    """Treat denormal floats as zero while training: tiny Adam second moments otherwise slow CPUs 30x."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


@torch.no_grad()
def _eval_loss(sm: SparseModel, task: Any, args: tuple, target: torch.Tensor) -> float:
    sm.eval()
    return float(task.loss(sm(*args), target))


@torch.no_grad()
def _max_diff(sm: SparseModel, reference: nn.Module, args: tuple) -> float:
    """Max |sm(x) - reference(x)|, the reference run with sm's current weights times masks."""
    sm.eval()
    names = set(reference.state_dict(keep_vars=True))
    state = {k: v for k, v in sm.state_dict(keep_vars=True).items() if k in names}
    for name, mask in sm.masks.items():
        state[name] = state[name] * mask
    got, want = _paired(
        sm(*args), functional_call(reference, state, args), "equivalence check", "reference has"
    )
    return _max_abs(got, want)


def _paired(got: Any, want: Any, what: str, theirs: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The output tensors of two runs of one model, which must be as many (and some)."""
    g, w = tensor_leaves(got), tensor_leaves(want)
    if len(g) != len(w) or not g:
        raise VerifyError(f"{what}: {len(g)} output tensors, {theirs} {len(w)}")
    return g, w


def _max_abs(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest absolute difference between paired tensors (an empty pair differs by nothing)."""
    return max(
        (float((g.float() - w.float()).abs().max()) for g, w in zip(got, want) if w.numel()), default=0.0
    )


def _report_diff(console: Any, label: str, diff: float) -> None:
    passed = diff <= TOLERANCE
    console.print(f"{label}: max |diff| = {diff:.2e} (tolerance {TOLERANCE:g}) {_ok(passed)}")
    if not passed:
        raise VerifyError(f"{label}: max |diff| = {diff:.3e} > {TOLERANCE:g}")


def _check_masks(sm: SparseModel, before: dict[str, torch.Tensor]) -> tuple[bool, bool]:
    """(every pruned weight is exactly 0, every mask equals its copy from before training)."""
    masks = sm.masks
    zero = all(bool((sm.get_parameter(name)[~mask] == 0).all()) for name, mask in masks.items())
    unchanged = all(torch.equal(masks[name], mask) for name, mask in before.items())
    return zero, unchanged


def _ok(passed: bool) -> str:
    return "[green]ok[/]" if passed else "[bold red]FAILED[/]"


def _lower(sm: Any, args: tuple, console: Any) -> sparsefx.DataflowProgram:
    """Lower the trained model onto a 64x64 mesh (streaming if it does not fit pipelined) and verify it."""
    from sparsefx.errors import LoweringError
    from sparsefx.runtime.summary import totals_table

    try:
        program = sparsefx.lower(sm, args, mesh="medium", mode="pipelined")
    except LoweringError as exc:
        if "streaming" not in str(exc):
            raise
        program = sparsefx.lower(sm, args, mesh="medium", mode="streaming")
    program.verify()
    console.print(totals_table(program))
    return program


def _emulate(sm: SparseModel, program: Any, args: tuple, console: Any) -> tuple[Any, float]:
    """Run ``program`` on ``args`` on the emulated mesh, check the outputs against ``sm.eval()``'s and
    print the speedup, its gap to the ideal and the report tables."""
    from sparsefx.runtime.report import comparison_table, parts_table, summary_table

    result = sparsefx.run(program, args)
    with torch.no_grad():
        got, want = _paired(result.outputs, sm.eval()(*args), "emulation", "the model returns")
    diff = _max_abs(got, want)
    close = all(torch.allclose(g, w, rtol=EMULATION_RTOL, atol=EMULATION_ATOL) for g, w in zip(got, want))
    console.print(
        f"emulated on the mesh (fresh inputs): outputs equal sm.eval()'s, max |diff| = {diff:.2e} "
        f"(rtol {EMULATION_RTOL:g}, atol {EMULATION_ATOL:g}) {_ok(close)}"
    )
    if not close:
        raise VerifyError(f"emulated outputs differ from the model's: max |diff| = {diff:.3e}")
    stats = result.stats
    console.print(summary_table(stats))
    console.print(comparison_table(stats))
    if stats.dense is not None:
        for line in speedup_lines(program, stats):
            console.print(line)
        console.print("where the latency's gap to (1-s) x dense goes:")
    console.print(parts_table(stats))
    return result, diff


def speedup_lines(program: Any, stats: Any) -> list[str]:
    """What sparsity buys, in words: the sparse layers' speedup beside ``1 / (1 - s)``, the whole model's
    beside its FLOP ratio, and why they differ (the FLOPs sparsity does not shrink)."""
    c = stats.dense
    lines = []
    if c.layers:
        lines.append(
            f"sparse layers ({len(c.layers)} matmuls at {c.layers_sparsity:.1%} sparsity): realized speedup "
            f"{c.layers_realized:.2f}x against the ideal speedup 1/(1-s) = {c.layers_ideal:.2f}x "
            f"({c.layers_efficiency:.1%} of it)"
        )
    else:
        lines.append("sparse layers: none (no mask prunes a weight), so sparsity buys nothing here")
    throughput = (
        f"; throughput, inputs following one another: {c.throughput_realized:.2f}x"
        if stats.mode == "pipelined"
        else ""
    )
    lines.append(
        f"whole model: realized speedup {c.realized:.2f}x against its own ideal, the dense/sparse FLOP ratio "
        f"{c.flop_ratio:.2f}x ({c.efficiency:.1%} of it){throughput}"
    )
    if c.beyond_flop_ratio:
        lines.append(c.beyond_flop_ratio)
    if stats.mode == "pipelined" and c.layers and c.layers_realized < 1 <= c.throughput_realized:
        lines.append(
            "the sparse layers' figure sums their kernels' spans: pipelined, each program's columns are "
            "shared so that its slowest stage is as fast as it can be, and the sparse layers, needing less, "
            "gave columns to the kernels that were slower, so each runs longer alone while the whole "
            f"pipeline takes a new input every {c.sparse_interval:,} cycles against {c.dense_interval:,}"
        )
    kept, products, layers = _flop_shares(program, c.layers)
    why = []
    if c.dense_matmuls:
        weights = [str(program.kernel(n).attrs.get("param", n)) for n in c.dense_matmuls]  # lm_head.weight
        names = ", ".join(weights[:3]) + (" ..." if len(weights) > 3 else "")
        why.append(f"matmuls kept dense ({names}: {kept:.0%} of the sparse model's FLOPs)")
    if products:
        why.append(f"activation products such as attention ({products:.0%})")
    if why:
        lines.append(
            f"why the whole model's ideal is below 1/(1-s): the sparse layers are {layers:.0%} of the sparse "
            f"model's FLOPs; the rest is {' and '.join(why)}, the same work dense or sparse"
        )
    return lines


def _flop_shares(program: Any, layers: list[str]) -> tuple[float, float, float]:
    """Shares of the sparse program's matmul FLOPs: matmuls kept dense, activation products, the sparse
    ``layers``."""
    pruned = set(layers)
    share = {"kept": 0, "products": 0, "layers": 0}
    for k in program.kernels:
        if k.op in ("matmul", "sparse_matmul"):
            part = "products" if k.op == "matmul" else "layers" if k.name in pruned else "kept"
            share[part] += int(k.stats.get("flops", 0))
    total = max(sum(share.values()), 1)
    return share["kept"] / total, share["products"] / total, share["layers"] / total


def _write_files(
    out: str | os.PathLike[str], model: str, program: Any, stats: Any, console: Any
) -> tuple[str, ...]:
    """The program file, heatmap (with matplotlib), Chrome trace and JSON report, in the folder ``out``."""
    from sparsefx.runtime.report import report_data, write_heatmap, write_json
    from sparsefx.runtime.trace import write_trace

    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProgramWriteError(f"cannot create the output folder {folder}: {exc.strerror or exc}") from exc
    names = {"program": f"{model}.sfxp", "trace": "trace.json", "report": "report.json"}
    program.save(str(folder / names["program"]))
    write_trace(stats, folder / names["trace"], f"sparsefx demo: {model} on a {program.mesh} mesh")
    write_json(report_data(stats, program), folder / names["report"])
    notes = [
        f"{names['program']} (the program: sparsefx inspect / sparsefx run it)",
        f"{names['trace']} (open in Perfetto or chrome://tracing)",
        f"{names['report']} (every figure of the run)",
    ]
    try:
        write_heatmap(program, stats, folder / "heatmap.png")
        names["heatmap"] = "heatmap.png"
        notes.insert(1, "heatmap.png (busy cycles per PE)")
    except ImportError:
        notes.append("no heatmap: it needs matplotlib (pip install 'sparsefx[plot]')")
    console.print(f"wrote to {folder}{os.sep}: " + "; ".join(notes), markup=False)
    return tuple(str(folder / name) for name in names.values())
