"""Claims the README makes in prose, held to the tests that back them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

EXPORT_TESTS = {
    "GPT-2": ("test_hf_models.py", "tiny_gpt2_config"),
    "BERT": ("test_hf_models.py", "tiny_bert_config"),
    "LLaMA": ("test_run_structure.py", "LlamaConfig"),
    "T5": ("test_run_structure.py", "T5Config"),
    "ResNet": ("test_batchnorm_models.py", "ResNetConfig"),
}
"""Each Hugging Face family the README says is tested through export: the test file that builds it and
the name that file builds it with."""


def _listed_families() -> list[str]:
    sentence = re.search(r"tested through `torch.export` \(built from small configs\): ([^.]+)\.", README)
    assert sentence, "the README no longer lists the model families tested through export"
    return [f.strip() for f in re.split(r",| and ", sentence.group(1)) if f.strip()]


def test_every_family_the_readme_lists_is_captured_by_export_in_a_test():
    listed = _listed_families()
    assert sorted(listed) == sorted(EXPORT_TESTS), "README list and EXPORT_TESTS differ"
    for family in listed:
        file, name = EXPORT_TESTS[family]
        text = (ROOT / "tests" / file).read_text()
        assert name in text, f"{file} does not build {family} ({name})"
        assert 'capture_method == "export"' in text or '"export"' in text, f"{file} does not use export"
