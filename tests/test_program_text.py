"""Golden tests of the program text form (``runtime/text.py``), xDSL style: each hand-built program prints
exactly the text written out below, and the text parses back to the same program and the same text.

The goldens are verbatim program text, so their lines run past the line-length limit.
"""

# ruff: noqa: E501

from __future__ import annotations

import contextlib
import dataclasses
import random
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sparsefx
from sparsefx.errors import ProgramFormatError, VerifyError
from sparsefx.runtime.dataflow import DataflowProgram
from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
from sparsefx.runtime.program import ArraySpec, Kernel, Region, Route, Stream, Task
from sparsefx.runtime.text import parse_program, print_program

FIELDS = [f.name for f in dataclasses.fields(DataflowProgram) if f.name != "arrays"]


def _csc(p: DataflowProgram, name: str, pes: int, nnz: int, cols: int) -> dict[str, str]:
    """A sparse matmul's per-PE arrays by role (zeros: only their specs reach the text)."""
    i16, i32 = torch.int16, torch.int32
    return {
        "values": p.add_array(f"{name}.values", torch.zeros(nnz)),
        "row_idx": p.add_array(f"{name}.row_idx", torch.zeros(nnz, dtype=i16)),
        "nz_ptr": p.add_array(f"{name}.nz_ptr", torch.zeros(pes + 1, dtype=i32)),
        "col_ptr": p.add_array(f"{name}.col_ptr", torch.zeros(cols, dtype=i16)),
        "col_ptr_off": p.add_array(f"{name}.col_ptr_off", torch.zeros(pes + 1, dtype=i32)),
        "out_lo": p.add_array(f"{name}.out_lo", torch.zeros(pes, dtype=i32)),
        "out_hi": p.add_array(f"{name}.out_hi", torch.zeros(pes, dtype=i32)),
    }


def mlp() -> DataflowProgram:
    """x -> fc1 (sparse) -> relu -> fc2 (sparse), pipelined on an 8x2 mesh, with payloads."""
    p = DataflowProgram(MeshSpec(8, 2), HardwareSpec(name="tiny"), "pipelined", "block")
    p.meta = {"model": "MLP", "sparsity": 0.9, "seed": 0}
    p.inputs.append(Stream("x", (8, 64), "float32"))
    fc1 = _csc(p, "fc1", 4, 205, 64)
    fc1["bias"] = p.add_array("fc1.bias", torch.zeros(32))
    p.kernels.append(
        Kernel(
            "fc1",
            "sparse_matmul",
            Region(0, 0, 2, 2),
            ("x",),
            (8, 32),
            "float32",
            attrs={"in_features": 64, "out_features": 32, "lanes": 2, "transposed": False},
            arrays=fc1,
            tasks=(Task("recv_x", 0), Task("reduce", 3, "activate")),
            stats={"nnz": 205, "flops": 3280, "sram_max": 1536, "imbalance": 1.0625},
            source="fc1",
        )
    )
    p.kernels.append(
        Kernel(
            "relu",
            "elementwise",
            Region(2, 0, 1, 2),
            ("fc1",),
            (8, 32),
            "float32",
            attrs={"fn": "relu", "lanes": 2},
            tasks=(Task("recv_fc1", 1),),
            stats={"flops": 256},
            source="relu",
        )
    )
    p.kernels.append(
        Kernel(
            "fc2",
            "sparse_matmul",
            Region(3, 0, 2, 2),
            ("relu",),
            (8, 10),
            "float32",
            attrs={"in_features": 32, "out_features": 10, "lanes": 2, "transposed": False},
            arrays=_csc(p, "fc2", 4, 32, 32),
            tasks=(Task("recv_relu", 2),),
            stats={"nnz": 32, "flops": 512, "sram_max": 320, "imbalance": 1.5},
            source='model.fc2 (Linear "head")',
        )
    )
    p.outputs.append("fc2")
    p.output_tree = {"type": "tensor", "index": 0}
    p.routes += [
        Route("x.fc1", 0, "x", "host", ("fc1",), lanes=2, first=0, count=2),
        Route("fc1.reduce", 3, "fc1", "fc1", ("fc1",), kind="internal", lanes=2, first=2, count=2),
        Route("fc1.relu", 1, "fc1", "fc1", ("relu",), lanes=2, first=4, count=2),
        Route("relu.fc2", 2, "relu", "relu", ("fc2",), lanes=2, first=6, count=2),
        Route("fc2.out", 4, "fc2", "fc2", ("host",), lanes=2, first=8, count=2),
    ]
    p.add_array("routes.runs", torch.zeros(10, 10, dtype=torch.int32))
    return p


