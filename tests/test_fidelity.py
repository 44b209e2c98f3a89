"""A compiled model behaves like the original: modes, buffer updates, state_dict keys, any call."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sparsefx
from conftest import assert_outputs_close, reference_forward
from sparsefx.shell import graph_extras


class FunctionalDropout(nn.Module):
    """fx bakes ``training=self.training`` in as a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.dropout(torch.relu(self.fc(x)), 0.5, training=self.training))


class ItemAssignDropout(FunctionalDropout):
    """Item assignment defeats fx, so this one goes through torch.export (dropout as a module too)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h[:, 0] = 0.0
        return self.out(self.drop(F.dropout(torch.relu(h), 0.5, training=self.training)))


class ValueBranchDropout(nn.Module):
    """Value-dependent control flow at the root: captured in parts, the child bakes its mode in."""

    def __init__(self) -> None:
        super().__init__()
        self.body = FunctionalDropout()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.body(x)
        return self.body(-x)


MODES = {"fx": FunctionalDropout, "export": ItemAssignDropout, "partial": ValueBranchDropout}


def _compiled(cls: type, training: bool) -> tuple[nn.Module, sparsefx.SparseModel]:
    model = cls().train(training)
    reference = copy.deepcopy(model)
    sm = sparsefx.compile(model, 0.5, (torch.randn(8, 16),))
    return reference, sm


@pytest.mark.parametrize("method", sorted(MODES))
def test_eval_after_compiling_in_train_mode_turns_dropout_off(method: str) -> None:
    reference, sm = _compiled(MODES[method], training=True)
    assert sm.capture_method == method
    sm.eval()
    reference.eval()
    x = torch.randn(8, 16)
    first, second = sm(x), sm(x)
    assert torch.equal(first, second)
    assert_outputs_close(first, reference_forward(reference, sm.masks, (x,), {}))


@pytest.mark.parametrize("method", sorted(MODES))
def test_train_after_compiling_in_eval_mode_turns_dropout_on(method: str) -> None:
    reference, sm = _compiled(MODES[method], training=False)
    assert sm.capture_method == method
    sm.train()
    reference.train()
    x = torch.randn(8, 16)
    torch.manual_seed(1)
    got = sm(x)
    torch.manual_seed(1)
    want = reference_forward(reference, sm.masks, (x,), {})
    assert_outputs_close(got, want)
    assert not torch.equal(sm(x), sm(x)), "dropout must be on in train mode"


def test_modes_share_masks_parameters_and_optimizer_state() -> None:
    _, sm = _compiled(ItemAssignDropout, training=True)
    opt = torch.optim.SGD(sm.parameters(), lr=0.1, momentum=0.9)
    sm.sparsity.apply(opt)
    x = torch.randn(8, 16)
    sm(x).sum().backward()
    opt.step()
    sm.eval()
    before = sm(x)
    with torch.no_grad():
        sm.get_parameter("out.weight").mul_(2.0)
    assert not torch.equal(before, sm(x)), "the eval graph reads the parameters training updates"
    weight = sm.get_parameter("fc.weight")
    assert bool((weight[~sm.masks["fc.weight"]] == 0).all())
    assert len(sm.variants()[""]) == 2


# ------------------------------------------------------------------------------- buffer updates


class Ema(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("running", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if self.training:
            self.running.mul_(0.9).add_(y.mean(0).detach() * 0.1)
        return y - self.running


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count += 1
        return self.fc(x) * self.count


class BatchNormLike(nn.Module):
    """Running statistics with momentum and a batch counter, written by hand."""

    def __init__(self, n: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(n, n)
        self.register_buffer("mean", torch.zeros(n))
        self.register_buffer("var", torch.ones(n))
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.training:
            m, v = h.mean(0).detach(), h.var(0).detach()
            self.mean.lerp_(m, 0.1)
            self.var.lerp_(v, 0.1)
            self.batches.add_(1)
            return (h - m) / (v + 1e-5).sqrt()
        return (h - self.mean) / (self.var + 1e-5).sqrt()


@pytest.mark.parametrize("cls", [Ema, Counter, BatchNormLike, nn.BatchNorm1d])
def test_in_place_buffer_updates_match_eager(cls: type) -> None:
    model = cls(8) if cls is nn.BatchNorm1d else cls()
    if cls is nn.BatchNorm1d:
        model = nn.Sequential(nn.Linear(8, 8), model)
    reference = copy.deepcopy(model)
    sm = sparsefx.compile(model, 0.5, (torch.randn(4, 8),))
    for _ in range(3):
        x = torch.randn(4, 8)
        assert_outputs_close(sm(x), reference_forward(reference, sm.masks, (x,), {}))
    sm.eval()
    reference.eval()
    x = torch.randn(4, 8)
    assert_outputs_close(sm(x), reference_forward(reference, sm.masks, (x,), {}))
    want = dict(reference.named_buffers())
    got = dict(sm.named_buffers())
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, msg=f"buffer {name}")
    moved = [name for name, value in want.items() if not torch.equal(value, cls_fresh_buffers(cls)[name])]
    assert moved, "three training calls must move some buffer"


def cls_fresh_buffers(cls: type) -> dict[str, torch.Tensor]:
    model = cls(8) if cls is nn.BatchNorm1d else cls()
    if cls is nn.BatchNorm1d:
        model = nn.Sequential(nn.Linear(8, 8), model)
    return dict(model.named_buffers())


def test_fx_never_runs_a_buffer_update_while_tracing() -> None:
    model = Counter()
    with pytest.raises(sparsefx.CaptureError, match="buffer 'count'"):
        sparsefx.compile(model, 0.5)  # fx cannot record it and there are no inputs for export
    assert int(model.count) == 0 and isinstance(model.count, torch.Tensor)


# ---------------------------------------------------------------------------------- state_dict


class Unread(nn.Module):
    """Parameters and buffers the forward never reads, and a non-persistent buffer."""

    def __init__(self, untraceable: bool = False) -> None:
        super().__init__()
        self.untraceable = untraceable
        self.fc = nn.Linear(8, 8)
        self.spare = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.ones(3))
        self.register_buffer("seen", torch.zeros(2))
        self.register_buffer("cache", torch.ones(2), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.untraceable:
            h[:, 0] = 0.0
        return h


@pytest.mark.parametrize("untraceable", [False, True], ids=["fx", "export"])
def test_state_dict_is_the_original_plus_masks(untraceable: bool) -> None:
    model = Unread(untraceable)
    original = dict(model.state_dict())
    sm = sparsefx.compile(model, {"sparsity": 0.5, "param_filter": "*.weight"}, (torch.randn(2, 8),))
    assert sm.capture_method == ("export" if untraceable else "fx")
    masks = {f"{name}_mask" for name in sm.masks}
    assert masks == {"fc.weight_mask", "spare.weight_mask"}
    assert set(sm.state_dict()) == set(original) | masks
    assert {n for n, _ in sm.named_parameters()} == {n for n, _ in model.named_parameters()}
    assert "cache" in dict(sm.named_buffers()) and "cache" not in sm.state_dict()
    result = sm.load_state_dict(Unread(untraceable).state_dict(), strict=False)
    assert sorted(result.missing_keys) == sorted(masks) and not result.unexpected_keys
    with torch.no_grad():
        sm.get_parameter("scale").fill_(3.0)
    assert float(model.scale.detach()[0]) == 3.0, "the compiled model trains the caller's parameters"


class Constants(nn.Module):
    """Tensors the forward builds itself: fx stows them as ``_tensor_constant*``, export lifts them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.register_buffer("keep", torch.tensor([[True, False, True]] * 3))
        self.scale = torch.tensor([0.5, 1.0, 2.0])  # a plain attribute of the root: neither buffer nor state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.keep | torch.eye(3, dtype=torch.bool)
        return (self.fc(x) @ mixed.to(x.dtype)) * self.scale + torch.tensor([1.0, -1.0, 3.0])


