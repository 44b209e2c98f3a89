"""Masks under real DistributedDataParallel: 2 gloo processes on localhost, each fed different data.

Every scenario trains a few dozen steps. After every optimizer step each rank hashes the bytes of
all its masks and of all its parameters; the tests require bit-for-bit equal hashes on both ranks
at every step, and masks that really changed. Most scenarios use ``broadcast_buffers=False``, so
that DDP never copies rank 0's masks over the other rank's (not even at construction): each rank's
masks are what its own algorithm computed. One scenario keeps DDP's defaults and accumulates
gradients over two micro-batches under ``no_sync``.

All scenarios run in one pair of spawned processes (one process group), so torch is imported once
per rank; each rank writes one JSON record per scenario and the tests read them. The two last
scenarios cover backward running in a different order on each rank, and a non-finite dense gradient
on one rank only: ``DynamicSparsityAlgorithm`` reduces every parameter in a fixed order, before it checks
finiteness, so both keep the ranks in step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import sparsefx
from sparsefx.models import build_model
from sparsefx.sparse import SET, RigL

WORLD = 2
STEPS = 24
FREQ = 3  # masks change every FREQ optimizer steps
CHECKED = ("set", "rigl", "compiled-rigl", "rigl-accumulate")
KNOWN_DIVERGENT = ("rigl-branch-order", "rigl-nan-on-one-rank")  # run last: the NaN one crashes gloo

Record = dict[str, Any]
Built = tuple[nn.Module, Any, nn.Module]  # (model, sparsity, DDP-wrapped model)


# ------------------------------------------------------------------------------------ models


class BranchOrder(nn.Module):
    """Two same-shape layers whose backward order depends on the input (as with routing)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = (self.a, self.b) if bool(x[0, 0] > 0) else (self.b, self.a)
        h = first(x).relu()
        return self.head(second(h).relu())


def _ddp(model: nn.Module, **kwargs: Any) -> nn.Module:
    with warnings.catch_warnings():  # broadcast_buffers=False is deprecated, but it alone skips the init sync
        warnings.simplefilter("ignore", FutureWarning)
        return DDP(model, **kwargs)


def _plain(algorithm: type, model: nn.Module | None = None, **ddp_kwargs: Any) -> Built:
    model = model if model is not None else build_model("mlp", seed=0).model
    sparsity = algorithm(sparsity=0.8, update={"freq": FREQ}, drop_fraction=0.3, seed=11)
    model.apply(sparsity)
    _ = sparsity.masks  # bind now: DDP is built after the masks and hooks exist
    return model, sparsity, _ddp(model, **ddp_kwargs)


def _compiled() -> Built:
    spec = build_model("mlp", seed=0)
    config = {"algorithm": "rigl", "sparsity": 0.8, "update": {"freq": FREQ}, "seed": 11}
    sm = sparsefx.compile(spec.model, config, example_inputs=spec.args)
    return sm, sm.sparsity, _ddp(sm, broadcast_buffers=False)


def _branch_order() -> Built:
    torch.manual_seed(0)
    return _plain(RigL, BranchOrder(), broadcast_buffers=False)


def _nan_on_one_rank() -> Built:
    """Rank 1's dense gradient gets a NaN at one pruned position of ``net.0.weight`` at step FREQ - 1.

    The selected (sparse) gradient, which DDP all-reduces, stays finite on both ranks.
    """
    model = build_model("mlp", seed=0).model
    weight = model.net[0].weight
    built: list[Any] = []

    def inject(grad: torch.Tensor) -> torch.Tensor:  # registered first: runs before sparsefx's hooks
        sparsity = built[0]
        if dist.get_rank() != 1 or sparsity.step != FREQ - 1:
            return grad
        grad = grad.clone()
        grad[~sparsity.masks["net.0.weight"]] = torch.nan
        return grad

    weight.register_hook(inject)
    model, sparsity, ddp = _plain(RigL, model, broadcast_buffers=False)
    built.append(sparsity)
    return model, sparsity, ddp


BUILDERS: dict[str, Callable[[], Built]] = {
    "set": lambda: _plain(SET, broadcast_buffers=False),
    "rigl": lambda: _plain(RigL, broadcast_buffers=False),
    "compiled-rigl": _compiled,
    "rigl-accumulate": lambda: _plain(RigL),
    "rigl-branch-order": _branch_order,
    "rigl-nan-on-one-rank": _nan_on_one_rank,
}