def streaming() -> DataflowProgram:
    """Weight streaming (kernels share the mesh, routes have steps), custom hardware, awkward names."""
    hw = HardwareSpec(
        name="wse3 (custom)",
        simd_widths={"float16": 8, "bfloat16": 8, "float32": 4},
        clock_hz=1.1e9,
        task_start_cycles=6,
        host_bytes_per_s=1.25e11,
    )
    p = DataflowProgram(MeshSpec(4, 4), hw, "streaming", "balanced")
    p.meta = {"batch": 2, "notes": ["tiny", "µ-test"], "eps": 1e-300, "nested": {"a": [1, 2.5, None, True]}}
    p.inputs += [Stream("input ids", (2, 6), "int64"), Stream("mask", (2, 6), "bool")]
    table = p.add_array("embed.table", torch.zeros(100, 16, dtype=torch.float16))
    whole = Region(0, 0, 4, 4)
    p.kernels += [
        Kernel("embed", "embedding", whole, ("input ids",), (2, 6, 16), "float16", arrays={"table": table}),
        Kernel(
            'q"proj"',
            "sparse_matmul",
            whole,
            ("embed",),
            (2, 6, 16),
            "float16",
            attrs={"in_features": 16, "out_features": 16, "split": 2},
            arrays=_csc(p, "qproj", 16, 26, 16),
            stats={"nnz": 26},
        ),
        Kernel(
            "masked",
            "elementwise",
            whole,
            ('q"proj"', "mask"),
            (2, 6, 16),
            "float16",
            attrs={"fn": "where", "scalar": -65504.0},
        ),
        Kernel(
            "pooled",
            "reduce",
            Region(0, 0, 4, 1),
            ("masked",),
            (2, 16),
            "float32",
            attrs={"fn": "mean", "dims": [1], "keepdim": False},
            source="x.mean(dim=1)\twith a tab",
        ),
    ]
    p.outputs.append("pooled")
    p.output_tree = {"type": "tensor", "index": 0}
    p.routes += [
        Route("ids", 0, "input ids", "host", ("embed",), lanes=4, first=0, count=4, step=0),
        Route("embed->q", 1, "embed", "embed", ('q"proj"',), lanes=4, first=4, count=4, step=1),
        Route("mask", 2, "mask", "host", ("masked",), lanes=4, first=8, count=4, step=2),
        Route("q->masked", 1, 'q"proj"', 'q"proj"', ("masked",), lanes=4, first=12, count=4, step=2),
        Route("masked->pooled", 0, "masked", "masked", ("pooled",), lanes=4, first=16, count=4, step=3),
        Route("out", 3, "pooled", "pooled", ("host",), first=20, count=1),
    ]
    p.add_array("routes.runs", torch.zeros(21, 10, dtype=torch.int32))
    p.specs["weights.fp8"] = ArraySpec("float8_e4m3", (64,))  # no payload, a dtype without a size: bytes=?
    return p


def dict_outputs() -> DataflowProgram:
    """Two outputs in a dict (``{"logits": ..., "hidden": ...}``); kernels without tasks, stats or source."""
    p = DataflowProgram(MeshSpec(6, 1), HardwareSpec(), "pipelined", "block")
    p.inputs.append(Stream("h", (4, 8), "float32"))
    ln = {"weight": p.add_array("ln.weight", torch.ones(8)), "bias": p.add_array("ln.bias", torch.zeros(8))}
    scale = p.add_array("scale.value", torch.ones(()))
    p.kernels += [
        Kernel(
            "ln", "layer_norm", Region(0, 0, 2, 1), ("h",), (4, 8), "float32", {"eps": 1e-05, "lanes": 1}, ln
        ),
        Kernel("logits", "softmax", Region(2, 0, 1, 1), ("ln",), (4, 8), "float32", attrs={"dim": -1}),
        Kernel("scale", "constant", Region(3, 0, 1, 1), (), (), "float32", arrays={"value": scale}),
    ]
    p.outputs += ["logits", "ln"]
    p.output_tree = {
        "type": "dict",
        "keys": ["logits", "hidden"],
        "children": [{"type": "tensor", "index": 0}, {"type": "tensor", "index": 1}],
    }
    p.routes += [
        Route("h", 0, "h", "host", ("ln",)),
        Route("ln", 1, "ln", "ln", ("logits", "host")),
        Route("logits", 2, "logits", "logits", ("host",)),
    ]
    return p


