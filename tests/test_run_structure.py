"""``sparsefx.run``'s outputs keep the model's own structure (caches included), and ``run`` takes every input
form ``lower`` took (non-tensor arguments equal to the lowered ones).

Real Hugging Face models from small configs (no downloads): GPT-2, LLaMA and T5 with their key/value caches,
compiled at 0.9, lowered streaming on a small mesh, run on fresh inputs with both executors and compared
with the compiled model all the way down; programs saved and loaded, printed and parsed.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import warnings
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import save_file
from torch import nn

import sparsefx
from sparsefx.cli import main
from sparsefx.errors import EmulationError
from sparsefx.runtime.evaluate import evaluate
from sparsefx.runtime.outputs import rebuild_outputs
from sparsefx.trees import tensor_leaves

VOCAB = 128
MESH = (4, 4)
EXECUTORS = ("fast", "reference")


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, use_cache=True,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32, use_cache=True,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _t5() -> nn.Module:
    config = transformers.T5Config(
        num_layers=2, num_decoder_layers=2, d_model=32, d_kv=16, num_heads=2, d_ff=64, vocab_size=VOCAB,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, use_cache=True,
    )  # fmt: skip
    return transformers.T5ForConditionalGeneration(config)


MODELS = {"gpt2": _gpt2, "llama": _llama, "t5": _t5}
_GPT2_ARGS = inspect.signature(transformers.GPT2LMHeadModel.forward).parameters
CACHE = "cache" if "cache" in _GPT2_ARGS else "past_key_values"
"""The name of the cache argument and output field in this ``transformers`` version."""


def _cache(outputs: Any) -> Any:
    return outputs[CACHE]


def _call(name: str, seed: int) -> dict[str, Any]:
    """A call of model ``name``: 8 tokens (and 4 decoder tokens for T5), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    call = {"input_ids": torch.randint(0, VOCAB, (1, 8), generator=g)}
    if name == "t5":
        call["decoder_input_ids"] = torch.randint(0, VOCAB, (1, 4), generator=g)
    return call


@pytest.fixture(scope="module")
def cached() -> dict[str, tuple[Any, sparsefx.DataflowProgram]]:
    """``{name: (sm, program)}``: each model with its cache, at 0.9, lowered streaming (GPT-2 for a call
    with ``use_cache=True``)."""
    out = {}
    for name, build in MODELS.items():
        torch.manual_seed(0)
        sm = sparsefx.compile(build().eval(), 0.9, _call(name, 0))
        assert sm.capture_method == "export", sm.capture_log
        call = _call(name, 0) | ({"use_cache": True} if name == "gpt2" else {})
        out[name] = sm, sparsefx.lower(sm, call, mesh=MESH, mode="streaming", placement="block")
    return out


def _forward(sm: Any, call: dict[str, Any]) -> Any:
    with torch.no_grad():
        return sm.eval()(**call)


def assert_same(got: Any, want: Any, where: str = "outputs") -> None:
    """``got`` has ``want``'s type and structure all the way down (caches by their layers, in order), and
    its tensors ``want``'s values."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} is not {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{where}: {m}")
    elif isinstance(want, transformers.EncoderDecoderCache):
        assert_same(got.self_attention_cache, want.self_attention_cache, f"{where}.self_attention_cache")
        assert_same(got.cross_attention_cache, want.cross_attention_cache, f"{where}.cross_attention_cache")
    elif isinstance(want, transformers.DynamicCache):
        assert got.get_seq_length() == want.get_seq_length() and len(got.layers) == len(want.layers), where
        for i, (a, b) in enumerate(zip(got.layers, want.layers)):
            assert type(a) is type(b), f"{where}.layers[{i}]"
            assert_same(a.keys, b.keys, f"{where}.layers[{i}].keys")
            assert_same(a.values, b.values, f"{where}.layers[{i}].values")
    elif isinstance(want, dict):  # ModelOutput included
        assert list(got.keys()) == list(want.keys()), f"{where}: keys {list(got)} != {list(want)}"
        for k in want:
            assert_same(got[k], want[k], f"{where}.{k}")
    elif dataclasses.is_dataclass(want):
        for f in dataclasses.fields(want):
            assert_same(getattr(got, f.name), getattr(want, f.name), f"{where}.{f.name}")
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert got == want, where


# -- item 3: outputs keep the model's structure --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
def test_outputs_have_the_models_structure_caches_included(cached, name: str) -> None:
    sm, program = cached[name]
    call = _call(name, 1)  # fresh inputs
    want = _forward(sm, call)
    assert isinstance(_cache(want), transformers.Cache)
    for executor in EXECUTORS:
        got = sparsefx.run(program, call, executor=executor).outputs
        assert_same(got, want, f"{name} {executor}")
        assert _cache(got).get_seq_length() == _cache(want).get_seq_length() > 0
        assert len(tensor_leaves(got)) == len(tensor_leaves(want)) == len(program.outputs)


def test_t5s_cache_keeps_self_attention_first(cached) -> None:
    """``EncoderDecoderCache(self, cross)``: the program's outputs keep the two where the model has them."""
    sm, program = cached["t5"]
    got = _cache(sparsefx.run(program, _call("t5", 2)).outputs)
    assert got.self_attention_cache.get_seq_length() == 4  # the decoder's tokens
    assert got.cross_attention_cache.get_seq_length() == 8  # the encoder's
    assert [len(c) for c in got] == [6] * 2  # per layer: self k, v, sliding; cross k, v, sliding


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_a_returned_cache_feeds_back_into_the_compiled_model(cached, name: str) -> None:
    sm, program = cached[name]
    call = _call(name, 3)
    mine = _cache(sparsefx.run(program, call).outputs)
    theirs = _cache(_forward(sm, call))
    step = {"decoder_input_ids": torch.tensor([[5]])} if name == "t5" else {"input_ids": torch.tensor([[5]])}
    if name == "t5":
        step["input_ids"] = call["input_ids"]
    got = _forward(sm, step | {CACHE: mine})
    want = _forward(sm, step | {CACHE: theirs})
    assert_same(got, want, f"{name} fed its cache back")
    assert _cache(got).get_seq_length() == (5 if name == "t5" else 9)


