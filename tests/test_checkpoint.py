"""Checkpoints: exact round trips, the NaN-sentinel format, finalize (CLI), atomic writes, hostile
files, and retargeting masks to a new sparsity."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import sparsefx
from sparsefx import checkpoint as ckpt
from sparsefx import cli
from sparsefx.checkpoint import (
    export_nan_sentinel,
    finalize,
    import_nan_sentinel,
    load_checkpoint,
    load_nan_sentinel,
    save_checkpoint,
    save_nan_sentinel,
)
from sparsefx.errors import CheckpointError, ConfigError
from sparsefx.models import build_model
from sparsefx.models.mlp import MLP
from sparsefx.sparse.init import keep_count
from sparsefx.sparse.retarget import retarget_, retarget_mask

SPARSE = ("net.0.weight", "net.2.weight", "net.4.weight")


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen)


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    x, y = _batch(seed)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def _trained(seed: int = 0, steps: int = 3) -> tuple[sparsefx.SparseModel, torch.optim.Optimizer]:
    """The MLP compiled at 0.8 and trained a few AdamW steps (pruned grads are exactly 0)."""
    sm = sparsefx.compile(build_model("mlp", seed=seed).model, {"sparsity": 0.8, "seed": seed})
    opt = torch.optim.AdamW(sm.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(steps):
        _step(sm, opt, step)
    return sm, opt


def _fresh(seed: int = 7) -> tuple[sparsefx.SparseModel, torch.optim.Optimizer]:
    return _trained(seed=seed, steps=0)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().view(torch.int32) if t.dtype == torch.float32 else t.detach()


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(_bits(a[key]), _bits(b[key])), key


def _assert_same_optimizer(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sorted(sa["state"]) == sorted(sb["state"])
    for index, entry in sa["state"].items():
        _assert_same(entry, sb["state"][index])


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for value in obj.values() for t in _tensors(value)]
    if isinstance(obj, (list, tuple)):
        return [t for value in obj for t in _tensors(value)]
    return []


# ---------------------------------------------------------------------------------------------------------
# Round trip


def test_round_trip_is_exact(tmp_path: Path) -> None:
    sm, opt = _trained()
    for name, mask in sm.masks.items():
        param = sm.get_parameter(name)
        assert torch.all(param[~mask] == 0)
        assert all(torch.all(opt.state[param][k][~mask] == 0) for k in ("exp_avg", "exp_avg_sq"))
    state = {"step": 3, "schedule": [0.1, 0.2], "rng": torch.arange(3)}
    save_checkpoint(tmp_path / "ckpt.pt", sm, opt, sparsity_state=state, extra={"epoch": 1})
    sm2, opt2 = _fresh()
    assert not torch.equal(sm2.masks["net.0.weight"], sm.masks["net.0.weight"])
    loaded = load_checkpoint(tmp_path / "ckpt.pt", sm2, opt2)
    assert loaded["format"] == "sparsefx-checkpoint" and loaded["version"] == 1
    assert loaded["sparsity"]["schedule"] == [0.1, 0.2] and loaded["extra"] == {"epoch": 1}
    assert torch.equal(loaded["sparsity"]["rng"], torch.arange(3))
    _assert_same(sm.state_dict(), sm2.state_dict())
    _assert_same_optimizer(opt, opt2)
    _step(sm, opt, 9)
    _step(sm2, opt2, 9)
    _assert_same(sm.state_dict(), sm2.state_dict())


def test_save_refuses_what_weights_only_cannot_load(tmp_path: Path) -> None:
    sm, _ = _fresh()
    with pytest.raises(CheckpointError, match=r"\['extra'\]\['when'\] has type object"):
        save_checkpoint(tmp_path / "ckpt.pt", sm, extra={"when": object()})
    with pytest.raises(CheckpointError, match="sparsity_state must be a dict"):
        save_checkpoint(tmp_path / "ckpt.pt", sm, sparsity_state=[1])  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_mismatching_checkpoints_name_the_problem(tmp_path: Path) -> None:
    sm, opt = _trained(steps=1)
    save_checkpoint(tmp_path / "ckpt.pt", sm, opt)
    with pytest.raises(CheckpointError, match=r"ckpt\.pt does not fit.*net\.0\.weight_mask.*finalize"):
        load_checkpoint(tmp_path / "ckpt.pt", build_model("mlp").model)
    narrow = sparsefx.compile(MLP(hidden=(256, 128)), 0.8)
    with pytest.raises(
        CheckpointError, match=r"shape mismatch net\.2\.weight \(256, 256\) vs model \(128, 256\)"
    ):
        load_checkpoint(tmp_path / "ckpt.pt", narrow)
    sm2, _ = _fresh()
    before = {k: v.clone() for k, v in sm2.state_dict().items()}
    two_groups = torch.optim.AdamW(
        [{"params": list(sm2.parameters())[:2]}, {"params": list(sm2.parameters())[2:]}]
    )
    with pytest.raises(CheckpointError, match="optimizer has 2 param groups, checkpoint 1"):
        load_checkpoint(tmp_path / "ckpt.pt", sm2, two_groups)
    _assert_same(before, sm2.state_dict())  # nothing is loaded unless everything fits
    save_checkpoint(tmp_path / "no-opt.pt", sm)
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        load_checkpoint(tmp_path / "no-opt.pt", sm2, torch.optim.SGD(sm2.parameters(), lr=0.1))
    newer = {"format": "sparsefx-checkpoint", "version": 2, "model": {}}
    torch.save(newer, tmp_path / "newer.pt")
    with pytest.raises(CheckpointError, match="version 2 is newer"):
        load_checkpoint(tmp_path / "newer.pt")


# ---------------------------------------------------------------------------------------------------------
# NaN sentinel


def test_nan_sentinel_export_marks_exactly_the_pruned_positions() -> None:
    sm, opt = _trained()
    before = {k: v.clone() for k, v in sm.state_dict().items()}
    out = export_nan_sentinel(sm, opt)
    assert not any(key.endswith("_mask") for key in out["model"])
    assert sorted(out["model"]) == sorted(k for k in sm.state_dict() if not k.endswith("_mask"))
    for key, value in out["model"].items():
        mask = sm.masks.get(key)
        expected = ~mask if mask is not None else torch.zeros_like(value, dtype=torch.bool)
        assert torch.equal(value.isnan(), expected), key
        assert torch.equal(value[~expected], sm.state_dict()[key][~expected])
    names = [name for name, _ in sm.named_parameters()]
    for index, entry in out["optimizer"]["state"].items():
        mask = sm.masks.get(names[index])
        for key in ("exp_avg", "exp_avg_sq"):
            expected = ~mask if mask is not None else torch.zeros_like(entry[key], dtype=torch.bool)
            assert torch.equal(entry[key].isnan(), expected), (names[index], key)
        assert entry["step"] == 3
    _assert_same(before, sm.state_dict())  # the live model and optimizer are untouched
    assert not any(t.isnan().any() for t in _tensors(opt.state_dict()))


def test_nan_sentinel_leaves_requires_dense_states_alone() -> None:
    sm, opt = _trained(steps=1)
    dense_state = opt.state[sm.get_parameter("net.0.weight")]["exp_avg"]
    dense_state.requires_dense = True
    dense_state[~sm.masks["net.0.weight"]] = 0.5
    sentinel = export_nan_sentinel(sm, opt)
    entry = sentinel["optimizer"]["state"][0]
    assert not entry["exp_avg"].isnan().any() and entry["exp_avg_sq"].isnan().any()
    sm2, opt2 = _fresh()
    import_nan_sentinel(sm2, sentinel, opt2)  # and back: the dense state keeps its pruned entries
    assert torch.equal(opt2.state[sm2.get_parameter("net.0.weight")]["exp_avg"], dense_state)
    _assert_same_optimizer(opt, opt2)


def test_nan_sentinel_import_restores_masks_and_zeros_bit_exactly(tmp_path: Path) -> None:
    sm, opt = _trained()
    save_nan_sentinel(tmp_path / "nan.pt", sm, opt)
    raw = torch.load(tmp_path / "nan.pt", weights_only=True)
    assert set(raw) == {"model", "optimizer"}  # a standard dense checkpoint
    sm2, opt2 = _fresh()
    load_nan_sentinel(tmp_path / "nan.pt", sm2, opt2)
    for name in SPARSE:
        assert torch.equal(sm2.masks[name], sm.masks[name])
    _assert_same(sm.state_dict(), sm2.state_dict())
    _assert_same_optimizer(opt, opt2)
    x, _ = _batch(5)
    assert torch.equal(sm2(x), sm(x))
    _step(sm, opt, 9)
    _step(sm2, opt2, 9)
    _assert_same(sm.state_dict(), sm2.state_dict())


def test_nan_sentinel_errors() -> None:
    sm, opt = _trained(steps=1)
    sentinel = export_nan_sentinel(sm, opt)
    with pytest.raises(CheckpointError, match=r"net\.0\.weight.*no mask for them.*compile the model"):
        import_nan_sentinel(build_model("mlp").model, sentinel)
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        import_nan_sentinel(sm, {"model": sentinel["model"]}, opt)
    with torch.no_grad():
        weight = sm.get_parameter("net.2.weight")
        weight[sm.masks["net.2.weight"]] = weight[sm.masks["net.2.weight"]].clone().fill_(float("nan"))
    with pytest.raises(CheckpointError, match=r"net\.2\.weight: kept weights are NaN"):
        export_nan_sentinel(sm)


# ---------------------------------------------------------------------------------------------------------
# Finalize


@pytest.fixture(scope="module", autouse=True)
def finalize_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    """``sparsefx finalize`` on a NaN-sentinel file, started in a subprocess when the module starts
    (importing torch takes seconds) and read by the test that checks it."""
    tmp = tmp_path_factory.mktemp("finalize")
    sm, opt = _trained()
    save_nan_sentinel(tmp / "nan.pt", sm, opt)
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparsefx.cli", "finalize", "-i", "nan.pt", "-o", "dense.pt"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp,
        env={**env, "NO_COLOR": "1", "OMP_NUM_THREADS": "1"},
    )
    yield sm, opt, proc, tmp
    proc.kill()
    proc.communicate()


def test_finalize_cli_gives_a_plain_dense_checkpoint(finalize_run: tuple) -> None:
    sm, opt, proc, tmp_path = finalize_run
    out, err = proc.communicate(timeout=120)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    pruned = sum(int((~m).sum()) for m in sm.masks.values())
    assert f"9 tensors cleaned, {3 * pruned:,} NaN replaced by 0, 0 masks dropped" in result.stdout
    dense = torch.load(tmp_path / "dense.pt", weights_only=True)
    assert not any(t.is_floating_point() and t.isnan().any() for t in _tensors(dense))
    assert not any(key.endswith("_mask") for key in dense["model"])
    plain = build_model("mlp", seed=3).model
    plain.load_state_dict(dense["model"], strict=True)
    x, _ = _batch(5)
    torch.testing.assert_close(plain(x), sm(x), atol=0, rtol=0)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.1)
    plain_opt.load_state_dict(dense["optimizer"])
    _assert_same_optimizer(plain_opt, opt)  # NaN -> 0 gives back the zeros the sparse run had


def test_finalize_sparsefx_checkpoint_in_place(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sm, opt = _trained(steps=2)
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, sm, opt, sparsity_state={"step": 2})
    assert cli.main(["finalize", "--input", str(path), "--output", str(path)]) == 0
    assert "0 tensors cleaned, 0 NaN replaced by 0, 3 masks dropped" in capsys.readouterr().out
    plain = build_model("mlp", seed=4).model
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.1)
    loaded = load_checkpoint(path, plain, plain_opt)
    assert loaded["sparsity"] is None and sorted(os.listdir(tmp_path)) == ["ckpt.pt"]
    _assert_same(plain.state_dict(), {k: v for k, v in sm.state_dict().items() if not k.endswith("_mask")})


def test_finalize_plain_state_dict_applies_masks(tmp_path: Path) -> None:
    state = {
        "w": torch.tensor([[1.0, float("nan")], [3.0, 4.0]]),
        "w_mask": torch.tensor([[True, True], [False, True]]),
    }
    state["attn_mask"] = torch.ones(3, dtype=torch.bool)  # not a sparsity mask: no tensor named "attn"
    torch.save(state, tmp_path / "in.pt")
    stats = finalize(tmp_path / "in.pt", tmp_path / "out.pt")
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert (stats.layout, stats.tensors_cleaned, stats.nan_replaced, stats.masks_dropped) == (
        "state_dict",
        1,
        1,
        1,
    )
    assert sorted(out) == ["attn_mask", "w"] and out["w"].tolist() == [[1.0, 0.0], [0.0, 4.0]]


def test_finalize_errors_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "text.pt").write_text("not a checkpoint\n")
    for argv in (
        ["finalize", "-i", str(tmp_path / "missing.pt"), "-o", str(tmp_path / "out.pt")],
        ["finalize", "-i", str(tmp_path / "text.pt"), "-o", str(tmp_path / "out.pt")],
        ["finalize", "-i", str(tmp_path / "text.pt")],
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("sparsefx: error: "), err
    torch.save({"w": torch.ones(2)}, tmp_path / "ok.pt")
    assert cli.main(["finalize", "-i", str(tmp_path / "ok.pt"), "-o", str(tmp_path / "no" / "out.pt")]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert not (tmp_path / "out.pt").exists()


# ---------------------------------------------------------------------------------------------------------
# Atomic writes and hostile files


def test_failed_write_leaves_the_old_file_and_no_temp_files(tmp_path: Path, monkeypatch) -> None:
    sm, opt = _trained(steps=1)
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, sm, opt)
    old = path.read_bytes()

    def broken_save(obj: Any, file: Any, *args: Any, **kwargs: Any) -> None:
        file.write(old[: len(old) // 2])
        raise RuntimeError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    _step(sm, opt, 5)
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(path, sm, opt)
    with pytest.raises(RuntimeError, match="disk full"):
        save_nan_sentinel(tmp_path / "new.pt", sm, opt)
    assert path.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]


class _Evil:
    """Unpickling this with full pickle creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (str(self.marker), "w"))


