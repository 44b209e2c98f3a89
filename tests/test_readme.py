"""The README's quick start runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs(capsys: object) -> None:
    text = README.read_text()
    quick = text.split("## Quick start", 1)[1]
    code = re.search(r"```python\n(.*?)```", quick, re.S).group(1)  # type: ignore[union-attr]
    assert len(code.strip().splitlines()) <= 12
    exec(compile(code, "README quick start", "exec"), {})
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "ParamReport(name='blocks.0.attn.qkv.weight'" in out