def test_saved_loaded_and_parsed_programs_keep_the_structure(cached, tmp_path) -> None:
    """Every class in these outputs is on the allow-list: a program file and the text form rebuild them."""
    sm, program = cached["t5"]
    call = _call("t5", 4)
    want = _forward(sm, call)
    path = tmp_path / "t5.sfxp"
    program.save(str(path))
    loaded = sparsefx.load_program(str(path))
    assert loaded.output_spec is None and loaded.output_tree == program.output_tree
    parsed = sparsefx.parse_program(str(program))
    assert parsed.output_tree == program.output_tree and parsed.meta == program.meta
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rebuilt whole: nothing to warn about
        assert_same(sparsefx.run(loaded, call).outputs, want, "loaded")  # both executors assemble alike
        values: dict[str, torch.Tensor] = {}
        evaluate(loaded, call, listener=lambda k, _, result: values.__setitem__(k.name, result))
        rebuilt = rebuild_outputs(parsed.output_tree, [values[n] for n in parsed.outputs], parsed.output_spec)
        assert_same(rebuilt, want, "parsed")


@dataclasses.dataclass
class Pair:
    """A user's own output class: not on the allow-list of classes a program file may name."""

    first: torch.Tensor
    second: torch.Tensor


class _PairModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> Pair:
        y = self.fc(x)
        return Pair(y, y.relu())


def test_a_class_off_the_allow_list_is_rebuilt_in_process_and_a_dict_from_a_file(tmp_path) -> None:
    x = torch.randn(2, 8)
    sm = sparsefx.compile(_PairModel(), 0.5, (x,), capture_method="export")
    program = sparsefx.lower(sm, x, mesh=(4, 4))
    want = _forward(sm, {"x": x})
    assert type(want) is Pair
    for executor in EXECUTORS:  # the process that lowered it knows the class
        assert_same(sparsefx.run(program, x, executor=executor).outputs, want, executor)
    path = tmp_path / "pair.sfxp"
    program.save(str(path))
    loaded = sparsefx.load_program(str(path))
    with pytest.warns(UserWarning, match=re.escape(f"{__name__}.Pair")):
        got = sparsefx.run(loaded, x).outputs
    assert type(got) is dict and list(got) == ["first", "second"]
    assert_same(got["second"], want.second)


def test_a_hostile_class_name_in_a_program_file_is_never_built(tmp_path) -> None:
    x = torch.randn(2, 8)
    sm = sparsefx.compile(nn.Sequential(nn.Linear(8, 8)), 0.5, (x,))
    program = sparsefx.lower(sm, x, mesh=(4, 4))
    program.output_tree = {
        "type": "object",
        "class": "subprocess.Popen",
        "keys": ["args", "out"],
        "items": [{"type": "const", "value": ["false"]}, {"type": "tensor", "index": 0}],
    }
    path = tmp_path / "hostile.sfxp"
    program.save(str(path))
    with pytest.warns(UserWarning, match="subprocess.Popen"):
        got = sparsefx.run(sparsefx.load_program(str(path)), x).outputs
    assert type(got) is dict and got["args"] == ["false"]
    program.output_tree = {"type": "list", "items": [program.output_tree] * 1}
    for _ in range(80):
        program.output_tree = {"type": "list", "items": [program.output_tree]}
    with pytest.raises(EmulationError, match="nested deeper than"):
        sparsefx.run(program, x)


