"""Shared helpers: the PyTorch reference every compiled model is compared against."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call

from sparsefx.trees import tensor_leaves

if os.environ.get("PYTEST_XDIST_WORKER"):  # the suite runs in parallel workers: one thread each
    torch.set_num_threads(1)


def reference_forward(model: nn.Module, masks: dict[str, torch.Tensor], args: tuple, kwargs: dict) -> Any:
    """The original model run with ``weight * mask`` for every sparse weight."""
    params = dict(model.named_parameters())
    masked = {name: params[name] * mask for name, mask in masks.items()}
    return functional_call(model, masked, args, kwargs)


def assert_outputs_close(got: Any, want: Any, atol: float = 1e-6, rtol: float = 1e-5) -> None:
    assert type(got) is type(want), f"output type {type(got)} != {type(want)}"
    g, w = tensor_leaves(got), tensor_leaves(want)
    assert len(g) == len(w) and g, "output structure differs"
    for a, b in zip(g, w):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


LOWER_MESH = {"mlp": (16, 16), "cnn": (64, 64), "gpt-tiny": (64, 64)}
"""The built-in models the lowering and emulation tests run, and a mesh each fits pipelined."""


def compile_builtins() -> dict[str, tuple[Any, tuple]]:
    """``{name: (sparsefx.compile(model, 0.9, args), args)}`` for every model in ``LOWER_MESH``."""
    import sparsefx
    from sparsefx.models import build_model

    torch.manual_seed(0)
    out = {}
    for name in LOWER_MESH:
        spec = build_model(name)
        out[name] = (sparsefx.compile(spec.model, 0.9, spec.args), spec.args)
    return out


def as_csc(program: Any) -> Any:
    """``program`` (changed in place) with every packed sparse matmul stored as CSC instead, as files
    before format 4 hold it."""
    from sparsefx.runtime.encoding import CSC_ROLES, PACKED_ROLES, is_packed, sparse_arrays

    for k in program.kernels:
        if k.op == "sparse_matmul" and is_packed(k.arrays):
            csc = sparse_arrays(program, k)
            for role in PACKED_ROLES:
                name = k.arrays.pop(role)
                program.arrays.pop(name), program.specs.pop(name)
            for role in CSC_ROLES:
                k.arrays[role] = program.add_array(f"{k.name}.{role}", csc[role])
    return program


HF_VOCAB = 300
"""Vocabulary of the small Hugging Face models the tests build from their configs."""


def tiny_gpt2_config(**overrides: Any) -> Any:
    """A two-layer, 32-wide ``transformers.GPT2Config`` (no download); ``overrides`` set other fields."""
    import transformers

    fields = dict(n_layer=2, n_embd=32, n_head=2, vocab_size=HF_VOCAB, n_positions=32, use_cache=False)
    return transformers.GPT2Config(**(fields | overrides))


def tiny_llama_config(**overrides: Any) -> Any:
    """A two-layer, 32-wide ``transformers.LlamaConfig`` (no download); ``overrides`` set other fields."""
    import transformers

    fields = dict(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=HF_VOCAB,
        max_position_embeddings=32,
    )
    return transformers.LlamaConfig(**(fields | overrides))


def tiny_bert_config() -> Any:
    """A two-layer, 32-wide ``transformers.BertConfig`` (no download)."""
    import transformers

    return transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=HF_VOCAB,
        max_position_embeddings=32,
    )


def benchmark_module(script: str) -> Any:
    """``benchmarks/<script>.py`` imported as ``<script>_benchmark`` (registered in ``sys.modules``:
    dataclasses look their module up by name), with ``benchmarks/`` on the path for its own imports.
    Light: the benchmarks load torch models and the lowering only when they measure."""
    import importlib.util
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    name = f"{script}_benchmark"
    spec = importlib.util.spec_from_file_location(name, folder / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def cli_in_process(argv: list[str], env: dict[str, str | None], cwd: Any = None) -> Any:
    """``sparsefx ARGV`` through ``cli.main`` in this process, as a fresh process without a terminal
    would run it: stdin, stdout and stderr are buffers, ``env`` sets (a string) or unsets (None)
    variables, in folder ``cwd`` if given. All is as it was afterwards. A ``CompletedProcess``."""
    import contextlib
    import io
    import subprocess
    import sys

    from sparsefx import cli

    saved, here, stdin = {k: os.environ.get(k) for k in env}, os.getcwd(), sys.stdin
    out, err = io.StringIO(), io.StringIO()
    try:
        _set_env(env)
        sys.stdin = io.StringIO()
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    finally:
        os.chdir(here)
        sys.stdin = stdin
        _set_env(saved)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def _set_env(values: dict[str, str | None]) -> None:
    """Set each variable to its string, or unset it where None."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
