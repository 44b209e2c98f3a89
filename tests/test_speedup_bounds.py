"""Speedups that can be true: each realized speedup stays within its own ideal, and sparser is never slower.

The pinned benchmark settings (``BENCHMARKS.md``) give each figure its ideal: the sparse layers
``1 / (1 - s)``, the whole model its dense/sparse FLOP ratio. The dense baseline gets the same search
as the sparse program, so neither can beat its ideal by being mapped better than its baseline; and a
sparser model on the same mesh and mode is never slower. Both hold as properties over built-in and
Hugging Face models at sparsities 0, 0.5, 0.9 and 0.99 in both modes; the model each mode runs is
drawn with a fixed seed to keep the suite within its budget.

The FLOP ratio is a ceiling only while the sparse program does not use the mesh better than its
baseline (``stats._beyond``). Pipelined on a mesh narrow for the model, each kernel's one column leaves
the dense matmuls cramped, and LLaMA with its cache on 96x8 gains more than its FLOP ratio: the run
names it in ``beyond_flop_ratio`` with both utilizations, and a wider mesh removes it.
"""

from __future__ import annotations

import io
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers

import sparsefx
from conftest import HF_VOCAB, tiny_gpt2_config, tiny_llama_config
from sparsefx.models import build_model
from sparsefx.runtime.stats import RunStats

SPARSITIES = (0.0, 0.5, 0.9, 0.99)
SLACK = 1e-9  # ratios of integers: only rounding


def _mlp() -> tuple[torch.nn.Module, tuple]:
    spec = build_model("mlp", input_shape=(4, 64), seed=0)
    return spec.model, spec.args


def _gpt_tiny() -> tuple[torch.nn.Module, tuple]:
    spec = build_model("gpt-tiny", input_shape=(1, 6), seed=0)
    return spec.model, spec.args


def _gpt2() -> tuple[torch.nn.Module, tuple]:
    torch.manual_seed(0)
    config = tiny_gpt2_config(n_layer=1, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval(), (torch.randint(0, HF_VOCAB, (1, 5)),)


def _llama() -> tuple[torch.nn.Module, tuple]:
    """LLaMA with its key-value cache (``use_cache``: the cache is among the outputs)."""
    torch.manual_seed(0)
    config = tiny_llama_config(num_hidden_layers=1, use_cache=True)
    return transformers.LlamaForCausalLM(config).eval(), (torch.randint(0, HF_VOCAB, (1, 5)),)


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple]]] = {
    "mlp": _mlp,
    "gpt-tiny": _gpt_tiny,
    "hf-gpt2": _gpt2,
    "hf-llama-cache": _llama,
}
MESH = {"streaming": (8, 8), "pipelined": (160, 8)}  # pipelined: room beyond one column per kernel
SAMPLED = list(zip(random.Random(22).sample(sorted(MODELS), len(MESH)), MESH))  # a model for each mode


def _runs(name: str, mode: str, mesh: tuple[int, int] | None = None, sparsities=SPARSITIES) -> list[RunStats]:
    """The model lowered and run at every sparsity, on the same inputs."""
    out = []
    for s in sparsities:
        model, args = MODELS[name]()
        sm = sparsefx.compile(model, s, args)
        program = sparsefx.lower(sm, args, mesh=mesh or MESH[mode], mode=mode)
        out.append(sparsefx.run(program, args).stats)
    return out


def _check(name: str, mode: str, runs: list[RunStats], sparsities=SPARSITIES) -> None:
    for s, stats in zip(sparsities, runs):
        c = stats.dense
        assert c is not None, (name, mode, s, stats.dense_unavailable)
        where = (name, mode, s)
        assert c.layers_realized <= c.layers_ideal * (1 + SLACK), (*where, c.layers_realized, c.layers_ideal)
        assert c.realized <= c.flop_ratio * (1 + SLACK), (*where, c.realized, c.flop_ratio)
        assert c.throughput_realized <= c.flop_ratio * (1 + SLACK), (*where, c.throughput_realized)
        assert c.beyond_flop_ratio == "", where
        if s == 0:  # the same model: every figure is exactly 1
            assert (c.dense_cycles, c.dense_interval) == (c.sparse_cycles, c.sparse_interval), where
            assert c.linear_realized == 1.0 and not c.layers, where
    cycles = [stats.cycles for stats in runs]
    assert all(b <= a for a, b in zip(cycles, cycles[1:])), (name, mode, dict(zip(sparsities, cycles)))


@pytest.mark.parametrize(("name", "mode"), SAMPLED)
def test_speedups_stay_within_their_ideals_and_sparser_is_never_slower(name: str, mode: str) -> None:
    _check(name, mode, _runs(name, mode))


