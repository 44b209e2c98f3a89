"""Custom algorithms written as the Cerebras docs show them: chosen by name, with hyperparameters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

import sparsefx
from sparsefx.config import load_config
from sparsefx.config.registry import algorithm_names, register_algorithm, unregister_algorithm
from sparsefx.errors import ConfigError
from sparsefx.models import build_model
from sparsefx.sparse import DynamicSparsityAlgorithm, SparsityAlgorithm
from sparsefx.sparse.init import keep_count

NAMES = ("kwonly", "alphaalgo", "positional", "withdefault", "staticlike", "halfdone")


class KwOnly(DynamicSparsityAlgorithm):
    """``__init__(self, **kwargs)``: no hyperparameters of its own."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)

    def update_mask(self, p: torch.Tensor, mask: torch.Tensor, sparsity: float) -> torch.Tensor:
        return torch.roll(mask, 1, dims=-1)


class AlphaAlgo(DynamicSparsityAlgorithm):
    """An explicit level and hyperparameter, the rest forwarded."""

    def __init__(self, sparsity: object, my_alpha: float = 0.1, **kwargs: object) -> None:
        super().__init__(sparsity=sparsity, **kwargs)
        self.my_alpha = my_alpha
        self.level_seen = sparsity

    def update_mask(self, p: torch.Tensor, mask: torch.Tensor, sparsity: float) -> torch.Tensor:
        score = p.abs() + self.my_alpha * torch.rand(p.shape, generator=self.generator)
        return self.drop_and_grow(p, mask, sparsity, score)


class Positional(DynamicSparsityAlgorithm):
    """Cerebras style: the level passed on positionally, ``super().__init__(sparsity, **kwargs)``."""

    def __init__(self, sparsity: object, beta: int = 1, **kwargs: object) -> None:
        super().__init__(sparsity, **kwargs)
        self.beta = beta

    def update_mask(self, p: torch.Tensor, mask: torch.Tensor, sparsity: float) -> torch.Tensor:
        return torch.roll(mask, self.beta, dims=-1)


class WithDefault(DynamicSparsityAlgorithm):
    """A subclass that gives its own default update interval on its way up."""

    def __init__(self, **kwargs: object) -> None:
        kwargs.setdefault("update", {"freq": 2})
        super().__init__(**kwargs)

    def update_mask(self, p: torch.Tensor, mask: torch.Tensor, sparsity: float) -> torch.Tensor:
        return torch.roll(mask, 1, dims=-1)