def _bad_files(tmp: Path) -> dict[str, Path]:
    sm, _ = _fresh()
    save_checkpoint(tmp / "good.pt", sm)
    good = (tmp / "good.pt").read_bytes()
    files = {
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "text": b"model: weights\n",
    }
    paths = {}
    for name, data in files.items():
        (tmp / f"{name}.pt").write_bytes(data)
        paths[name] = tmp / f"{name}.pt"
    with zipfile.ZipFile(tmp / "good.pt") as archive:  # flip one bit inside the first weight's data
        info = next(i for i in archive.infolist() if i.filename.endswith("data/0"))
    name_len, extra_len = struct.unpack("<HH", good[info.header_offset + 26 : info.header_offset + 30])
    flipped = bytearray(good)
    flipped[info.header_offset + 30 + name_len + extra_len + 10] ^= 1  # past the local file header
    (tmp / "bitflip.pt").write_bytes(bytes(flipped))
    paths["bitflip"] = tmp / "bitflip.pt"
    with zipfile.ZipFile(tmp / "foreign.zip", "w") as archive:
        archive.writestr("hello.txt", "hello")
    paths["foreign-zip"] = tmp / "foreign.zip"
    torch.save(torch.ones(3), tmp / "tensor.pt")
    paths["tensor"] = tmp / "tensor.pt"
    torch.save({"model": _Evil(tmp / "MARKER")}, tmp / "evil-torch.pt")
    paths["evil-torch"] = tmp / "evil-torch.pt"
    (tmp / "evil.pkl").write_bytes(pickle.dumps(_Evil(tmp / "MARKER")))
    paths["evil-pickle"] = tmp / "evil.pkl"
    paths["missing"] = tmp / "missing.pt"
    paths["folder"] = tmp
    return paths