MLP_TEXT = r"""
sparsefx.program 3
mesh 8x2 mode=pipelined placement=block
hardware name="tiny" sram_bytes=49152 wavelet_bits=32 link_wavelets_per_cycle=1 colors=24 clock_hz=850000000.0 simd_widths={"bfloat16": 4, "float16": 4, "float32": 2} task_start_cycles=8 vector_start_cycles=2 hop_cycles=1 host_bytes_per_s=150000000000.0 weight_bytes_per_s=150000000000.0 sram_bytes_per_cycle=27.68166089965398
meta {"model": "MLP", "seed": 0, "sparsity": 0.9}
input %x : float32[8, 64]
output %fc2
output_tree {"index": 0, "type": "tensor"}
%fc1 = sparse_matmul(%x) @[0,0 2x2] : float32[8, 32] nnz=205 routes=[x.fc1, fc1.reduce, fc1.relu] colors=[0, 1, 3] attrs={"in_features": 64, "lanes": 2, "out_features": 32, "transposed": false} arrays={bias: fc1.bias, col_ptr: fc1.col_ptr, col_ptr_off: fc1.col_ptr_off, nz_ptr: fc1.nz_ptr, out_hi: fc1.out_hi, out_lo: fc1.out_lo, row_idx: fc1.row_idx, values: fc1.values} tasks=[recv_x(color=0, trigger=data), reduce(color=3, trigger=activate)] stats={"flops": 3280, "imbalance": 1.0625, "sram_max": 1536} source="fc1"
%relu = elementwise(%fc1) @[2,0 1x2] : float32[8, 32] routes=[fc1.relu, relu.fc2] colors=[1, 2] attrs={"fn": "relu", "lanes": 2} tasks=[recv_fc1(color=1, trigger=data)] stats={"flops": 256} source="relu"
%fc2 = sparse_matmul(%relu) @[3,0 2x2] : float32[8, 10] nnz=32 routes=[relu.fc2, fc2.out] colors=[2, 4] attrs={"in_features": 32, "lanes": 2, "out_features": 10, "transposed": false} arrays={col_ptr: fc2.col_ptr, col_ptr_off: fc2.col_ptr_off, nz_ptr: fc2.nz_ptr, out_hi: fc2.out_hi, out_lo: fc2.out_lo, row_idx: fc2.row_idx, values: fc2.values} tasks=[recv_relu(color=2, trigger=data)] stats={"flops": 512, "imbalance": 1.5, "sram_max": 320} source="model.fc2 (Linear \"head\")"
route x.fc1 color=0 value=%x host -> [%fc1] kind=value lanes=2 runs[0:2] step=-1
route fc1.reduce color=3 value=%fc1 %fc1 -> [%fc1] kind=internal lanes=2 runs[2:4] step=-1
route fc1.relu color=1 value=%fc1 %fc1 -> [%relu] kind=value lanes=2 runs[4:6] step=-1
route relu.fc2 color=2 value=%relu %relu -> [%fc2] kind=value lanes=2 runs[6:8] step=-1
route fc2.out color=4 value=%fc2 %fc2 -> [host] kind=value lanes=2 runs[8:10] step=-1
array fc1.values : float32[205] bytes=820
array fc1.row_idx : int16[205] bytes=410
array fc1.nz_ptr : int32[5] bytes=20
array fc1.col_ptr : int16[64] bytes=128
array fc1.col_ptr_off : int32[5] bytes=20
array fc1.out_lo : int32[4] bytes=16
array fc1.out_hi : int32[4] bytes=16
array fc1.bias : float32[32] bytes=128
array fc2.values : float32[32] bytes=128
array fc2.row_idx : int16[32] bytes=64
array fc2.nz_ptr : int32[5] bytes=20
array fc2.col_ptr : int16[32] bytes=64
array fc2.col_ptr_off : int32[5] bytes=20
array fc2.out_lo : int32[4] bytes=16
array fc2.out_hi : int32[4] bytes=16
array routes.runs : int32[10, 10] bytes=400
end kernels=3 routes=5 arrays=16 bytes=2286
""".strip("\n")


