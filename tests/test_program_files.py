"""Program files (runtime/archive.py): round trips, determinism, memory mapping, atomic writes, bad input.

Bad files are built from a valid one: its members are read, changed and packed again with ``zipfile``
(``_pack``), with the manifest's hashes recomputed where a test wants to get past them (``_rehash``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import random
import re
import struct
import subprocess
import sys
import time
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

import sparsefx
from conftest import as_csc
from sparsefx.errors import ProgramFormatError, ProgramWriteError, SparseFXError, VerifyError
from sparsefx.runtime import archive, archive_write
from sparsefx.runtime.archive import load_program, save_program
from sparsefx.runtime.dataflow import DataflowProgram
from sparsefx.runtime.mesh import Dir, HardwareSpec, MeshSpec
from sparsefx.runtime.program import Kernel, Region, Route, Stream, Task
from sparsefx.runtime.text import print_program

MANIFEST, TEXT, TENSORS = archive.MEMBERS


def _program() -> DataflowProgram:
    """A small program with kernels, routes and arrays of every kind of dtype (and an empty one)."""
    p = DataflowProgram(
        MeshSpec(4, 2),
        HardwareSpec(),
        "pipelined",
        "block",
        inputs=[Stream("x", (2, 4), "float32")],
        outputs=["relu"],
        output_tree={"type": "tensor", "index": 0},
        meta={"model": "tiny"},
    )
    fc = Kernel(
        "fc",
        "sparse_matmul",
        Region(0, 0, 2, 1),
        ("x",),
        (2, 4),
        "float32",
        attrs={"in_features": 4, "out_features": 4},
        arrays={"values": "fc.values", "row_idx": "fc.row_idx", "nz_ptr": "fc.nz_ptr"},
        tasks=(Task("recv", 0),),
        stats={"nnz": 6},
        source="fc",
    )
    relu = Kernel("relu", "elementwise", Region(2, 0, 2, 1), ("fc",), (2, 4), "float32", attrs={"fn": "relu"})
    p.kernels += [fc, relu]
    p.routes += [
        Route("x.fc", 0, "x", "host", ("fc",), first=0, count=1),
        Route("fc.relu", 1, "fc", "fc", ("relu",), first=1, count=1),
    ]
    p.add_array("fc.values", torch.randn(6, generator=torch.Generator().manual_seed(0)))
    p.add_array("fc.row_idx", torch.tensor([0, 2, 1, 3, 0, 1], dtype=torch.int16))
    p.add_array("fc.nz_ptr", torch.tensor([0, 3, 6], dtype=torch.int32))
    p.add_array("routes.runs", torch.arange(20, dtype=torch.int32).reshape(2, 10))
    p.add_array("c.mask", torch.tensor([True, False, True]))
    p.add_array("c.table", torch.arange(4, dtype=torch.float64).reshape(2, 2))
    p.add_array("c.half", torch.tensor([1.5, -2.0], dtype=torch.float16))
    p.add_array("c.brain", torch.tensor([0.25, 3.0, 7.0], dtype=torch.bfloat16))
    p.add_array("c.ids", torch.tensor([5, 6], dtype=torch.int64))
    p.add_array("c.bytes", torch.tensor([1, 255], dtype=torch.uint8))
    p.add_array("c.small", torch.tensor([-1, 1], dtype=torch.int8))
    p.add_array("c.empty", torch.zeros(0, dtype=torch.int16))
    return p


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "p.sfxp"
    save_program(_program(), path)
    return path


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {info.filename: z.read(info) for info in z.infolist()}


def _pack(path: Path, members: dict[str, bytes] | list[tuple[str, bytes]], compress: int = 0) -> Path:
    items = members.items() if isinstance(members, dict) else members
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names
        with zipfile.ZipFile(path, "w", compress) as z:
            for name, data in items:
                z.writestr(name, data)
    return path


def _rehash(members: dict[str, bytes], **changes: Any) -> dict[str, bytes]:
    """``members`` with the manifest's sizes and hashes made to match, then ``changes`` applied to it."""
    manifest = json.loads(members[MANIFEST])
    for name in (TEXT, TENSORS):
        if name in members:
            manifest["members"][name] = {
                "sha256": hashlib.sha256(members[name]).hexdigest(),
                "size": len(members[name]),
            }
    manifest.update(changes)
    return {**members, MANIFEST: json.dumps(manifest).encode()}