def test_a_class_path_in_a_tree_imports_nothing() -> None:
    """``transformers`` imports its submodules lazily on attribute access: a path a file names must not."""
    before = set(sys.modules)
    for name in ("transformers.BertModel", "transformers.models.whisper.modeling_whisper.WhisperModel"):
        tree = {"type": "dataclass", "class": name, "keys": [], "items": []}
        with pytest.warns(UserWarning, match=re.escape(name)):
            assert rebuild_outputs(tree, []) == {}
    assert set(sys.modules) == before


# -- item 4: run takes every input form lower took -------------------------------------------------------


class _Flagged(nn.Module):
    """A forward with a flag, a size, a string and an optional argument besides its tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, flag: bool = False, scale: int = 1, how: str = "a", extra=None):
        y = self.fc(x) * scale
        if flag:
            y = y.relu()
        return y + 1 if how == "b" else y


@pytest.fixture(scope="module")
def flagged() -> tuple[Any, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    return sparsefx.compile(_Flagged(), 0.5, (x,)), x


@pytest.mark.parametrize("lowered", ["positional", "keywords", "every kind"])
def test_run_takes_the_non_tensor_arguments_lower_took(flagged, lowered: str) -> None:
    sm, x = flagged
    calls = {
        "positional": ((x, True), {}),
        "keywords": ((), {"x": x, "flag": True, "scale": 3}),
        "every kind": ((), {"x": x, "flag": True, "scale": 2, "how": "b", "extra": None}),
    }
    args, kwargs = calls[lowered]
    program = sparsefx.lower(sm, args or kwargs, mesh=(4, 4))
    x2 = torch.randn(2, 8)  # fresh inputs
    same = (x2, *args[1:]) if args else kwargs | {"x": x2}
    with torch.no_grad():
        want = sm.eval()(*same) if args else sm.eval()(**same)
    for executor in EXECUTORS:
        assert_same(sparsefx.run(program, same, executor=executor).outputs, want, executor)
    assert_same(sparsefx.run(program, {"x": x2}).outputs, want, "left out: as lowered")
    with pytest.raises(EmulationError, match=r"'flag' is False; the program was lowered with flag=True"):
        sparsefx.run(program, (x2, False) if args else kwargs | {"x": x2, "flag": False})
    with pytest.raises(EmulationError, match=r"'flag' is 1; the program was lowered with flag=True"):
        sparsefx.run(program, {"x": x2, "flag": 1})  # an int is not the bool it was lowered with
    with pytest.raises(EmulationError, match=r"'other' is 3, and the program was lowered without it"):
        sparsefx.run(program, {"x": x2, "other": 3})
    how = kwargs.get("how", "a")
    with pytest.raises(EmulationError, match=rf"'how' is 'c'; the program was lowered with how={how!r}"):
        sparsefx.run(program, {"x": x2, "how": "c"})


def test_a_program_file_keeps_its_non_tensor_arguments_and_the_cli_runs_it(flagged, tmp_path, capsys) -> None:
    sm, x = flagged
    program = sparsefx.lower(sm, {"x": x, "flag": True, "how": "b"}, mesh=(4, 4))
    path = tmp_path / "flagged.sfxp"
    program.save(str(path))
    loaded = sparsefx.load_program(str(path))
    assert loaded.meta["constant_inputs"] == program.meta["constant_inputs"]
    want = _forward(sm, {"x": x, "flag": True, "how": "b"})
    assert_same(sparsefx.run(loaded, (x, True, 1, "b")).outputs, want, "positional")
    with pytest.raises(EmulationError, match=r"'how' is 'a'; the program was lowered with how='b'"):
        sparsefx.run(loaded, (x, True, 1, "a"))
    inputs = tmp_path / "x.safetensors"
    save_file({"x": x}, str(inputs))  # a file holds tensors only: the program runs as lowered
    assert main(["run", str(path), "--inputs", str(inputs), "--format", "json"]) == 0
    assert '"cycles"' in capsys.readouterr().out


@pytest.mark.parametrize("use_cache", [False, True])
def test_gpt2_runs_with_the_use_cache_it_was_lowered_with(cached, use_cache: bool) -> None:
    sm, program = cached["gpt2"]
    call = _call("gpt2", 5) | {"use_cache": use_cache}
    if not use_cache:  # the fixture's GPT-2 was lowered with use_cache=True
        program = sparsefx.lower(sm, call, mesh=MESH, mode="streaming", placement="block")
    want = _forward(sm, call)
    assert (CACHE in want) is use_cache
    for executor in EXECUTORS:
        assert_same(sparsefx.run(program, call, executor=executor).outputs, want, executor)
    flipped = call | {"use_cache": not use_cache}
    with pytest.raises(EmulationError, match=rf"'use_cache' is {not use_cache}; .* use_cache={use_cache}"):
        sparsefx.run(program, flipped)