def test_a_speedup_above_the_flop_ratio_is_named_with_the_utilizations_behind_it() -> None:
    """LLaMA with its cache, pipelined on 96x8, one column per kernel at least: the dense matmuls share
    the columns left, and sparsity frees some of them. Its latency at 99% gains 2.124x against a FLOP
    ratio of 2.012x, with 6.5% of the PEs busy against the baseline's 5.1%. The run says so: each figure
    above the ratio comes with the sparse program keeping more of the mesh busy than its baseline (a
    speedup is busy work saved times that), which is what lets it exceed. Sparser is still never
    slower. (Before the pipelined stages were balanced it gained 2.100x there; with the baseline's
    columns also shared by what its own kernels measure, and the MLP's SiLU the gate's epilogue on both
    sides, the 90% program stays within its ratio, 1.374x against 1.843x.)"""
    runs = _runs("hf-llama-cache", "pipelined", mesh=(96, 8), sparsities=(0.9, 0.99))
    assert runs[1].cycles <= runs[0].cycles
    named = 0
    for s, stats in zip((0.9, 0.99), runs):
        c = stats.dense
        assert c is not None and c.layers_realized <= c.layers_ideal * (1 + SLACK), s
        note = c.beyond_flop_ratio
        for what, value, d, u in (
            ("latency", c.realized, c.dense_utilization, c.sparse_utilization),
            ("throughput", c.throughput_realized, c.dense_steady_utilization, c.sparse_steady_utilization),
        ):
            if value > c.flop_ratio * (1 + SLACK):
                assert f"{what} {value:.3f}x" in note and f"{u:.1%}" in note and f"{d:.1%}" in note, (s, note)
                assert u > d, (s, what, u, d)  # the only way past the FLOP ratio
                named += 1
            else:
                assert what not in note, (s, note)
    notes = [r.dense.beyond_flop_ratio for r in runs]
    assert named >= 1 and "latency" in notes[1], notes
    wider = (0.9, 0.99)  # on 160x8 the dense matmuls have room: every figure within its ideal
    _check("hf-llama-cache", "pipelined", _runs("hf-llama-cache", "pipelined", (160, 8), wider), wider)


def test_the_gelu_after_a_layer_takes_a_block_size_good_for_it_too() -> None:
    """A Linear-GELU MLP in streaming mode at 99% was slower than at 90%: its first layer, timed alone,
    chose 1-row blocks (a little faster alone), and the one-column GELU after it, which took the same
    blocks, ran 4x slower; the block size then came to be chosen for the matmul and the kernels after
    it. The GELU is now the first layer's epilogue (``fuse_epilogues``), applied on the PEs where each
    sum is whole, and the sparser model is still no slower, nor its first layer."""
    cycles, first = {}, {}
    for s in (0.9, 0.99):  # before the epilogue: 1,851 and 3,747 cycles, the GELU 776 and 3,073
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        x = torch.randn(16, 64)
        program = sparsefx.lower(sparsefx.compile(model, s, (x,)), (x,), mesh=(16, 16), mode="streaming")
        assert program.kernels[0].attrs["epilogue"]["fn"] == "gelu" and len(program.kernels) == 2
        stats = sparsefx.run(program, (x,)).stats
        cycles[s], first[s] = stats.cycles, stats.kernels[0].cycles
        c = stats.dense
        assert c is not None and c.layers_realized <= c.layers_ideal and c.realized <= c.flop_ratio
    assert cycles[0.99] <= cycles[0.9], cycles
    assert first[0.99] <= first[0.9], first


def test_at_sparsity_zero_the_balanced_program_is_its_own_dense_baseline() -> None:
    """Pipelined at sparsity 0, the linear layers ran 1.013x faster than dense: the balanced placement
    evens out outputs the columns do not divide, and the dense baseline had only the block placement.
    The baseline now gets the balanced placement of an all-ones weight (a geometry) and the same
    search, so every figure is exactly 1."""
    model, args = _mlp()
    program = sparsefx.lower(sparsefx.compile(model, 0.0, args), args, mesh=(16, 16), mode="pipelined")
    c = sparsefx.run(program, args).stats.dense
    assert c is not None
    assert (c.realized, c.linear_realized, c.throughput_realized) == (1.0, 1.0, 1.0)


def test_the_balanced_geometry_of_an_all_ones_weight_is_its_balanced_placement() -> None:
    """``layout.balanced_ones`` (the dense baseline's balanced kernels, computed from counts) equals the
    layout read from ``place_balanced``'s arrays for an all-ones weight, at every row-cut limit."""
    from sparsefx.passes.lower.place_balanced import place_balanced
    from sparsefx.runtime.layout import balanced_ones, layout
    from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    from sparsefx.runtime.program import Kernel, ProgramData, Region

    rng = random.Random(7)
    for _ in range(60):
        i, o, w, h = rng.randint(1, 40), rng.randint(1, 40), rng.randint(1, 12), rng.randint(1, 12)
        drift = rng.choice([None, 0, 1, 3, 16])
        ones = torch.ones(o, i)
        program = ProgramData(MeshSpec(16, 16), HardwareSpec(), "pipelined", "balanced")
        attrs = {"kind": "linear", "in_features": i, "out_features": o}
        k = Kernel("fc", "sparse_matmul", Region(0, 0, w, h), ("x",), (1, o), "float32", attrs=attrs)
        for role, array in place_balanced(ones, ones.bool(), w, h, drift).items():
            k.arrays[role] = program.add_array(f"fc.{role}", array)
        want, got = layout(program, k), balanced_ones(i, o, w, h, drift)
        for field in ("in_lo", "in_hi", "out_lo", "span", "counts"):
            assert torch.equal(getattr(want, field).long(), getattr(got, field).long()), (i, o, w, h, drift)