# ------------------------------------------------------------------------------------ one rank


def _data(rank: int, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch that differs per rank, step and micro-batch; labels are a learnable function of x."""
    gen = torch.Generator().manual_seed(100_000 * rank + 100 * step + micro + 1)
    x = torch.randn(32, 64, generator=gen)
    x[0, 0] = 1.0 - 2.0 * rank  # BranchOrder: rank 0 runs a then b, rank 1 b then a
    return x, (x[:, :10].argmax(1) + (x[:, 10] > 0).long()) % 10


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _run_scenario(name: str, rank: int) -> Record:
    model, sparsity, ddp = BUILDERS[name]()
    micro_batches = 2 if name == "rigl-accumulate" else 1
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    sparsity.apply(opt)
    record: Record = {"masks": [_digest(sparsity.masks)], "params": [], "nnz": [], "loss": []}
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(micro_batches):
            x, y = _data(rank, step, micro)
            sync = micro == micro_batches - 1
            with contextlib.nullcontext() if sync else ddp.no_sync():
                loss = nn.functional.cross_entropy(ddp(x), y) / micro_batches
                loss.backward()
        opt.step()
        masks = sparsity.masks
        record["masks"].append(_digest(masks))
        record["params"].append(_digest(dict(model.named_parameters())))
        record["nnz"].append({n: int(m.sum()) for n, m in masks.items()})
        record["loss"].append(loss.item())
    return record


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=30),
    )
    try:
        for name in (*CHECKED, *KNOWN_DIVERGENT):
            record = _run_scenario(name, rank)
            Path(out, f"{name}.rank{rank}.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------- the tests


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _why_unavailable() -> str | None:
    if not dist.is_available() or not dist.is_gloo_available():
        return "torch.distributed with the gloo backend is not available in this torch build"
    try:
        _free_port()
    except OSError as exc:
        return f"cannot bind a TCP port on 127.0.0.1: {exc}"
    return None


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One 2-process run of every scenario: (folder of records, how the run ended)."""
    why = _why_unavailable()
    if why:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("ddp")
    try:
        mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    except mp.ProcessExitedException as exc:
        return out, f"a rank died: {exc}"
    except mp.ProcessRaisedException as exc:
        return out, f"a rank raised: {str(exc).strip().splitlines()[-1]}"
    return out, "ok"


def _records(run: tuple[Path, str], scenario: str) -> list[Record]:
    out, ended = run
    files = [out / f"{scenario}.rank{rank}.json" for rank in range(WORLD)]
    missing = [f.name for f in files if not f.exists()]
    assert not missing, f"{scenario}: no record from {missing}; the run ended with: {ended}"
    return [json.loads(f.read_text()) for f in files]


@pytest.mark.parametrize("scenario", [*CHECKED, "rigl-branch-order", "rigl-nan-on-one-rank"])
def test_masks_and_weights_are_bit_identical_across_ranks_at_every_step(
    run: tuple[Path, str], scenario: str
) -> None:
    per_rank = _records(run, scenario)
    for step, digests in enumerate(zip(*(r["masks"] for r in per_rank))):
        assert len(set(digests)) == 1, f"{scenario}: masks differ across ranks after step {step}"
    for step, digests in enumerate(zip(*(r["params"] for r in per_rank))):
        assert len(set(digests)) == 1, f"{scenario}: weights differ across ranks after step {step + 1}"


@pytest.mark.parametrize("scenario", CHECKED)
def test_masks_change_on_schedule_and_nnz_stays_constant(run: tuple[Path, str], scenario: str) -> None:
    record = _records(run, scenario)[0]
    masks = record["masks"]
    changed = [step for step in range(1, len(masks)) if masks[step] != masks[step - 1]]
    assert changed, f"{scenario}: masks never changed"
    assert all(step % FREQ == 0 for step in changed), f"{scenario}: masks changed off schedule: {changed}"
    assert len(changed) >= STEPS // FREQ - 1, f"{scenario}: masks changed only at steps {changed}"
    assert all(nnz == record["nnz"][0] for nnz in record["nnz"]), f"{scenario}: nnz changed"


@pytest.mark.parametrize("scenario", CHECKED)
def test_ranks_saw_different_data(run: tuple[Path, str], scenario: str) -> None:
    """Per-rank losses differ: the equal masks are not an accident of equal inputs."""
    first, second = _records(run, scenario)
    assert first["loss"] != second["loss"]