STREAMING_TEXT = r"""
sparsefx.program 3
mesh 4x4 mode=streaming placement=balanced
hardware name="wse3 (custom)" sram_bytes=49152 wavelet_bits=32 link_wavelets_per_cycle=1 colors=24 clock_hz=1100000000.0 simd_widths={"bfloat16": 8, "float16": 8, "float32": 4} task_start_cycles=6 vector_start_cycles=2 hop_cycles=1 host_bytes_per_s=125000000000.0 weight_bytes_per_s=150000000000.0 sram_bytes_per_cycle=27.68166089965398
meta {"batch": 2, "eps": 1e-300, "nested": {"a": [1, 2.5, null, true]}, "notes": ["tiny", "\u00b5-test"]}
input %"input ids" : int64[2, 6]
input %mask : bool[2, 6]
output %pooled
output_tree {"index": 0, "type": "tensor"}
%embed = embedding(%"input ids") @[0,0 4x4] : float16[2, 6, 16] routes=[ids, "embed->q"] colors=[0, 1] arrays={table: embed.table}
%"q\"proj\"" = sparse_matmul(%embed) @[0,0 4x4] : float16[2, 6, 16] nnz=26 routes=["embed->q", "q->masked"] colors=[1] attrs={"in_features": 16, "out_features": 16, "split": 2} arrays={col_ptr: qproj.col_ptr, col_ptr_off: qproj.col_ptr_off, nz_ptr: qproj.nz_ptr, out_hi: qproj.out_hi, out_lo: qproj.out_lo, row_idx: qproj.row_idx, values: qproj.values}
%masked = elementwise(%"q\"proj\"", %mask) @[0,0 4x4] : float16[2, 6, 16] routes=[mask, "q->masked", "masked->pooled"] colors=[0, 1, 2] attrs={"fn": "where", "scalar": -65504.0}
%pooled = reduce(%masked) @[0,0 4x1] : float32[2, 16] routes=["masked->pooled", out] colors=[0, 3] attrs={"dims": [1], "fn": "mean", "keepdim": false} source="x.mean(dim=1)\twith a tab"
route ids color=0 value=%"input ids" host -> [%embed] kind=value lanes=4 runs[0:4] step=0
route "embed->q" color=1 value=%embed %embed -> [%"q\"proj\""] kind=value lanes=4 runs[4:8] step=1
route mask color=2 value=%mask host -> [%masked] kind=value lanes=4 runs[8:12] step=2
route "q->masked" color=1 value=%"q\"proj\"" %"q\"proj\"" -> [%masked] kind=value lanes=4 runs[12:16] step=2
route "masked->pooled" color=0 value=%masked %masked -> [%pooled] kind=value lanes=4 runs[16:20] step=3
route out color=3 value=%pooled %pooled -> [host] kind=value lanes=1 runs[20:21] step=-1
array embed.table : float16[100, 16] bytes=3200
array qproj.values : float32[26] bytes=104
array qproj.row_idx : int16[26] bytes=52
array qproj.nz_ptr : int32[17] bytes=68
array qproj.col_ptr : int16[16] bytes=32
array qproj.col_ptr_off : int32[17] bytes=68
array qproj.out_lo : int32[16] bytes=64
array qproj.out_hi : int32[16] bytes=64
array routes.runs : int32[21, 10] bytes=840
array weights.fp8 : float8_e4m3[64] bytes=?
end kernels=4 routes=6 arrays=10 bytes=?
""".strip("\n")


