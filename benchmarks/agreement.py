"""How closely the fast clock agrees with the event-driven reference, on a named corpus.

The corpus: the built-in MLP, CNN and GPT (gpt-tiny), and Hugging Face GPT-2 (with and without its
cache), BERT, LLaMA, ViT and ResNet from small configs (no downloads); each streaming on 16x16 and
pipelined on a mesh wide enough for it, in both placements, on inputs with no zeros, with structured
zeros (every other feature) and with seeded random zeros (half the elements); a model whose inputs are
token ids has no elements to zero, so it runs once per program (68 cases in all). For every case it prints
fast / reference total cycles and the worst kernel's span gap (against 5% or 16 cycles, whichever is
larger), then the worst case of each.

    .venv/bin/python benchmarks/agreement.py                  # ~10 minutes
    .venv/bin/python benchmarks/agreement.py --models mlp gpt2 --json out/agreement.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from _timing import console, print_table, write_json

import sparsefx

VOCAB = 300
TOTAL = 0.05
SPAN = 0.05
SPAN_CYCLES = 16


def _hf(name: str) -> tuple[torch.nn.Module, tuple]:
    import transformers as tf

    ids = torch.randint(0, VOCAB, (1, 8))
    small = dict(vocab_size=VOCAB)
    if name in ("gpt2", "gpt2-cache"):
        config = tf.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, n_positions=32, use_cache=name == "gpt2-cache", **small
        )
        return tf.GPT2LMHeadModel(config).eval(), (ids,)
    if name == "bert":
        config = tf.BertConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32, **small,
        )  # fmt: skip
        return tf.BertModel(config).eval(), (ids,)
    if name == "llama":
        config = tf.LlamaConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
            intermediate_size=64, max_position_embeddings=32, use_cache=False, **small,
        )  # fmt: skip
        return tf.LlamaForCausalLM(config).eval(), (ids,)
    if name == "vit":
        config = tf.ViTConfig(
            image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64,
        )  # fmt: skip
        return tf.ViTModel(config).eval(), (torch.randn(1, 3, 16, 16),)
    if name == "resnet":
        config = tf.ResNetConfig(
            num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"
        )
        return tf.ResNetModel(config).eval(), (torch.randn(1, 3, 16, 16),)
    raise ValueError(name)


def _builtin(name: str) -> tuple[torch.nn.Module, tuple]:
    from sparsefx.models import build_model

    spec = build_model(name)
    return spec.model, spec.args


MODELS: dict[str, tuple[Callable[[str], tuple[torch.nn.Module, tuple]], tuple[int, int]]] = {
    "mlp": (_builtin, (16, 16)),
    "cnn": (_builtin, (64, 64)),
    "gpt-tiny": (_builtin, (64, 64)),
    "gpt2": (_hf, (128, 16)),
    "gpt2-cache": (_hf, (128, 16)),
    "bert": (_hf, (128, 16)),
    "llama": (_hf, (128, 16)),
    "vit": (_hf, (128, 16)),
    "resnet": (_hf, (64, 32)),
}


def _float(a: Any) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


def _inputs(args: tuple, kind: str, seed: int) -> tuple:
    """``args`` with float inputs zeroed: ``none``, ``every-other`` feature, or a seeded ``random`` half."""
    out = []
    g = torch.Generator().manual_seed(seed)
    for a in args:
        if not _float(a):
            out.append(a)
            continue
        a = torch.randn(a.shape, generator=g)
        if kind == "every-other":
            a[..., ::2] = 0
        elif kind == "random":
            a[torch.rand(a.shape, generator=g) < 0.5] = 0
        out.append(a)
    return tuple(out)


def _case(program: sparsefx.DataflowProgram, args: tuple) -> dict[str, Any]:
    fast = sparsefx.run(program, args).stats
    ref = sparsefx.run(program, args, executor="reference").stats
    worst, name = 0.0, ""
    for kf, kr in zip(fast.kernels, ref.kernels):
        a, b = kf.end - kf.start, kr.end - kr.start
        gap = abs(a - b) / max(SPAN * b, SPAN_CYCLES) * SPAN  # in units of the span tolerance's 5%
        if gap > worst:
            worst, name = gap, kf.name
    return {
        "fast": fast.cycles,
        "reference": ref.cycles,
        "ratio": fast.cycles / ref.cycles,
        "span": worst,
        "kernel": name,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--inputs", nargs="+", default=["none", "every-other", "random"])
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    torch.set_num_threads(1)
    console.print("settings: 90% static sparsity, seed 0; fast / reference total cycles, worst span gap")
    rows, results = [], []
    for name in args.models:
        build, wide = MODELS[name]
        torch.manual_seed(0)
        model, margs = build(name)
        sm = sparsefx.compile(model, 0.9, margs)
        kinds = args.inputs if any(_float(a) for a in margs) else args.inputs[:1]
        if len(kinds) < len(args.inputs):  # token ids: a zero pattern would leave them as they are
            console.print(f"{name}: its inputs are token ids, so it runs once ({kinds[0]} zeros)")
        for mode, mesh in (("streaming", (16, 16)), ("pipelined", wide)):
            for placement in ("block", "balanced"):
                try:
                    program = sparsefx.lower(sm, margs, mesh=mesh, mode=mode, placement=placement)
                except sparsefx.SparseFXError as e:
                    console.print(f"{name} {mode} {placement}: not lowered ({e})")
                    continue
                for kind in kinds:
                    t0 = time.perf_counter()
                    r = _case(program, _inputs(margs, kind, 0))
                    r.update(
                        model=name, mode=mode, mesh=f"{mesh[0]}x{mesh[1]}", placement=placement, inputs=kind
                    )
                    r["seconds"] = time.perf_counter() - t0
                    results.append(r)
                    console.print(
                        f"{name} {mode} {r['mesh']} {placement} {kind}: {r['fast']} / {r['reference']} = "
                        f"{r['ratio']:.3f}, worst span gap {r['span']:.3f} ({r['kernel']}), "
                        f"{r['seconds']:.0f} s"
                    )
                    rows.append([name, mode, r["mesh"], placement, kind, str(r["fast"]), str(r["reference"]),
                                 f"{r['ratio']:.3f}", f"{r['span']:.3f} ({r['kernel']})"])  # fmt: skip
    print_table("fast vs reference", ["model", "mode", "mesh", "placement", "inputs", "fast", "reference",
                                      "ratio", "worst span gap"], rows)  # fmt: skip
    worst = max(results, key=lambda r: abs(r["ratio"] - 1))
    within = sum(abs(r["ratio"] - 1) <= TOTAL for r in results)
    console.print(
        f"total cycles within {TOTAL:.0%}: {within} of {len(results)}; worst {worst['ratio']:.3f} "
        f"({worst['model']} {worst['mode']} {worst['placement']} {worst['inputs']})"
    )
    spans = sum(r["span"] <= SPAN for r in results)
    console.print(f"every kernel's span within 5% or {SPAN_CYCLES} cycles: {spans} of {len(results)}")
    if args.json:
        write_json(args.json, {"cases": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