class StaticLike(SparsityAlgorithm):
    """A ``SparsityAlgorithm`` subclass that implements ``update()`` and takes a hyperparameter."""

    def __init__(self, gamma: float = 0.0, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.gamma = gamma

    def update(self) -> None:
        self.step += 1


class HalfDone(DynamicSparsityAlgorithm):
    """Leaves ``update_mask`` abstract: not offered as an algorithm name."""


CLASSES = (KwOnly, AlphaAlgo, Positional, WithDefault, StaticLike, HalfDone)
for _cls in CLASSES:  # defining them registered them: only this module's tests may see the names
    unregister_algorithm(_cls.__name__)


@pytest.fixture(autouse=True, scope="module")
def _registered() -> Iterator[None]:
    for cls in CLASSES:
        register_algorithm(cls)
    yield
    for name in NAMES:
        unregister_algorithm(name)


def _mlp() -> nn.Module:
    return build_model("mlp").model


def _train(model: nn.Module, sparsity: SparsityAlgorithm, steps: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sparsity.apply(opt)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 64, generator=gen)
    y = x[:, :10].argmax(1)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _check_trained(model: nn.Module, sparsity: SparsityAlgorithm, level: float) -> None:
    for name, mask in sparsity.masks.items():
        assert int(mask.sum()) == keep_count(mask.numel(), level)
        assert bool((model.get_parameter(name)[~mask] == 0).all())


def test_kwargs_only_subclass_is_selectable_and_trains() -> None:
    sm = sparsefx.compile(_mlp(), {"algorithm": "kwonly", "sparsity": 0.5, "update": {"freq": 1}})
    assert isinstance(sm.sparsity, KwOnly)
    before = {n: m.clone() for n, m in sm.masks.items()}
    _train(sm, sm.sparsity, 1)
    for name, mask in sm.masks.items():
        assert torch.equal(mask, torch.roll(before[name], 1, dims=-1))
    _check_trained(sm, sm.sparsity, 0.5)


def test_hyperparameters_from_a_config_dict_reach_the_constructor() -> None:
    config = {"algorithm": "alphaalgo", "sparsity": 0.5, "my_alpha": 0.2, "update": {"freq": 2}}
    sm = sparsefx.compile(_mlp(), config)
    assert isinstance(sm.sparsity, AlphaAlgo)
    assert sm.sparsity.my_alpha == 0.2
    assert sm.sparsity.level_seen == 0.5  # a constant level arrives as a number
    assert sm.sparsity.update_schedule.freq == 2
    assert dict(sm.sparsity.group.options) == {"my_alpha": 0.2}
    _train(sm, sm.sparsity, 4)
    assert sm.sparsity.step == 4
    _check_trained(sm, sm.sparsity, 0.5)


def test_hyperparameter_default_applies_when_the_config_omits_it() -> None:
    sm = sparsefx.compile(_mlp(), {"algorithm": "alphaalgo", "sparsity": 0.5})
    assert sm.sparsity.my_alpha == 0.1


def test_direct_construction_with_model_apply_trains() -> None:
    model = _mlp()
    sparsity = AlphaAlgo(sparsity=0.5, my_alpha=0.2, update={"freq": 1})
    model.apply(sparsity)
    _train(model, sparsity, 3)
    assert sparsity.my_alpha == 0.2 and sparsity.step == 3
    _check_trained(model, sparsity, 0.5)


def test_positional_level_works_directly_and_by_name() -> None:
    direct = Positional(0.75, beta=2, update={"freq": 1})
    assert direct.group.sparsity(0) == 0.75 and direct.beta == 2
    sm = sparsefx.compile(_mlp(), {"algorithm": "positional", "sparsity": 0.75, "beta": 3})
    assert isinstance(sm.sparsity, Positional) and sm.sparsity.beta == 3
    _train(sm, sm.sparsity, 2)
    _check_trained(sm, sm.sparsity, 0.75)


def test_a_subclass_default_group_key_yields_to_the_config() -> None:
    assert WithDefault(sparsity=0.5).update_schedule.freq == 2
    by_name = sparsefx.compile(_mlp(), {"algorithm": "withdefault", "sparsity": 0.5})
    assert by_name.sparsity.update_schedule.freq == 2
    given = sparsefx.compile(_mlp(), {"algorithm": "withdefault", "sparsity": 0.5, "update": {"freq": 5}})
    assert given.sparsity.update_schedule.freq == 5


def test_sparsity_algorithm_subclass_with_a_hyperparameter() -> None:
    sm = sparsefx.compile(_mlp(), {"algorithm": "staticlike", "sparsity": 0.5, "gamma": 1.5})
    assert isinstance(sm.sparsity, StaticLike) and sm.sparsity.gamma == 1.5
    _train(sm, sm.sparsity, 2)
    _check_trained(sm, sm.sparsity, 0.5)


def test_hyperparameters_work_in_a_list_config() -> None:
    config = [
        {"algorithm": "alphaalgo", "sparsity": 0.5, "my_alpha": 0.3, "param_filter": "net.0.*"},
        {"sparsity": 0.9},
    ]
    sm = sparsefx.compile(_mlp(), config)
    assert sm.sparsity.algorithms[0].my_alpha == 0.3
    _train(sm, sm.sparsity, 2)


def test_a_key_the_constructor_does_not_take_is_a_config_error_listing_what_it_takes() -> None:
    with pytest.raises(ConfigError, match=r"sparsity\.my_alhpa: unknown key \(did you mean 'my_alpha'\?\)"):
        load_config({"algorithm": "alphaalgo", "sparsity": 0.5, "my_alhpa": 0.2})
    with pytest.raises(ConfigError, match=r"AlphaAlgo.__init__ accepts my_alpha besides the group keys"):
        load_config({"algorithm": "alphaalgo", "sparsity": 0.5, "other": 1})
    with pytest.raises(ConfigError, match=r"my_alpha: .*KwOnly.__init__ accepts no hyperparameters"):
        load_config({"algorithm": "kwonly", "sparsity": 0.5, "my_alpha": 0.2})
    with pytest.raises(ConfigError, match=r"KwOnly.__init__ accepts no hyperparameters"):
        KwOnly(sparsity=0.5, my_alpha=0.2)


def test_built_in_algorithms_take_no_extra_keys() -> None:
    with pytest.raises(ConfigError, match=r"sparsity\.my_alpha: unknown key; valid keys: algorithm"):
        load_config({"algorithm": "set", "sparsity": 0.5, "my_alpha": 0.2})


def test_missing_level_is_still_reported_as_missing() -> None:
    with pytest.raises(ConfigError, match=r"sparsity\.sparsity: missing required key"):
        sparsefx.compile(_mlp(), {"algorithm": "alphaalgo", "my_alpha": 0.2})


def test_abstract_classes_are_not_algorithm_names() -> None:
    names = algorithm_names()
    assert "dynamicsparsityalgorithm" not in names
    assert "sparsityalgorithm" not in names
    assert "halfdone" not in names
    assert {"static", "gmp", "set", "rigl", "kwonly"} <= set(names)
    for name in ("dynamicsparsityalgorithm", "halfdone"):
        with pytest.raises(ConfigError, match=f"unknown algorithm '{name}'") as info:
            load_config({"algorithm": name, "sparsity": 0.5})
        valid = str(info.value).split("valid: ", 1)[1]
        assert "dynamicsparsityalgorithm" not in valid and "halfdone" not in valid
        assert "rigl" in valid


def test_validate_refuses_an_abstract_name() -> None:
    from sparsefx.cli import main

    assert main(["validate", "{algorithm: dynamicsparsityalgorithm, sparsity: 0.5}", "--model", "mlp"]) == 2


def test_a_required_hyperparameter_missing_from_the_config_is_a_config_error() -> None:
    class NeedsBeta(DynamicSparsityAlgorithm):
        def __init__(self, beta: int, **kwargs: object) -> None:
            super().__init__(**kwargs)
            self.beta = beta

        def update_mask(self, p: torch.Tensor, mask: torch.Tensor, sparsity: float) -> torch.Tensor:
            return mask

    try:
        with pytest.raises(ConfigError, match=r"sparsity\.beta: missing required key: NeedsBeta.__init__"):
            sparsefx.compile(_mlp(), {"algorithm": "needsbeta", "sparsity": 0.5})
        sm = sparsefx.compile(_mlp(), {"algorithm": "needsbeta", "sparsity": 0.5, "beta": 2})
        assert sm.sparsity.beta == 2
    finally:
        unregister_algorithm("needsbeta")