@pytest.mark.parametrize("method", ["fx", "export"])
def test_tensor_constants_stay_with_the_graph_out_of_state_dict(method: str) -> None:
    model = Constants()
    original = set(model.state_dict())
    x = torch.randn(4, 3)
    sm = sparsefx.compile(model, {"sparsity": 0.5}, (x,), capture_method=method)
    assert sm.capture_method == method
    assert set(sm.state_dict()) == original | {"fc.weight_mask"}
    assert not any("constant" in name for name, _ in model.named_buffers()), "the tracer left them behind"
    fresh = torch.randn(5, 3)
    assert_outputs_close(sm(fresh), reference_forward(model, sm.masks, (fresh,), {}))
    sm.eval()
    program = sparsefx.lower(sm, x, mesh=(16, 4))
    for executor in ("fast", "reference"):
        assert_outputs_close(sparsefx.run(program, x, executor=executor).outputs, sm(x), atol=1e-5)
    sm.to(torch.float64)  # moves the graph's own constants, like parameters; the plain attribute stays
    gm = sm.graph_module
    moved = [getattr(gm, name) for name in graph_extras(gm) if isinstance(getattr(gm, name), torch.Tensor)]
    assert len(moved) >= 1 and {t.dtype for t in moved if t.is_floating_point()} == {torch.float64}
    assert gm.scale is model.scale and model.scale.dtype == torch.float32
    want = reference_forward(copy.deepcopy(model).double(), sm.masks, (fresh.double(),), {})
    assert_outputs_close(sm(fresh.double()), want)


