"""Every code block in the README and in the docs pages runs as written.

Blocks of one page run in order, in one temporary folder, Python blocks in one namespace, so a page
reads as one session: a block may use what an earlier one made (a model, a program file).

- ``python``: executed.
- ``sh`` / ``bash``: each command runs; ``sparsefx ...`` through ``sparsefx.cli.main`` in this process,
  and it must exit 0 (or the code a ``# exit N`` comment on its line names).
- ``yaml``: read by ``sparsefx.load_config``.
- A block without a language is output shown to the reader, not code.

An HTML comment on the line before a block changes that:

- ``<!-- doc-test: syntax-only (why) -->``: the block only has to parse (Python ``compile``, ``bash -n``),
  for blocks that need a GPU, several processes, a fresh virtualenv or minutes of work;
- ``<!-- doc-test: file NAME -->``: the block's text is also written to ``NAME`` for later blocks.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparsefx.cli import main
from sparsefx.config import load_config

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!-- doc-test: (syntax-only|file (\S+))\b.*-->$")
EXIT = re.compile(r"#\s*exit (\d+)")
LANGUAGES = {"python", "sh", "bash", "yaml", ""}


@dataclass
class Block:
    """One fenced block: its language, first line number, text and the marker before it."""

    language: str
    line: int
    text: str
    mark: str = ""
    file: str = ""


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` with the doc-test marker on the line before each, if any."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.match(before.strip())
        block = Block(fence.group(1), i + 1, "\n".join(lines[i + 1 : end]) + "\n")
        if mark:
            block.mark, block.file = mark.group(1).split()[0], mark.group(2) or ""
        out.append(block)
        i = end + 1
    return out


def commands(text: str) -> list[tuple[list[str], int]]:
    """The shell commands of a block as argv lists, with the exit code each expects."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        code = EXIT.search(line)
        argv = shlex.split(line, comments=True)
        if argv:
            out.append((argv, int(code.group(1)) if code else 0))
    return out


def _run_shell(block: Block, where: str) -> None:
    for argv, code in commands(block.text):
        assert argv[0] == "sparsefx", (
            f"{where}: only sparsefx commands run here; mark the block syntax-only: {shlex.join(argv)}"
        )
        got = main(argv[1:])
        assert got == code, f"{where}: {shlex.join(argv)} exited {got}, expected {code}"


def _check_syntax(block: Block, where: str) -> None:
    if block.language == "python":
        compile(block.text, where, "exec")
    elif block.language in ("sh", "bash"):
        subprocess.run(["bash", "-n"], input=block.text, text=True, check=True)
    elif block.language == "yaml":
        load_config(block.text)


def run_block(block: Block, where: str, namespace: dict) -> None:
    """Run one block (module docstring) in the current folder."""
    if block.file:
        Path(block.file).write_text(block.text)
    if block.mark == "syntax-only" or not block.language:
        _check_syntax(block, where)
    elif block.language == "python":
        exec(compile(block.text, where, "exec"), namespace)
    elif block.language == "yaml":
        load_config(block.text)
    else:
        _run_shell(block, where)


def test_every_block_has_a_known_language():
    for page in PAGES:
        for block in blocks(page):
            assert block.language in LANGUAGES, f"{page.name}:{block.line}: ```{block.language}"


def test_the_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in readme, f"README does not link docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": "__doc_block__"}
    for block in blocks(page):
        run_block(block, f"{page.name}:{block.line}", namespace)