def test_bad_files_raise_checkpoint_error_and_run_no_code(tmp_path: Path) -> None:
    paths = _bad_files(tmp_path)
    expected = {
        "truncated": "truncated, corrupt",
        "bitflip": "data/0 fails its CRC check",
        "empty": "empty file",
        "text": "not a PyTorch zip checkpoint",
        "foreign-zip": "not in a subdirectory",
        "tensor": "bare tensor",
        "evil-torch": "refused to unpickle",
        "evil-pickle": "not a PyTorch zip checkpoint",
        "missing": "no such file",
        "folder": "cannot read",
    }
    sm, opt = _fresh()
    for name, path in paths.items():
        for load in (
            lambda p: load_checkpoint(p, sm, opt),
            lambda p: load_nan_sentinel(p, sm, opt),
            lambda p: finalize(p, tmp_path / "out.pt"),
        ):
            with pytest.raises(CheckpointError) as info:
                load(path)
            assert str(path) in str(info.value) and expected[name] in str(info.value), name
    assert not (tmp_path / "MARKER").exists() and not (tmp_path / "out.pt").exists()
    with open(paths["evil-pickle"], "rb") as file:  # the payload is real: full pickle runs it
        pickle.load(file).close()
    assert (tmp_path / "MARKER").exists()


def test_bad_files_fail_alike_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for name, path in _bad_files(tmp_path).items():
        assert cli.main(["finalize", "-i", str(path), "-o", str(tmp_path / "out.pt")]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err, err
    assert not (tmp_path / "MARKER").exists()


def test_read_file_only_uses_weights_only(monkeypatch, tmp_path: Path) -> None:
    seen = []
    real_load = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    torch.save({"w": torch.ones(2)}, tmp_path / "w.pt")
    assert ckpt.read_file(tmp_path / "w.pt")["w"].tolist() == [1.0, 1.0]
    assert seen == [True]


# ---------------------------------------------------------------------------------------------------------
# Retarget


@pytest.mark.parametrize("level", [0.0, 0.5, 0.79])
def test_retarget_down_regrows_at_zero(level: float) -> None:
    sm, opt = _trained()
    old = {name: mask.clone() for name, mask in sm.masks.items()}
    weights = {name: sm.get_parameter(name).detach().clone() for name in SPARSE}
    changes = retarget_(sm, level, seed=3, optimizer=opt)
    for name, mask in sm.masks.items():
        param = sm.get_parameter(name)
        assert int(mask.sum()) == keep_count(mask.numel(), level) == changes[name][1]
        assert changes[name][0] == int(old[name].sum())
        assert torch.all(mask[old[name]])  # old kept ⊆ new kept
        regrown = mask & ~old[name]
        assert torch.all(param[regrown] == 0) and torch.all(param[~mask] == 0)
        assert torch.equal(param[old[name]], weights[name][old[name]])
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.all(opt.state[param][key][~mask | regrown] == 0)
    _step(sm, opt, 9)  # still trains; regrown weights move
    assert any((sm.get_parameter(n)[sm.masks[n] & ~old[n]] != 0).any() for n in SPARSE)


@pytest.mark.parametrize("level", [0.81, 0.99])
def test_retarget_up_prunes_the_smallest(level: float) -> None:
    sm, opt = _trained()
    old = {name: mask.clone() for name, mask in sm.masks.items()}
    weights = {name: sm.get_parameter(name).detach().clone() for name in SPARSE}
    retarget_(sm, level, optimizer=opt)
    for name, mask in sm.masks.items():
        param = sm.get_parameter(name)
        assert int(mask.sum()) == keep_count(mask.numel(), level)
        assert not torch.any(mask & ~old[name])  # new kept ⊆ old kept
        dropped = old[name] & ~mask
        assert weights[name][dropped].abs().max() <= weights[name][mask].abs().min()
        assert torch.all(param[~mask] == 0) and torch.equal(param[mask], weights[name][mask])
        assert all(torch.all(opt.state[param][key][~mask] == 0) for key in ("exp_avg", "exp_avg_sq"))


def test_retarget_is_deterministic_and_pure() -> None:
    weight = torch.randn(32, 48)
    mask = torch.rand(32, 48) < 0.2
    saved = mask.clone()
    first = retarget_mask(weight, mask, 0.5, seed=11)
    assert torch.equal(first, retarget_mask(weight, mask, 0.5, seed=11))
    assert not torch.equal(first, retarget_mask(weight, mask, 0.5, seed=12))
    assert torch.equal(mask, saved)
    same = keep_count(mask.numel(), 1 - int(mask.sum()) / mask.numel())
    if same == int(mask.sum()):
        assert torch.equal(retarget_mask(weight, mask, 1 - int(mask.sum()) / mask.numel(), seed=0), mask)
    a, b = _fresh(seed=1)[0], _fresh(seed=1)[0]
    torch.randn(100)  # global RNG state does not matter
    retarget_(a, 0.4, seed=5)
    retarget_(b, 0.4, seed=5)
    for name in SPARSE:
        assert torch.equal(a.masks[name], b.masks[name])


def test_retarget_mapping_and_errors() -> None:
    sm, _ = _fresh()
    old = {name: mask.clone() for name, mask in sm.masks.items()}
    assert retarget_(sm, {"net.2.weight": 0.5}) == {"net.2.weight": (int(old["net.2.weight"].sum()), 32768)}
    assert torch.equal(sm.masks["net.0.weight"], old["net.0.weight"])
    with pytest.raises(ConfigError, match=r"net\.9\.weight not sparse parameters; valid: net\.0\.weight"):
        retarget_(sm, {"net.9.weight": 0.5})
    with pytest.raises(ConfigError, match=r"retarget net\.4\.weight: 1\.0 is not in \[0, 1\)"):
        retarget_(sm, {"net.0.weight": 0.5, "net.4.weight": 1.0})
    assert torch.equal(sm.masks["net.0.weight"], old["net.0.weight"])  # nothing changed on error
    with pytest.raises(ConfigError, match="bool tensor shaped like the weight"):
        retarget_mask(torch.ones(2, 2), torch.ones(2, 2), 0.5, seed=0)


def test_load_into_a_new_config_then_retarget(tmp_path: Path) -> None:
    sm, opt = _trained()
    save_checkpoint(tmp_path / "ckpt.pt", sm, opt)
    for level in (0.5, 0.95):  # SPDF-style densify, iterative-pruning-style sparsify
        new = sparsefx.compile(build_model("mlp", seed=9).model, level)
        new_opt = torch.optim.AdamW(new.parameters(), lr=1e-2, weight_decay=0.1)
        load_checkpoint(tmp_path / "ckpt.pt", new, new_opt)
        retarget_(new, {name: d.sparsity for name, d in new.plan.sparse.items()}, optimizer=new_opt)
        for name, mask in new.masks.items():
            assert int(mask.sum()) == keep_count(mask.numel(), level)
            old = sm.masks[name]
            assert torch.all(mask[old]) if level < 0.8 else not torch.any(mask & ~old)
            assert torch.all(new.get_parameter(name)[~mask] == 0)
        _step(new, new_opt, 9)


def test_resume_through_save_checkpoint_is_bit_identical(tmp_path: Path) -> None:
    """A RigL run saved with save_checkpoint and resumed with load_checkpoint equals an uninterrupted one."""
    from sparsefx.models import build_model

    config = {"algorithm": "rigl", "sparsity": 0.8, "update": {"freq": 2}}
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    y = torch.arange(32) % 10

    def run(steps: int, resume: Path | None = None) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        sm = sparsefx.compile(build_model("mlp").model, config)
        opt = torch.optim.AdamW(sm.parameters(), lr=1e-2)
        if resume is not None:
            load_checkpoint(resume, sm, opt, sparsity=sm.sparsity)
        sm.sparsity.apply(opt)
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(sm(x), y).backward()
            opt.step()
        return sm, opt

    straight, _ = run(8)
    half, opt = run(4)
    save_checkpoint(tmp_path / "ck.pt", half, opt, sparsity_state=half.sparsity.state_dict())
    resumed, _ = run(4, tmp_path / "ck.pt")
    for key, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