DICT_OUTPUTS_TEXT = r"""
sparsefx.program 3
mesh 6x1 mode=pipelined placement=block
hardware name="wse2" sram_bytes=49152 wavelet_bits=32 link_wavelets_per_cycle=1 colors=24 clock_hz=850000000.0 simd_widths={"bfloat16": 4, "float16": 4, "float32": 2} task_start_cycles=8 vector_start_cycles=2 hop_cycles=1 host_bytes_per_s=150000000000.0 weight_bytes_per_s=150000000000.0 sram_bytes_per_cycle=27.68166089965398
meta {}
input %h : float32[4, 8]
output %logits
output %ln
output_tree {"children": [{"index": 0, "type": "tensor"}, {"index": 1, "type": "tensor"}], "keys": ["logits", "hidden"], "type": "dict"}
%ln = layer_norm(%h) @[0,0 2x1] : float32[4, 8] routes=[h, ln] colors=[0, 1] attrs={"eps": 1e-05, "lanes": 1} arrays={bias: ln.bias, weight: ln.weight}
%logits = softmax(%ln) @[2,0 1x1] : float32[4, 8] routes=[ln, logits] colors=[1, 2] attrs={"dim": -1}
%scale = constant() @[3,0 1x1] : float32[] routes=[] colors=[] arrays={value: scale.value}
route h color=0 value=%h host -> [%ln] kind=value lanes=1 runs[0:0] step=-1
route ln color=1 value=%ln %ln -> [%logits, host] kind=value lanes=1 runs[0:0] step=-1
route logits color=2 value=%logits %logits -> [host] kind=value lanes=1 runs[0:0] step=-1
array ln.weight : float32[8] bytes=32
array ln.bias : float32[8] bytes=32
array scale.value : float32[] bytes=4
end kernels=3 routes=3 arrays=3 bytes=68
""".strip("\n")


PROGRAMS = [(mlp, MLP_TEXT), (streaming, STREAMING_TEXT), (dict_outputs, DICT_OUTPUTS_TEXT)]
IDS = ["mlp", "streaming", "dict_outputs"]


def assert_same_program(got: DataflowProgram, want: DataflowProgram) -> None:
    for name in FIELDS:
        assert getattr(got, name) == getattr(want, name), name
    assert got.arrays == {}


@pytest.mark.parametrize(("build", "golden"), PROGRAMS, ids=IDS)
def test_prints_the_golden_text(build, golden: str) -> None:
    p = build()
    assert print_program(p) == golden
    assert str(p) == golden


@pytest.mark.parametrize(("build", "golden"), PROGRAMS, ids=IDS)
def test_print_parse_print(build, golden: str) -> None:
    q = parse_program(golden)
    assert print_program(q) == golden
    assert_same_program(q, build())
    assert not q.has_payloads
    q.verify()  # the checks that need no payloads


def test_payloads_do_not_change_the_text() -> None:
    p = mlp()
    assert p.has_payloads and set(p.arrays) == set(p.specs)
    q = parse_program(print_program(p))
    assert print_program(q) == print_program(p)
    assert q.specs == p.specs and q.arrays == {}


def test_types_and_non_default_hardware_round_trip() -> None:
    p, q = streaming(), parse_program(STREAMING_TEXT)
    assert q.hardware == p.hardware != HardwareSpec()
    assert q.hardware.simd_widths == {"float16": 8, "bfloat16": 8, "float32": 4}
    assert isinstance(q.hardware.clock_hz, float) and isinstance(q.hardware.sram_bytes, int)
    k = q.kernel('q"proj"')
    assert isinstance(k.inputs, tuple) and isinstance(k.shape, tuple) and k.stats == {"nnz": 26}
    assert q.kernel("pooled").source == "x.mean(dim=1)\twith a tab"
    assert q.meta["eps"] == 1e-300 and q.meta["notes"][1] == "µ-test"
    assert isinstance(q.routes[0].dsts, tuple) and q.routes[-1].step == -1
    assert q.specs["weights.fp8"] == ArraySpec("float8_e4m3", (64,))


def test_public_name() -> None:
    assert sparsefx.parse_program is parse_program
    assert "parse_program" in sparsefx.__all__


def test_blank_and_comment_lines_are_skipped() -> None:
    lines = MLP_TEXT.split("\n")
    text = "\n".join(["// the MLP", "", *lines[:7], "  // kernels", "", *lines[7:], ""])
    assert print_program(parse_program(text)) == MLP_TEXT


# -- errors -----------------------------------------------------------------------------------------------
def _replace(old: str, new: str) -> str:
    assert old in MLP_TEXT
    return MLP_TEXT.replace(old, new, 1)


