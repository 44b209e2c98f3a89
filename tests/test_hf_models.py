"""Real Hugging Face models from their configs (no downloads), compiled and called like the originals."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.utils._pytree as pytree
import transformers

import sparsefx
from conftest import HF_VOCAB, assert_outputs_close, reference_forward, tiny_bert_config, tiny_gpt2_config

VOCAB = HF_VOCAB


def gpt2(use_cache: bool) -> torch.nn.Module:
    config = tiny_gpt2_config(use_cache=use_cache, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def bert() -> torch.nn.Module:
    config = tiny_bert_config()
    return transformers.BertForMaskedLM(config)


def tokens(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq))


MODELS = {"gpt2": lambda: gpt2(use_cache=False), "bert": bert}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_mode_switch_and_other_calls_match_the_masked_original(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = MODELS[name]().train()
    reference = copy.deepcopy(model)
    sm = sparsefx.compile(model, 0.5, (tokens(2, 12),))
    assert sm.capture_method == "export"

    sm.eval()
    reference.eval()
    x = tokens(2, 12)
    first, second = sm(x), sm(x)
    assert_outputs_close(first, second)
    assert_outputs_close(first, reference_forward(reference, sm.masks, (x,), {}), atol=1e-5)

    x = tokens(3, 9)
    attention = torch.ones(3, 9, dtype=torch.long)
    attention[:, -3:] = 0
    calls = [((), {"input_ids": x}), ((x,), {"attention_mask": attention}), ((x,), {"labels": x})]
    with caplog.at_level(logging.INFO, logger="sparsefx"):
        for args, kwargs in calls:
            want = reference_forward(reference, sm.masks, args, kwargs)
            assert_outputs_close(sm(*args, **kwargs), want, atol=1e-5)
    assert sum("captured the model again" in r.getMessage() for r in caplog.records) == len(calls)

    sm.train()
    reference.train()
    torch.manual_seed(3)
    got = sm(x, labels=x)
    torch.manual_seed(3)
    want = reference_forward(reference, sm.masks, (x,), {"labels": x})
    assert_outputs_close(got, want, atol=1e-5)
    got.loss.backward()
    grad = sm.get_parameter(next(iter(sm.masks))).grad
    assert grad is not None and bool((grad[~next(iter(sm.masks.values()))] == 0).all())


def test_gpt2_with_its_key_value_cache_is_exported_whole() -> None:
    model = gpt2(use_cache=True).eval()
    reference = copy.deepcopy(model)
    x = tokens(2, 10)
    sm = sparsefx.compile(model, 0.5, (x,))
    assert sm.capture_method == "export", sm.capture_log
    out = sm(x)
    want = reference_forward(reference, sm.masks, (x,), {})
    torch.testing.assert_close(out.logits, want.logits, atol=1e-5, rtol=1e-5)
    assert type(out.past_key_values) is type(want.past_key_values)
    got_cache, want_cache = pytree.tree_leaves(out.past_key_values), pytree.tree_leaves(want.past_key_values)
    assert len(got_cache) == len(want_cache) == 4  # keys and values of two layers
    for a, b in zip(got_cache, want_cache):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