def _figures(text: str, label: str) -> tuple[float, float]:
    """The two speedups of the demo's line that starts with ``label``: realized, then its ideal."""
    line = next(line for line in text.splitlines() if line.startswith(label))
    found = re.findall(r"([0-9][0-9,]*\.[0-9]+)x", line)
    return float(found[0].replace(",", "")), float(found[1].replace(",", ""))


def test_the_demo_reports_each_speedup_beside_its_own_ideal() -> None:
    """The demo said "static sparsity 0.9", then an ideal of 4.38x (1/(1-s) over every matmul's weights,
    the dense LM head included) beside the whole model's speedup. Now the sparse layers' speedup stands
    beside 1/(1-s), the whole model's beside its FLOP ratio, each within its ideal."""
    from rich.console import Console

    from sparsefx.demo import run_demo

    console = Console(record=True, width=400, file=io.StringIO())
    result = run_demo("mlp", sparsity=0.9, steps=1, console=console)
    text = console.export_text()
    layers, ideal = _figures(text, "sparse layers (3 matmuls at 90.0% sparsity): realized speedup")
    assert "against the ideal speedup 1/(1-s) = 10.00x" in text
    assert layers <= ideal == pytest.approx(10.0, rel=1e-3)
    whole, flops = _figures(text, "whole model: realized speedup")
    assert "against its own ideal, the dense/sparse FLOP ratio" in text
    assert whole <= flops and flops == pytest.approx(result.flop_ratio, abs=0.005)
    assert result.layers_speedup is not None and result.layers_speedup <= result.layers_ideal


def _gpt2_program(sparsity: float, mode: str = "pipelined") -> tuple[sparsefx.ProgramData, RunStats]:
    model, args = _gpt2()
    program = sparsefx.lower(sparsefx.compile(model, sparsity, args), args, mesh=MESH[mode], mode=mode)
    return program, sparsefx.run(program, args).stats


def test_the_demo_says_why_the_whole_model_gains_less_than_its_layers() -> None:
    """GPT-2's LM head stays dense by default: the demo names it, with its share of the FLOPs, and the
    activation products, as what keeps the whole model's ideal below 1/(1-s)."""
    from sparsefx.demo import speedup_lines

    program, stats = _gpt2_program(0.9)
    c = stats.dense
    assert c is not None and len(c.dense_matmuls) == 1 and c.dense_matmuls[0] not in c.layers
    head = program.kernel(c.dense_matmuls[0])
    assert head.attrs["out_features"] == HF_VOCAB  # the LM head, its weight tied to the embedding
    assert c.flop_ratio < c.layers_ideal
    lines = speedup_lines(program, stats)
    assert lines[0].startswith(f"sparse layers ({len(c.layers)} matmuls at 90.0% sparsity)")
    assert "whole model: realized speedup" in lines[1] and f"FLOP ratio {c.flop_ratio:.2f}x" in lines[1]
    why = next(line for line in lines if line.startswith("why the whole model's ideal"))
    assert f"matmuls kept dense ({head.attrs['param']}:" in why and "activation products" in why


def _texts(fig: object) -> str:
    """Every text drawn on a matplotlib figure: its axes' and its own."""
    texts = [t.get_text() for ax in fig.axes for t in ax.texts] + [t.get_text() for t in fig.texts]
    return "\n".join(texts)


def test_the_heatmap_labels_every_kernel_with_its_busiest_pe(tmp_path: Path) -> None:
    """Pipelined, each kernel's name sits in its region; streaming (every kernel from column 0), in a
    key beside the mesh. Each label carries the kernel's busiest PE's cycles, and the title names the
    three busiest kernels."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from sparsefx.runtime.draw import mesh_figure
    from sparsefx.runtime.report import heatmap_title, write_heatmap

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(4, 8)
    sm = sparsefx.compile(model, 0.5, (x,))
    for mode, mesh in (("pipelined", (8, 4)), ("streaming", (4, 4))):
        program = sparsefx.lower(sm, (x,), mesh=mesh, mode=mode)
        stats = sparsefx.run(program, (x,)).stats
        notes = {k.name: f"{k.busy_max:,}" for k in stats.kernels}
        fig = mesh_figure(program, stats.pe_busy, "busy cycles per PE", heatmap_title(program, stats), notes)
        drawn = _texts(fig).splitlines()
        title = fig.axes[0].get_title()
        plt.close(fig)
        for k in program.kernels:
            assert any(line.startswith(f"{k.name} {notes[k.name]}") for line in drawn), (mode, k.name)
        hottest = max(stats.kernels, key=lambda k: k.busy_max)
        assert f"{hottest.name} ({hottest.busy_max:,} cycles on one PE)" in title.replace("\n", " ")
        write_heatmap(program, stats, tmp_path / f"{mode}.png")
        assert (tmp_path / f"{mode}.png").read_bytes()[:4] == b"\x89PNG"