def _safetensors(header: dict[str, Any], data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _load_error(path: Path) -> str:
    with pytest.raises(ProgramFormatError) as info:
        load_program(path)
    assert str(path) in str(info.value)
    return str(info.value)


# -- round trips ----------------------------------------------------------------------------------
def test_round_trip_keeps_the_structure_and_every_payload(saved: Path) -> None:
    p, q = _program(), load_program(saved)
    assert print_program(q) == print_program(p)
    assert q.kernels == p.kernels and q.routes == p.routes and q.specs == p.specs
    assert list(q.arrays) == list(p.specs)
    for name, tensor in p.arrays.items():
        assert q.arrays[name].dtype == tensor.dtype and torch.equal(q.arrays[name], tensor), name
    assert q.has_payloads


def test_the_file_is_a_stored_zip_of_three_members_with_a_manifest(saved: Path) -> None:
    p = _program()
    with zipfile.ZipFile(saved) as z:
        infos = z.infolist()
        assert z.testzip() is None
    assert [i.filename for i in infos] == [MANIFEST, TEXT, TENSORS]
    assert all(i.compress_type == zipfile.ZIP_STORED and i.date_time == (1980, 1, 1, 0, 0, 0) for i in infos)
    members = _members(saved)
    manifest = json.loads(members[MANIFEST])
    assert manifest["format_version"] == 5 and manifest["sparsefx_version"] == sparsefx.__version__
    assert manifest["counts"] == {
        "arrays": 12, "inputs": 1, "kernels": 2, "outputs": 1, "routes": 2,
        "payload_bytes": sum(s.nbytes for s in p.specs.values()),
    }  # fmt: skip
    for name in (TEXT, TENSORS):
        assert manifest["members"][name] == {
            "sha256": hashlib.sha256(members[name]).hexdigest(),
            "size": len(members[name]),
        }
    assert members[TEXT].decode() == print_program(p)
    tensors = safetensors_load(members[TENSORS])  # the safetensors library reads the member as it is
    assert set(tensors) == set(p.arrays) and all(torch.equal(tensors[n], p.arrays[n]) for n in p.arrays)


def test_save_load_save_gives_the_same_bytes(saved: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.sfxp"
    save_program(load_program(saved), again)
    first, second = _members(saved), _members(again)
    assert first[TENSORS] == second[TENSORS] and first[TEXT] == second[TEXT]
    assert saved.read_bytes() == again.read_bytes()
    save_program(_program(), again)  # a fresh build of the same program, too
    assert saved.read_bytes() == again.read_bytes()


def test_top_level_load_program_and_program_save(tmp_path: Path) -> None:
    assert sparsefx.load_program is load_program and "load_program" in sparsefx.__all__
    assert "ProgramWriteError" in sparsefx.__all__ and issubclass(sparsefx.ProgramWriteError, SparseFXError)
    p = _program()
    p.save(str(tmp_path / "p.sfxp"))
    assert print_program(sparsefx.load_program(tmp_path / "p.sfxp")) == print_program(p)


def test_a_program_without_kernels_or_arrays_round_trips(tmp_path: Path) -> None:
    p = DataflowProgram(MeshSpec(1, 1), HardwareSpec(), "streaming", "balanced")
    save_program(p, tmp_path / "e.sfxp")
    q = load_program(tmp_path / "e.sfxp")
    assert print_program(q) == print_program(p) and q.arrays == {}


def test_arrays_sharing_memory_are_saved_apart(tmp_path: Path) -> None:
    p = _program()
    shared = torch.arange(6, dtype=torch.float32)
    p.arrays["fc.values"] = shared
    p.add_array("c.copy", shared)  # the same tensor under a second name
    save_program(p, tmp_path / "s.sfxp")
    q = load_program(tmp_path / "s.sfxp")
    assert torch.equal(q.arrays["c.copy"], shared) and torch.equal(q.arrays["fc.values"], shared)


def test_zip64_headers_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive_write, "_ZIP64_FROM", 0)  # the tensors member gets a zip64 local header
    save_program(_program(), tmp_path / "z.sfxp")
    q = load_program(tmp_path / "z.sfxp")
    assert torch.equal(q.arrays["c.table"], _program().arrays["c.table"])
    assert all(t.data_ptr() % t.element_size() == 0 for t in q.arrays.values() if t.numel())


# -- memory mapping -------------------------------------------------------------------------------
def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == str(path.resolve()):
                lo, hi = (int(v, 16) for v in parts[0].split("-"))
                ranges.append((lo, hi))
    return ranges


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_payloads_are_views_of_a_private_mapping_of_the_file(saved: Path) -> None:
    before = saved.read_bytes()
    q = load_program(saved)
    ranges = _mapped_ranges(saved)
    assert ranges, "the file is not mapped"
    for name, tensor in q.arrays.items():
        if tensor.numel():
            ptr = tensor.data_ptr()
            assert any(lo <= ptr < hi for lo, hi in ranges), f"{name} is not a view of the mapped file"
            assert ptr % tensor.element_size() == 0, f"{name} is not aligned"
    q.arrays["fc.values"] += 1  # writable, copy on write: the file does not change
    assert saved.read_bytes() == before
    values = q.arrays["c.table"]
    del q
    assert values.sum().item() == 6.0  # the mapping lives as long as any of its tensors


def test_the_tensors_member_starts_aligned(saved: Path) -> None:
    from sparsefx.runtime import zip_view

    tensors = next(m for m in zip_view.members(saved.read_bytes()) if m.name == TENSORS)
    assert tensors.offset % 64 == 0


def test_skipping_the_payload_hash_loads_a_changed_payload(saved: Path, tmp_path: Path) -> None:
    members = _members(saved)
    data = bytearray(members[TENSORS])
    data[-1] ^= 1  # the last byte of the last tensor's data (a bool: 0 <-> 1)
    path = _pack(tmp_path / "flipped.sfxp", {**members, TENSORS: bytes(data)})
    assert "does not match its sha256" in _load_error(path)
    assert load_program(path, check_payload_hash=False).has_payloads


# -- saving ---------------------------------------------------------------------------------------
def test_saving_a_program_without_its_payloads_is_refused(tmp_path: Path) -> None:
    from sparsefx.runtime.text import parse_program

    parsed = parse_program(print_program(_program()))
    with pytest.raises(VerifyError, match=r"no payload .*parsed from text"):
        save_program(parsed, tmp_path / "p.sfxp")
    p = _program()
    p.arrays["fc.values"] = p.arrays["fc.values"].double()
    with pytest.raises(VerifyError, match=r"'fc.values' is torch.float64, but its spec says float32"):
        save_program(p, tmp_path / "p.sfxp")
    p = _program()
    p.arrays["stray"] = torch.zeros(1)
    with pytest.raises(VerifyError, match=r"'stray' has no array spec"):
        save_program(p, tmp_path / "p.sfxp")
    assert list(tmp_path.iterdir()) == []


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("failure", ["runtime", "interrupt", "nospace"])
def test_a_failed_write_leaves_the_old_file_and_no_temp_file(
    failure: str, saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = saved.read_bytes()
    real = archive_write._copy_aligned

    def half(zf: Any, file: Any, src: Any, size: int) -> None:
        real(zf, file, src, size // 2)  # write part of the payloads, then fail
        if failure == "runtime":
            raise RuntimeError("boom")
        if failure == "interrupt":
            raise KeyboardInterrupt
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(archive_write, "_copy_aligned", half)
    expected = {"runtime": RuntimeError, "interrupt": KeyboardInterrupt, "nospace": ProgramWriteError}[
        failure
    ]
    with pytest.raises(expected) as info:
        save_program(_program(), saved)
    if failure == "nospace":
        assert "no space left" in str(info.value) and str(saved) in str(info.value)
    assert saved.read_bytes() == before
    assert _names(saved.parent) == ["p.sfxp"]


def test_a_full_disk_while_safetensors_writes_is_a_program_write_error(
    saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors.torch

    def full(tensors: Any, filename: str, metadata: Any = None) -> None:
        Path(filename).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    before = saved.read_bytes()
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(ProgramWriteError, match="no space left on the device.*program file elsewhere"):
        save_program(_program(), saved)
    assert saved.read_bytes() == before and _names(saved.parent) == ["p.sfxp"]


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None: a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in folder.rglob("*")}


@pytest.mark.parametrize("obstacle", ["parent is a file", "target is a folder", "read-only folder"])
def test_an_unwritable_target_is_a_program_write_error_naming_it(obstacle: str, tmp_path: Path) -> None:
    """A write that fails, as root too (a file where a folder should be, a folder where the file should
    be), is a ``ProgramWriteError`` naming the target, and leaves the tree as it was: no temp file, nothing
    half-written. A folder without write permission binds only for other users than root."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes").write_bytes(b"kept")
    target = folder / "p.sfxp"
    if obstacle == "parent is a file":
        target = folder / "notes" / "p.sfxp"
    elif obstacle == "target is a folder":  # written in full next to it, then the move fails
        target.mkdir()
    elif os.name != "posix" or os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    before = _tree(tmp_path)
    if obstacle == "read-only folder":
        folder.chmod(0o500)
    try:
        with pytest.raises(ProgramWriteError) as info:
            save_program(_program(), target)
    finally:
        folder.chmod(0o700)
    assert isinstance(info.value, SparseFXError)
    assert str(info.value).startswith(f"cannot write {target}: ")
    assert _tree(tmp_path) == before


# -- bad files ------------------------------------------------------------------------------------
def test_missing_empty_foreign_and_directory_paths(tmp_path: Path) -> None:
    assert "no such file" in _load_error(tmp_path / "nope.sfxp")
    assert "is a directory" in _load_error(tmp_path)
    (tmp_path / "empty.sfxp").write_bytes(b"")
    assert "empty file" in _load_error(tmp_path / "empty.sfxp")
    (tmp_path / "text.sfxp").write_text("sparsefx.program 1\n")
    assert "not a sparsefx program file" in _load_error(tmp_path / "text.sfxp")
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.sfxp")  # refused at once, not waited on
        assert "is not a regular file" in _load_error(tmp_path / "fifo.sfxp")
    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, buffer)  # a pickle-based torch zip: never unpickled
    (tmp_path / "torch.sfxp").write_bytes(buffer.getvalue())
    assert "unexpected member" in _load_error(tmp_path / "torch.sfxp")


@pytest.mark.parametrize("cut", [1, 21, 22, 100, 0.5, 0.9, -1, -22, -23])
def test_truncated_files(cut: float, saved: Path, tmp_path: Path) -> None:
    raw = saved.read_bytes()
    n = int(len(raw) * cut) if isinstance(cut, float) else cut % len(raw)
    (tmp_path / "cut.sfxp").write_bytes(raw[:n])
    _load_error(tmp_path / "cut.sfxp")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"format_version": 6},
            r"format_version 6 is newer than this sparsefx reads; .* reads format_version 1, 2, 3, 4 and 5",
        ),
        ({"format_version": "1"}, r"format_version '1' is unknown; .* reads format_version 1, 2, 3, 4 and 5"),
        ({"format_version": 0}, r"format_version 0 is unknown; .* reads format_version 1, 2, 3, 4 and 5"),
        ({"format_version": True}, r"format_version True is unknown"),
        ({"format": "zip"}, r"format is 'zip'; expected 'sparsefx-program'"),
        ({"extra": 1}, r"has keys .*; expected"),
        ({"counts": {"kernels": 2}}, r"counts is .*; expected the keys"),
        ({"sparsefx_version": 1}, r"sparsefx_version is not a string"),
    ],
)
def test_bad_manifests(changes: dict[str, Any], message: str, saved: Path, tmp_path: Path) -> None:
    path = _pack(tmp_path / "m.sfxp", _rehash(_members(saved), **changes))
    assert_message(_load_error(path), message)


def test_a_version_1_file_loads_with_the_default_vector_start(saved: Path, tmp_path: Path) -> None:
    """Version 2 added ``vector_start_cycles`` to the hardware line. A version-1 file (its manifest and
    text say 1, its hardware line has no such field) loads, the field at its default, with the same
    kernels and payloads."""
    members = _members(saved)
    text = members[TEXT].decode().replace("sparsefx.program 3", "sparsefx.program 1", 1)
    text = re.sub(r" sram_bytes_per_cycle=[\d.]+", "", text, count=1)
    members[TEXT] = re.sub(r" vector_start_cycles=\d+", "", text, count=1).encode()
    old = sparsefx.load_program(_pack(tmp_path / "v1.sfxp", _rehash(members, format_version=1)))
    new = sparsefx.load_program(saved)
    assert old.hardware.vector_start_cycles == sparsefx.runtime.mesh.HardwareSpec().vector_start_cycles
    assert str(old) == str(new)
    assert all(torch.equal(old.arrays[n], new.arrays[n]) for n in new.arrays)


def assert_message(text: str, pattern: str) -> None:
    import re

    assert re.search(pattern, text), text


def test_manifest_json_flaws(saved: Path, tmp_path: Path) -> None:
    members = _members(saved)
    for raw, message in [
        (b"{not json", "not valid JSON"),
        (b'{"format": "a", "format": "b"}', "repeats the key 'format'"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"format": NaN}', "NaN, which is not JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[" * 100_000, "not valid JSON"),
    ]:
        path = _pack(tmp_path / "j.sfxp", {**members, MANIFEST: raw})
        assert_message(_load_error(path), message)
    manifest = json.loads(members[MANIFEST])
    manifest["counts"]["kernels"] = 5
    path = _pack(tmp_path / "c.sfxp", {**members, MANIFEST: json.dumps(manifest).encode()})
    assert_message(_load_error(path), r"manifest.json counts 5 kernels; program.txt has 2")
    manifest = json.loads(members[MANIFEST])
    manifest["members"][TEXT]["sha256"] = "0" * 63
    path = _pack(tmp_path / "h.sfxp", {**members, MANIFEST: json.dumps(manifest).encode()})
    assert_message(_load_error(path), r"sha256 is not 64 lowercase hex digits")
    path = _pack(tmp_path / "big.sfxp", {**members, MANIFEST: b" " * (archive.MAX_MANIFEST_BYTES + 1)})
    assert_message(_load_error(path), r"manifest.json is \d+ bytes; at most")


def test_hash_and_size_mismatches(saved: Path, tmp_path: Path) -> None:
    members = _members(saved)
    text = members[TEXT].replace(b"mode=pipelined", b"mode=streaming")
    path = _pack(tmp_path / "t.sfxp", {**members, TEXT: text})
    assert_message(_load_error(path), r"program.txt does not match its CRC and its sha256")
    path = _pack(tmp_path / "s.sfxp", {**members, TEXT: members[TEXT] + b"\n"})
    assert_message(_load_error(path), r"says program.txt is \d+ bytes; the zip holds")
    data = bytearray(members[TENSORS])
    data[len(data) // 2] ^= 1
    path = _pack(tmp_path / "d.sfxp", {**members, TENSORS: bytes(data)})
    assert_message(_load_error(path), r"tensors.safetensors does not match its sha256")


def test_missing_extra_duplicate_and_unsafe_members(saved: Path, tmp_path: Path) -> None:
    members = _members(saved)
    for name in archive.MEMBERS:
        path = _pack(tmp_path / "m.sfxp", {k: v for k, v in members.items() if k != name})
        assert_message(_load_error(path), rf"member '{name}' is missing")
    path = _pack(tmp_path / "pkl.sfxp", {**members, "data.pkl": b"\x80\x04K\x01."})
    assert_message(_load_error(path), r"unexpected member 'data.pkl'.*pickled data is never loaded")
    for name in ["../program.txt", "/etc/passwd", "a\\b", "C:x", "x/../../y"]:
        path = _pack(tmp_path / "u.sfxp", [*members.items(), (name, b"x")])
        assert_message(_load_error(path), r"not a plain relative path")
    path = _pack(tmp_path / "dup.sfxp", [*members.items(), (TEXT, members[TEXT])])
    assert_message(_load_error(path), r"member 'program.txt' appears twice")
    many = [*members.items(), *((f"f{i}", b"") for i in range(100))]
    assert_message(_load_error(_pack(tmp_path / "many.sfxp", many)), r"declares 103 members; at most 64")


def test_compressed_members_and_zip_bombs(saved: Path, tmp_path: Path) -> None:
    members = _members(saved)
    path = _pack(tmp_path / "z.sfxp", members, compress=zipfile.ZIP_DEFLATED)
    assert_message(_load_error(path), r"is compressed \(method 8, deflate\).*ZIP_STORED")
    raw = bytearray(saved.read_bytes())  # declare a 2 GB tensors member in both of its headers
    with zipfile.ZipFile(saved) as z:
        local = z.getinfo(TENSORS).header_offset
    central = raw.rfind(b"PK\x01\x02")  # the tensors member's entry is the last one
    assert raw[central + 46 : central + 46 + len(TENSORS)] == TENSORS.encode()
    struct.pack_into("<2L", raw, local + 18, 2**31, 2**31)
    struct.pack_into("<2L", raw, central + 20, 2**31, 2**31)
    (tmp_path / "bomb.sfxp").write_bytes(bytes(raw))
    assert_message(_load_error(tmp_path / "bomb.sfxp"), r"declares 2147483648 bytes .* past the end")


def _tensors_case(header: dict[str, Any], data: bytes, saved: Path, tmp_path: Path) -> str:
    members = _rehash({**_members(saved), TENSORS: _safetensors(header, data)})
    return _load_error(_pack(tmp_path / "st.sfxp", members))


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        (
            {"a": {"dtype": "pickle", "shape": [1], "data_offsets": [0, 1]}},
            b"x",
            r"dtype 'pickle' is not one",
        ),
        ({"a": {"dtype": "O", "shape": [1], "data_offsets": [0, 8]}}, b"x" * 8, r"dtype 'O' is not one"),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"x" * 4, r"non-negative ints"),
        ({"a": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}}, b"x" * 4, r"non-negative ints"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"x" * 8, r"hold 8 bytes.*needs 12"),
        (
            {"a": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}},
            b"x" * 6,
            r"leaves a gap after byte 0",
        ),
        (
            {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}},
            b"x" * 8,
            r"cover 4 bytes.* is 8 bytes",
        ),
        (
            {"a": {"dtype": "U8", "shape": [9], "data_offsets": [0, 9]}},
            b"x" * 4,
            r"cover 9 bytes.* is 4 bytes",
        ),
        ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}}, b"", r"not \[begin, end\]"),
        (
            {
                "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]},
            },
            b"x" * 6,
            r"'b': data_offsets \[2, 6\] overlaps",
        ),
        (
            {"a": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}},
            b"\x01\x02",
            r"bool but holds bytes",
        ),
        ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}, b"x", r"expected an object"),
        ({"__metadata__": {"a": 1}}, b"", r"__metadata__ is not a table of strings"),
        ({"a": {"dtype": "U8", "shape": [0] + [1] * 65, "data_offsets": [0, 0]}}, b"", r"at most 64"),
    ],
)
def test_bad_safetensors_headers(
    header: dict[str, Any], data: bytes, message: str, saved: Path, tmp_path: Path
) -> None:
    assert_message(_tensors_case(header, data, saved, tmp_path), message)


def test_bad_safetensors_framing(saved: Path, tmp_path: Path) -> None:
    members = _members(saved)
    for raw, message in [
        (b"\x01\x00", r"needs an 8-byte header length"),
        (struct.pack("<Q", 2**40) + b"{}", r"header says 1099511627776 bytes; at most"),
        (struct.pack("<Q", 100) + b"{}", r"header says 100 bytes, but only 2 follow"),
        (struct.pack("<Q", 2) + b"[]", r"does not start with '\{'"),
        (struct.pack("<Q", 9) + b'{"a": 1e9', r"safetensors header is not valid JSON"),
        (struct.pack("<Q", 2) + b"\xff}", r"does not start with"),
    ]:
        path = _pack(tmp_path / "f.sfxp", _rehash({**members, TENSORS: raw}))
        assert_message(_load_error(path), message)


def test_payloads_that_do_not_fit_the_text(saved: Path, tmp_path: Path) -> None:
    members = _members(saved)
    tensors = safetensors_load(members[TENSORS])
    cases = [
        ({**tensors, "fc.values": tensors["fc.values"].int()}, r"'fc.values' is int32\[6\] in tensors"),
        (
            {**tensors, "fc.values": tensors["fc.values"][:5]},
            r"'fc.values' is float32\[5\] .* but float32\[6\]",
        ),
        ({**tensors, "zzz": torch.zeros(1)}, r"holds 'zzz', which program.txt does not list"),
        ({k: v for k, v in tensors.items() if k != "c.ids"}, r"array 'c.ids' of program.txt has no payload"),
    ]
    for new, message in cases:
        path = _pack(tmp_path / "x.sfxp", _rehash({**members, TENSORS: safetensors_save(new)}))
        assert_message(_load_error(path), message)


def test_a_text_that_does_not_parse(saved: Path, tmp_path: Path) -> None:
    members = _members(saved)
    bad = members[TEXT].replace(b"mesh 4x2", b"mesh 4y2")
    path = _pack(tmp_path / "t.sfxp", _rehash({**members, TEXT: bad}))
    assert_message(_load_error(path), r"program.txt: line 2")
    path = _pack(tmp_path / "u.sfxp", _rehash({**members, TEXT: b"\xff" + members[TEXT]}))
    assert_message(_load_error(path), r"program.txt is not UTF-8")


# -- fuzz -----------------------------------------------------------------------------------------
def _mutate_json(value: Any, rng: random.Random) -> Any:
    """``value`` with one random change somewhere inside it."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(sorted(value))
        action = rng.random()
        if action < 0.15:
            return {k: v for k, v in value.items() if k != key}
        if action < 0.25:
            return {**value, rng.choice(["x", "__metadata__", "", key + "_"]): _junk(rng)}
        return {**value, key: _mutate_json(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.7:
        i = rng.randrange(len(value))
        return [*value[:i], _mutate_json(value[i], rng), *value[i + 1 :]]
    return _junk(rng)


def _junk(rng: random.Random) -> Any:
    return rng.choice(
        [
            -1, 0, 1, 2**31, 2**64, 10**30, -(2**63), 1.5, True, None, "", "F32", "BOOL", "O", "x" * 50,
            [], {},
            [0], [-1, 4], [4, 0], [0, 2**62], [1, 2, 3], {"dtype": "U8"}, rng.randrange(0, 4096),
        ]
    )  # fmt: skip


def _mutants(valid: bytes, members: dict[str, bytes], rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:  # random bytes, sometimes with a zip signature in front
        junk = rng.randbytes(rng.randrange(0, 3000))
        return (b"PK\x03\x04" + junk) if rng.random() < 0.5 else junk
    if kind == 1:
        return valid[: rng.randrange(len(valid))]
    if kind == 2:  # flipped bytes anywhere, or in the zip's central directory and end record
        raw = bytearray(valid)
        lo = 0 if rng.random() < 0.5 else valid.rfind(b"PK\x01\x02", 0, valid.rfind(b"PK\x01\x02")) - 200
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(max(lo, 0), len(raw))] = rng.choice([0, 1, 0xFF, rng.randrange(256)])
        return bytes(raw)
    changed = dict(members)
    if kind == 3:  # the manifest's JSON
        changed[MANIFEST] = json.dumps(_mutate_json(json.loads(members[MANIFEST]), rng)).encode()
    elif kind == 4:  # the safetensors header (the data kept), manifest hashes recomputed
        length = struct.unpack_from("<Q", members[TENSORS])[0]
        header = json.loads(members[TENSORS][8 : 8 + length])
        raw = json.dumps(_mutate_json(header, rng)).encode()
        changed[TENSORS] = struct.pack("<Q", len(raw)) + raw + members[TENSORS][8 + length :]
        changed = _rehash(changed)
    else:  # the text, with flipped bytes or a dropped line, hashes recomputed
        lines = members[TEXT].split(b"\n")
        if rng.random() < 0.5:
            del lines[rng.randrange(len(lines))]
        text = bytearray(b"\n".join(lines))
        for _ in range(rng.randint(0, 3)):
            text[rng.randrange(len(text))] = rng.choice(b'0123456789x[]{}=%:, -"\n')
        changed = _rehash({**changed, TEXT: bytes(text)})
    buffer = io.BytesIO()
    items = list(changed.items())
    if rng.random() < 0.2:
        rng.shuffle(items)
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in items:
            z.writestr(name, data)
    return buffer.getvalue()


def test_fuzzed_files_load_or_raise_program_format_error(saved: Path, tmp_path: Path) -> None:
    valid, members = saved.read_bytes(), _members(saved)
    rng = random.Random(1234)
    path = tmp_path / "fuzz.sfxp"
    outcomes = {"loaded": 0, "refused": 0}
    deadline = time.monotonic() + 3.0
    cases = 0
    while time.monotonic() < deadline or cases < 50:
        path.write_bytes(_mutants(valid, members, rng))
        start = time.monotonic()
        try:
            program = load_program(path)
        except ProgramFormatError:
            outcomes["refused"] += 1
        else:
            outcomes["loaded"] += 1
            assert set(program.arrays) == set(program.specs)
        assert time.monotonic() - start < 2.0, "one load took too long"
        cases += 1
    assert outcomes["refused"] > 0 and cases >= 50


# -- sizes: huge meshes, garbage offsets and counts ---------------------------------------------------
# Every size a file declares is bounded before it sizes an allocation (``MeshSpec`` bounds the mesh,
# ``verify`` the runs, offsets, counts, shapes and size attrs), so these are ProgramFormatError or
# VerifyError, in memory bounded by the file's size plus the per-PE arrays of its mesh. The cases that
# once allocated gigabytes run under a cap on the address space (``_capped``): a regression fails with an
# allocation error instead of taking the machine's memory.
HUGE_MESHES = ("1000000x1000000", "30000x30000")


@pytest.mark.parametrize("mesh", HUGE_MESHES)
def test_a_huge_mesh_in_the_text_or_the_manifest_is_refused_by_name(
    mesh: str, saved: Path, tmp_path: Path
) -> None:
    members = _members(saved)
    text = members[TEXT].replace(b"mesh 4x2", f"mesh {mesh}".encode())
    path = _pack(tmp_path / "mesh.sfxp", _rehash({**members, TEXT: text}))
    refused = rf"program.txt: line 2, column 6: .*mesh {mesh} has [\d,]+ PEs; sparsefx takes at most"
    assert_message(_load_error(path), refused)
    manifest = json.loads(members[MANIFEST])  # its sizes are checked against the zip's before any is used
    manifest["members"][TENSORS]["size"] = 10**12
    manifest["counts"]["payload_bytes"] = 10**30
    path = _pack(tmp_path / "manifest.sfxp", {**members, MANIFEST: json.dumps(manifest).encode()})
    assert_message(_load_error(path), r"says tensors.safetensors is 1000000000000 bytes; the zip holds \d+")


def test_huge_meshes_are_refused_without_allocating_in_a_fresh_process(saved: Path, tmp_path: Path) -> None:
    """A 30000x30000 mesh once took 3.7 GB to refuse (the verifier's owner grid): now the peak RSS of a
    fresh process that loads such files and parses such texts grows by less than 64 MB."""
    members = _members(saved)
    paths = []
    for mesh in HUGE_MESHES:
        text = members[TEXT].replace(b"mesh 4x2", f"mesh {mesh}".encode())
        paths.append(str(_pack(tmp_path / f"{mesh}.sfxp", _rehash({**members, TEXT: text}))))
    script = f"""
import resource
import sparsefx
from sparsefx.errors import ProgramFormatError

base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for path in {paths!r}:
    try:
        sparsefx.load_program(path).verify()
    except ProgramFormatError as exc:
        assert "PEs; sparsefx takes at most" in str(exc), exc
    else:
        raise AssertionError(path)
    text = {members[TEXT].decode()!r}.replace("mesh 4x2", "mesh " + path.rsplit("/", 1)[1][:-5])
    try:
        sparsefx.parse_program(text).verify()
    except ProgramFormatError as exc:
        assert "PEs; sparsefx takes at most" in str(exc), exc
    else:
        raise AssertionError(text[:60])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    grown_kb = int(out.stdout.split()[-1])
    assert grown_kb < 64 * 1024, f"refusing the files grew the peak RSS by {grown_kb} KB"


@pytest.fixture(scope="module")
def lowered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real MLP program on an 8x8 mesh in each mode, saved: sparse kernels, routes, runs, offsets."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    sm = sparsefx.compile(model, 0.5, x)
    folder = tmp_path_factory.mktemp("lowered")
    out = {}
    for mode in ("pipelined", "streaming"):
        out[mode] = folder / f"{mode}.sfxp"
        placement = "balanced" if mode == "pipelined" else "block"  # both, each where it lowers fast
        sparsefx.lower(sm, x, mesh=(8, 8), mode=mode, placement=placement).save(str(out[mode]))
    return out


@contextlib.contextmanager
def _capped(extra: int = 3 * 2**30) -> Iterator[None]:
    """At most ``extra`` more bytes of address space while the block runs (Linux), so that a runaway
    allocation fails as an error rather than exhausting the machine."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        yield
        return
    cap = size + extra if hard == resource.RLIM_INFINITY else min(size + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _verify_error(program: DataflowProgram, tmp_path: Path) -> str:
    """Save ``program`` (its flaws included), load it and verify: the message of the error raised."""
    path = tmp_path / "hostile.sfxp"
    program.save(str(path))
    with _capped(), pytest.raises((ProgramFormatError, VerifyError)) as info:
        load_program(path).verify()
    return str(info.value)


def _sparse(program: DataflowProgram) -> Kernel:
    return next(k for k in program.kernels if k.op == "sparse_matmul")


def _set(program: DataflowProgram, role: str, index: int, value: int) -> None:
    array = program.array(_sparse(program), role) if role != "routes.runs" else program.arrays[role]
    array.view(-1)[index] = value


def _route(program: DataflowProgram, **changes: Any) -> None:
    program.routes[1] = dataclasses.replace(program.routes[1], **changes)


def _attr(program: DataflowProgram, name: str, value: Any) -> None:
    _sparse(program).attrs[name] = value


BIG = 2**31 - 1
HOSTILE = {
    "runs length huge": (lambda p: _set(p, "routes.runs", 3, BIG), r"run 0 of 'routes.runs' \(2147483647 PE"),
    "runs length negative": (lambda p: _set(p, "routes.runs", 3, -3), r"length -3 is negative"),
    "runs start off the mesh": (lambda p: _set(p, "routes.runs", 10, -(2**31)), r"leaves the 8x8 mesh"),
    "runs direction": (lambda p: _set(p, "routes.runs", 2, 3), r"direction 3 is not one of N=1, E=2"),
    "runs overflow": (lambda p: _set(p, "routes.runs", 1, BIG), r"run 0 of 'routes.runs' .* leaves the 8x8"),
    "route runs past the table": (lambda p: _route(p, first=5, count=10**30), r"takes runs\[5:10{29}5\]"),
    "route count negative": (lambda p: _route(p, count=-2), r"takes runs\[\d+:\d+\]; 'routes.runs' has rows"),
    "route first negative": (lambda p: _route(p, first=-(2**63)), r"takes runs\[-9223372036854775808:"),
    "route step": (lambda p: _route(p, step=10**20), r"is used at step 100000000000000000000; steps are -1"),
    "route to nowhere": (lambda p: _route(p, dsts=("nowhere",)), r"goes to 'nowhere', which is not a kernel"),
    "nz_ptr negative": (lambda p: _set(p, "nz_ptr", 1, -1), r"nz_ptr is not monotone"),
    "nz_ptr huge": (lambda p: _set(p, "nz_ptr", 2, 2**62), r"nz_ptr is not monotone"),
    "col_ptr_off huge": (lambda p: _set(p, "col_ptr_off", 1, 2**62), r"col_ptr_off"),
    "col_ptr garbage": (lambda p: _set(p, "col_ptr", 1, -(2**31)), r"col_ptr of PE .* is not monotone"),
    "row_idx out of range": (lambda p: _set(p, "row_idx", 0, 2**15 - 1), r"row_idx of PE .* has 32767"),
    "out_hi huge": (lambda p: _set(p, "out_hi", 0, BIG), r"output range \[\d+, 2147483647\) of PE"),
    "in_hi negative": (lambda p: _set(p, "in_hi", 0, -5), r"input range of PE .* is not inside"),
    "rows_in_flight huge": (lambda p: _attr(p, "rows_in_flight", 10**30), r"attrs\['rows_in_flight'\] is 10"),
    "rows_in_flight text": (lambda p: _attr(p, "rows_in_flight", "x"), r"attrs\['rows_in_flight'\] is 'x'"),
    "in_features": (lambda p: _attr(p, "in_features", -1), r"attrs\['in_features'\] is -1; expected an int"),
    "role missing": (lambda p: _sparse(p).arrays.pop("col_ptr"), r"col_ptr missing"),
    "value shape": (
        lambda p: setattr(_sparse(p), "shape", (0, 10**30)),
        r"has shape \(0, 10{30}\); a value has at most 2,147,483,648 elements",
    ),
    "index ends on an escape": (
        lambda p: _set(p, "index", -1, 255),
        r"index ends \d+ nonzeros .* last byte is an escape",
    ),
    "index gap past the slots": (lambda p: _set(p, "index", 0, 254), r"PE \d+'s gaps pass its last slot"),
    "pe_nnz off by one": (
        lambda p: _set(p, "pe_nnz", 0, int(p.array(_sparse(p), "pe_nnz")[0]) + 1),
        r"pe_nnz counts",
    ),
    "packed role missing": (lambda p: _sparse(p).arrays.pop("pe_nnz"), r"pe_nnz missing"),
    "index not bytes": (
        lambda p: _retype(p, "index", torch.int16),
        r"index has dtype torch.int16 \(uint8 expected\)",
    ),
}
CSC_CASES = {"nz_ptr negative", "nz_ptr huge", "col_ptr_off huge", "col_ptr garbage", "row_idx out of range"}
CSC_CASES |= {"out_hi huge", "in_hi negative", "role missing"}
"""Cases that spoil the CSC form: run on the program unpacked (a program may store either form)."""


def _retype(program: DataflowProgram, role: str, dtype: torch.dtype) -> None:
    k = _sparse(program)
    program.add_array(k.arrays[role], program.arrays[k.arrays[role]].to(dtype))


@pytest.mark.parametrize("mode", ["pipelined", "streaming"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_garbage_offsets_counts_and_sizes_are_refused_by_name(
    case: str, mode: str, lowered: dict[str, Path], tmp_path: Path
) -> None:
    program = load_program(lowered[mode])
    if case in CSC_CASES:
        program = as_csc(program)
    program.verify()
    spoil, message = HOSTILE[case]
    spoil(program)
    assert_message(_verify_error(program, tmp_path), message)


@pytest.mark.parametrize("mode", ["pipelined", "streaming"])
def test_a_run_end_that_sends_where_no_pe_of_its_route_receives_is_refused(
    mode: str, lowered: dict[str, Path], tmp_path: Path
) -> None:
    """Each run's last PE may send on to another run, the host or nowhere; a direction no PE of the route
    receives from is refused by name, PE and color (inside a run every PE sends to the next one). Here a
    run's last PE also sends back along the run, where the PE before it receives only from behind."""
    program = load_program(lowered[mode])
    runs = program.arrays["routes.runs"]
    steps = {int(Dir.E): (1, 0), int(Dir.W): (-1, 0), int(Dir.N): (0, -1), int(Dir.S): (0, 1)}
    row_at, route = next(
        (route.first + i, route)
        for route in program.routes
        for i in range(route.count)
        if int(runs[route.first + i, 3]) >= 3 and int(runs[route.first + i, 2]) in steps
    )
    row = runs[row_at]
    x0, y0, d, n = (int(v) for v in row[:4])
    x, y = x0 + steps[d][0] * (n - 1), y0 + steps[d][1] * (n - 1)
    side = Dir(d).opposite
    row[5] = int(row[5]) | int(side)
    assert_message(
        _verify_error(program, tmp_path),
        rf"route {route.name!r} sends {side.name} from PE \({x}, {y}\) on color {route.color}, but no PE",
    )


@pytest.mark.parametrize("mode", ["pipelined", "streaming"])
def test_more_router_entries_on_a_color_than_the_mesh_has_pes(
    mode: str, lowered: dict[str, Path], tmp_path: Path
) -> None:
    """Copies of one route on its color: far more entries than PEs are refused before they are expanded
    (streaming: copies of a route of one step, which ``verify`` expands with the steps around it)."""
    program = load_program(lowered[mode])
    stepped = mode == "streaming"  # a pipelined program's routes are in use at every step
    values = (r for r in program.routes if r.kind == "value" and r.src != "host")
    route = next(r for r in values if (r.step >= 0) == stepped)
    copies = 2 * program.mesh.pes + 64  # each route holds at least one entry
    program.routes += [dataclasses.replace(route, name=f"{route.name}_{i}") for i in range(copies)]
    at_once = " at once" if mode == "streaming" else ""
    assert_message(
        _verify_error(program, tmp_path),
        rf"the routes on color {route.color} .* hold [\d,]+ router entries{at_once}; the 8x8 mesh has 64 PEs",
    )


_JUNK_INTS = (-1, -(2**31), 2**31 - 1, 2**15 - 1, -(2**15), 0, 1, 7, 8, 9, 63, 64, 65)


def test_fuzzed_payload_arrays_and_routes_verify_or_raise_verify_error(
    lowered: dict[str, Path], tmp_path: Path
) -> None:
    """Random garbage in the int arrays (runs, offsets, counts, indices) and the routes' fields, through a
    file: every case loads and verifies, or raises ProgramFormatError or VerifyError, quickly."""
    rng = random.Random(2205)
    programs = {mode: load_program(path) for mode, path in lowered.items()}
    refused = 0
    for case in range(40):
        program = load_program(lowered[rng.choice(sorted(programs))])
        if rng.random() < 0.75:
            name = rng.choice(sorted(n for n, t in program.arrays.items() if not t.is_floating_point()))
            flat = program.arrays[name].view(-1)
            info = torch.iinfo(flat.dtype)
            for _ in range(rng.randint(1, 3)):
                value = min(max(rng.choice(_JUNK_INTS), info.min), info.max)
                flat[rng.randrange(flat.numel())] = value
        else:
            i = rng.randrange(len(program.routes))
            field = rng.choice(["first", "count", "step", "color"])
            value = rng.choice([-1, -5, 3, 10**6, 2**40, 2**63, 10**30])
            program.routes[i] = dataclasses.replace(program.routes[i], **{field: value})
        path = tmp_path / f"fuzz{case % 2}.sfxp"
        program.save(str(path))
        start = time.monotonic()
        with _capped():
            try:
                load_program(path).verify()
            except (ProgramFormatError, VerifyError):
                refused += 1
        assert time.monotonic() - start < 5.0, f"case {case} took too long"
    assert refused > 20


@pytest.mark.parametrize("command", ["inspect", "run"])
def test_the_cli_reports_a_hostile_file_in_one_line(
    command: str, lowered: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparsefx import cli

    program = load_program(lowered["pipelined"])
    program.arrays["routes.runs"][0, 3] = 2**31 - 1  # once a raw allocator error the CLI printed
    path = tmp_path / "hostile.sfxp"
    program.save(str(path))
    with _capped():
        assert cli.main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparsefx: error: kernel ") and "run 0 of 'routes.runs' (2147483647 PEs" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