# ------------------------------------------------------------------------------------- any call


class Keywords(nn.Module):
    """Optional keyword inputs and a dataclass-free dict output; item assignment defeats fx."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        h = self.fc(x)
        h[..., 0] = 0.0
        if mask is not None:
            h = h * mask.unsqueeze(-1)
        logits = self.head(h)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.flatten(0, -2), labels.flatten())
        return out


def test_export_captured_model_accepts_every_call_the_original_does(caplog: pytest.LogCaptureFixture) -> None:
    model = Keywords()
    reference = copy.deepcopy(model)
    sm = sparsefx.compile(model, 0.5, (torch.randn(2, 5, 8),))
    assert sm.capture_method == "export"
    calls = [
        ((torch.randn(3, 7, 8),), {}),
        ((), {"x": torch.randn(2, 5, 8)}),
        ((torch.randn(4, 6, 8),), {"mask": torch.ones(4, 6)}),
        ((torch.randn(2, 5, 8),), {"labels": torch.randint(0, 3, (2, 5))}),
        ((torch.randn(2, 5, 8), torch.ones(2, 5)), {"labels": torch.randint(0, 3, (2, 5))}),
    ]
    with caplog.at_level(logging.INFO, logger="sparsefx"):
        for args, kwargs in calls:
            assert_outputs_close(sm(*args, **kwargs), reference_forward(reference, sm.masks, args, kwargs))
    captured_again = [r for r in caplog.records if "captured the model again" in r.getMessage()]
    assert len(captured_again) == 4, [r.getMessage() for r in captured_again]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sparsefx"):
        for args, kwargs in calls:
            sm(*args, **kwargs)
    assert not [r for r in caplog.records if "again" in r.getMessage()], "graphs are cached by call"


def test_fx_model_called_with_a_default_it_baked_in() -> None:
    class Optional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, scale: float = 1.0, mask: torch.Tensor | None = None):
            h = self.fc(x) * scale
            return h if mask is None else h * mask

    model = Optional()
    reference = copy.deepcopy(model)
    sm = sparsefx.compile(model, 0.5)
    assert sm.capture_method == "fx"
    for args, kwargs in [
        ((torch.randn(2, 4),), {}),
        ((torch.randn(2, 4), 3.0), {}),
        ((torch.randn(2, 4),), {"scale": 2.0, "mask": torch.zeros(2, 4)}),
        ((torch.randn(2, 4),), {"mask": None}),
    ]:
        assert_outputs_close(sm(*args, **kwargs), reference_forward(reference, sm.masks, args, kwargs))


class TwoReads(nn.Module):
    """With ``twice=True`` the weight is also read outside a named masked op (through ``.t()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, twice: bool = False) -> torch.Tensor:
        h = self.fc(x)
        if twice:
            h = h + x @ self.fc.weight.t()
        return h


def test_a_graph_that_reads_a_weight_another_way_stops_in_place_gradient_selects() -> None:
    from sparsefx.bound import binding_of

    model = TwoReads()
    reference = copy.deepcopy(model)
    sm = sparsefx.compile(model, 0.5)
    weight = sm.get_parameter("fc.weight")
    assert sm.weights_with_fresh_grads() == {"fc.weight"} and binding_of(weight).fresh
    x = torch.randn(3, 6, requires_grad=False)
    sm(x, twice=True).pow(2).sum().backward()
    assert sm.weights_with_fresh_grads() == frozenset() and not binding_of(weight).fresh
    params = {n: p.detach().clone().requires_grad_() for n, p in reference.named_parameters()}
    mask = sm.masks["fc.weight"]
    masked = {**params, "fc.weight": params["fc.weight"] * mask}
    torch.func.functional_call(reference, masked, (x,), {"twice": True}).pow(2).sum().backward()
    torch.testing.assert_close(weight.grad, torch.where(mask, params["fc.weight"].grad, 0.0))


class BatchBranch(nn.Module):
    """Export specializes the batch size (a Python branch on it); item assignment defeats fx."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h[:, 0] = 0.0
        return h * 2 if x.shape[0] == 4 else h


def test_a_shape_export_specialized_is_captured_again_once(caplog: pytest.LogCaptureFixture) -> None:
    model = BatchBranch()
    reference = copy.deepcopy(model)
    sm = sparsefx.compile(model, 0.5, (torch.randn(4, 8),))
    assert sm.capture_method == "export"
    with caplog.at_level(logging.INFO, logger="sparsefx"):
        for batch in (5, 5, 4, 5, 3):
            x = torch.randn(batch, 8)
            assert_outputs_close(sm(x), reference_forward(reference, sm.masks, (x,), {}))
    again = [r.getMessage() for r in caplog.records if "again" in r.getMessage()]
    assert len(again) == 2 and all("shapes its graph cannot take" in m for m in again), again