def _lines(edit) -> str:
    lines = MLP_TEXT.split("\n")
    edit(lines)
    return "\n".join(lines)


BAD = [
    ("", "line 1: expected the header 'sparsefx.program 3'; the text ends"),
    ("hello world", "line 1, column 1: expected the header 'sparsefx.program 3'; found 'hello world'"),
    (_replace("sparsefx.program 3", "sparsefx.program 4"), "line 1, column 18: expected version 1, 2 or 3"),
    (
        _lines(lambda ls: ls.pop()),
        "line 31: expected an 'array' line or an 'end' line; the text ends (is it cut off?)",
    ),
    (_lines(lambda ls: ls.pop(2)), "line 3, column 1: expected a 'hardware' line; found 'meta {"),
    (_lines(lambda ls: ls.insert(13, ls.pop(8))), "line 14, column 1: expected a 'route' line or an 'array'"),
    (
        _lines(lambda ls: ls.append(ls[-1])),
        "line 33, column 1: expected nothing after the 'end' line; found 'end kernels=3",
    ),
    (
        _replace("mesh 8x2", "mesh 0x2"),
        "line 2, column 6: expected a mesh of at least 1x1 PEs (mesh width 0 is not valid",
    ),
    (
        _replace("mesh 8x2", "mesh 1000000x1000000"),
        "line 2, column 6: expected a mesh of at least 1x1 PEs (mesh 1000000x1000000 has "
        "1,000,000,000,000 PEs; sparsefx takes at most 893,064, as the largest preset, wse3 (762x1172), has; "
        "set the environment variable SPARSEFX_MAX_MESH_PES",
    ),
    (
        _replace("mesh 8x2", "mesh 30000x30000"),
        "(mesh 30000x30000 has 900,000,000 PEs; sparsefx takes at most",
    ),
    (_replace("mesh 8x2", "mesh 8y2"), "line 2, column 7: expected 'x'; found 'y2"),
    (_replace(" colors=24 ", " colors=0 "), "line 3, column 10: expected valid hardware (hardware colors 0"),
    (
        _replace(" colors=24 ", " colors=" + "9" * 30 + " "),
        "expected valid hardware (hardware colors " + "9" * 30 + " is not valid; it must be an int 1-65536",
    ),
    (
        _replace(" wavelet_bits=32 ", " wavelet_bits=4 "),
        "expected valid hardware (hardware wavelet_bits 4 is not valid; it must be a multiple of 8",
    ),
    (_replace(" colors=24 ", " "), "line 3, column 81: expected 'colors'; found 'clock_hz=850000000.0"),
    (
        _replace('meta {"model"', 'meta {"seed": 1, "model"'),
        "line 4, column 6: expected the meta object (the key 'seed' appears twice)",
    ),
    (
        _replace("meta {", "meta ["),
        'line 4, column 6: expected the meta object (Expecting \',\' delimiter); found \'["model": "MLP"',
    ),
    (
        _replace("input %x :", "input % x :"),
        "line 5, column 9: expected a value name right after '%'; found 'x : float32",
    ),
    (
        _replace("float32[8, 64]", "float32[8, 64"),
        "line 5, column 25: expected ',' or ']'; found 'end of line'",
    ),
    (_replace("float32[8, 64]", "float32[8, +64]"), "line 5, column 23: expected a dimension; found '+64]'"),
    (
        _replace("float32[8, 64]", "float32[8, -64]"),
        "line 5, column 23: expected a dimension (an integer >= 0); found '-64]'",
    ),
    (
        _replace("colors=[0, 1, 3]", "colors=[0, 1]"),
        "line 8, column 62: expected routes=[x.fc1, fc1.reduce, fc1.relu] colors=[0, 1, 3] (as the route lines give)",
    ),
    (
        _replace('stats={"flops": 3280', 'stats={"nnz": 1, "flops": 3280'),
        "line 8, column 446: expected stats without 'nnz' (it is written nnz=..., before routes); "
        'found \'stats={"nnz": 1, "flops": 3280\' in \'...[recv_x(color=0, trigger=data), reduce(',
    ),
    (
        _replace('source="fc1"', 'source="fc1'),
        "line 8, column 514: expected the source string (Unterminated string starting at); found '\"fc1'",
    ),
    (
        _replace('source="fc1"', "source=1"),
        "line 8, column 514: expected the source as a quoted string; found '1'",
    ),
    (
        _replace('source="fc1"', 'source="fc1" nnz=3'),
        "line 8, column 520: expected end of line (kernel fields: nnz, routes",
    ),
    (
        _replace("route x.fc1 color=0 value=%x host", "route x.fc1 color=0 value=%x %host"),
        "line 11, column 30: expected the host written as host, not %host",
    ),
    (
        _replace("-> [%fc1] kind=value lanes=2 runs[0:2]", "-> [%fc1] kind=value lanes=2 runs[0,2]"),
        "line 11, column 70: expected ':'; found ',2] step=-1'",
    ),
    (
        _replace("fc1.values : float32[205] bytes=820", "fc1.values : float32[205] bytes=821"),
        "line 16, column 39: expected the bytes of float32[205]: 820; found '821'",
    ),
    (
        _lines(lambda ls: ls.insert(16, ls[15])),
        "line 17, column 7: expected an array named once ('fc1.values' is listed twice)",
    ),
    (
        _replace("end kernels=3", "end kernels=4"),
        "line 32, column 5: expected kernels=3, as the lines above give; found 'kernels=4",
    ),
    (
        _replace("bytes=2286", "bytes=?"),
        "line 32, column 40: expected the arrays' total bytes: 2286; found '?'",
    ),
    (
        "sparsefx.program 2\nmeta " + "[" * 100_000,
        "line 2, column 1: expected a 'mesh' line; found 'meta [[[",
    ),
    (
        _replace("meta {", "meta " + "[" * 100_000 + "{"),
        "line 4, column 6: expected the meta object (maximum recursion depth exceeded",
    ),
    (_replace("mesh 8x2", "mesh " + "9" * 5000 + "x2"), "line 2, column 6: expected a width; found '99999"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_malformed_texts_say_where_and_what(text: str, message: str) -> None:
    with pytest.raises(ProgramFormatError) as info:
        parse_program(text)
    assert message in str(info.value)


def test_a_non_string_is_a_format_error() -> None:
    with pytest.raises(ProgramFormatError, match="a program text is a str, not bytes"):
        parse_program(MLP_TEXT.encode())  # type: ignore[arg-type]


# -- fuzzing ----------------------------------------------------------------------------------------------
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEXTS = [MLP_TEXT, STREAMING_TEXT, DICT_OUTPUTS_TEXT]
ALPHABET = '%@[](){}:,=-> "\\x0123456789.?/\nabhnNI\t\u00b5'


def _parses_or_format_error(text: str) -> None:
    """The only outcomes: a ``ProgramFormatError``, or a program that prints a text that round-trips and
    verifies or raises ``VerifyError`` (whatever sizes the text declares)."""
    try:
        q = parse_program(text)
    except ProgramFormatError:
        return
    again = print_program(q)
    assert print_program(parse_program(again)) == again
    with contextlib.suppress(VerifyError):
        q.verify()


_NUMBERS = ("0", "-1", "7", "65535", "1000000", "2147483648", "9" * 30)


def _mutate(text: str, rnd: random.Random, edits: int) -> str:
    lines = text.split("\n")
    for _ in range(edits):
        i = rnd.randrange(len(lines))
        what = rnd.choice(("delete", "duplicate", "swap", "flip", "flip", "flip", "cut", "number", "number"))
        if what == "number":  # a number of the line (a size, offset, count, step ...) becomes another
            spans = [m.span() for m in re.finditer(r"\d+", lines[i])]
            if spans:
                a, b = rnd.choice(spans)
                lines[i] = lines[i][:a] + rnd.choice(_NUMBERS) + lines[i][b:]
        elif what == "delete" and len(lines) > 1:
            del lines[i]
        elif what == "duplicate":
            lines.insert(i, lines[i])
        elif what == "swap":
            j = rnd.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif what == "cut":
            lines[i] = lines[i][: rnd.randrange(len(lines[i]) + 1)]
        elif lines[i]:
            k = rnd.randrange(len(lines[i]))
            lines[i] = lines[i][:k] + rnd.choice(ALPHABET) + lines[i][k + 1 :]
    return "\n".join(lines)


@FUZZ
@given(which=st.sampled_from(range(len(TEXTS))), seed=st.integers(0, 2**32), edits=st.integers(1, 4))
def test_fuzz_mutated_texts(which: int, seed: int, edits: int) -> None:
    _parses_or_format_error(_mutate(TEXTS[which], random.Random(seed), edits))


@FUZZ
@given(text=st.text(max_size=300) | st.text(alphabet=ALPHABET, max_size=300))
def test_fuzz_random_strings(text: str) -> None:
    _parses_or_format_error(text)
    _parses_or_format_error("sparsefx.program 2\n" + text)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)


@FUZZ
@given(names=st.lists(st.text(), min_size=4, max_size=4, unique=True), data=JSON, dtype=st.text())
def test_any_names_and_plain_json_round_trip(names: list[str], data: object, dtype: str) -> None:
    x, k, r, a = names
    p = DataflowProgram(MeshSpec(2, 2), HardwareSpec(clock_hz=0.1 + 0.2), "pipelined", "block")
    p.meta = {"data": data, "name": k}
    p.output_tree = data
    p.inputs.append(Stream(x, (2, 3), dtype))
    p.kernels.append(
        Kernel(
            k,
            dtype,
            Region(0, 0, 1, 1),
            (x,),
            (2,),
            dtype,
            {"data": data},
            {r: a},
            (Task(r, 1, a),),
            {"nnz": data},
            k,
        )
    )
    p.routes.append(Route(r, 0, x, "host", (k, "host"), kind=a))
    p.specs[a] = ArraySpec(dtype, (3,))
    text = print_program(p)
    q = parse_program(text)
    assert_same_program(q, p)
    assert print_program(q) == text


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "runs[2:4]",
            "runs[2:" + "9" * 40 + "]",
            r"route 'fc1.reduce' takes runs\[2:9{40}\]; 'routes.runs' has rows",
        ),
        ("runs[4:6]", "runs[4:1]", r"route 'fc1.relu' takes runs\[4:1\]"),
        (
            "runs[6:8] step=-1",
            "runs[6:8] step=" + "9" * 30,
            r"route 'relu.fc2' is used at step 9{30}; steps are -1",
        ),
        ("float32[8, 32] routes", "float32[8, " + "9" * 30 + "] routes", r"its value has shape \(8, 9{30}\)"),
        (
            '"lanes": 2, "out_features": 32',
            '"lanes": 2, "out_features": 1e300',
            r"attrs\['out_features'\] is 1e\+300",
        ),
        ("arrays={bias: fc1.bias, col_ptr: fc1.col_ptr, ", "arrays={bias: fc1.bias, ", r"col_ptr missing"),
        (
            "-> [%fc1] kind=internal",
            "-> [%nowhere] kind=internal",
            r"goes to 'nowhere', which is not a kernel",
        ),
    ],
)
def test_huge_and_garbage_sizes_in_a_text_are_verify_errors(old: str, new: str, message: str) -> None:
    """Sizes, offsets and counts the text declares parse as numbers; ``verify`` bounds them by name
    before anything they size is allocated."""
    assert MLP_TEXT.count(old) == 1
    program = parse_program(MLP_TEXT.replace(old, new))
    with pytest.raises(VerifyError, match=message):
        program.verify()


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_text_parses_with_the_default_hardware_fields(version: int) -> None:
    """Version 2 added ``vector_start_cycles`` to the hardware line and version 3
    ``sram_bytes_per_cycle``; an older text, which has not got them, still parses, the fields at their
    defaults, and prints back as the version this sparsefx writes."""
    old = MLP_TEXT.replace("sparsefx.program 3", f"sparsefx.program {version}")
    old = old.replace(" sram_bytes_per_cycle=27.68166089965398", "")
    if version == 1:
        old = old.replace(" vector_start_cycles=2", "")
    assert old != MLP_TEXT
    program = parse_program(old)
    assert program.hardware.vector_start_cycles == HardwareSpec().vector_start_cycles
    assert program.hardware.sram_bytes_per_cycle == HardwareSpec().sram_bytes_per_cycle
    assert print_program(program) == MLP_TEXT
