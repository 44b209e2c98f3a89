"""``sparsefx.freeze``: a compiled model as an inference module on sparse CPU kernels.

``freeze(sm)`` copies the module tree ``sm`` runs (its weights as they are now, pruned entries zero), and
replaces each linear layer whose weight is sparse (``nn.Linear``, Hugging Face's ``Conv1D``) with a
``SparseLinear``, and each such ``Conv1d`` and ``Conv2d`` (one group) with a ``SparseConv``: the weight
packed once (``packed.py``), and for each bucket of tokens (output positions, for a convolution) the
kernel that measured fastest here (``choose.py``), dense where no sparse kernel is faster; each timed as
the model will run it, from cache or, for a model larger than the last-level cache, from memory
(``cache.py``). The model runs its own eager forward, so it takes any batch and length, keeps its control
flow and returns its own output types; a Hugging Face causal LM still ``generate``s with its cache. Other
sparse weights (a grouped or 3-d convolution, a weight read by a matmul), and a layer no sparse kernel
runs faster at any size, keep their masked dense values (and the original module) and are named in
``freeze_report``::

    >>> import torch, sparsefx
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8))
    >>> sm = sparsefx.compile(model, 0.9).eval()
    >>> fast = sparsefx.freeze(sm)  # measures its kernels: a second or so
    >>> x = torch.randn(256, 1024)
    >>> torch.allclose(fast(x), sm(x), rtol=1e-4, atol=1e-5)
    True
    >>> [(row.weight, round(row.density, 3)) for row in fast.freeze_report]  # and .kernels: as measured
    [('0.weight', 0.1), ('2.weight', 0.1)]

A frozen model is for inference: ``.train()``, ``.parameters()`` (an optimizer) and inputs that
require gradients are a ``FreezeError``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sparsefx.errors import FreezeError

from . import cache, kernels
from .choose import choose
from .packed import PackedWeight, pack
from .sparse_conv import CONV_BUCKETS, SparseConv, choose_conv, conv_refusal
from .sparse_linear import SparseLinear

__all__ = ["freeze", "FrozenModel", "LayerReport", "BACKENDS"]

BACKENDS = ("auto", "torch")
"""``"auto"``: every kernel that runs here (numba's with the ``fast`` extra); ``"torch"``: torch's own."""


@dataclass(frozen=True)
class LayerReport:
    """One sparse weight of the frozen model: where it went and what it costs to store."""

    weight: str  # the sparse weight's name (as in ``sm.masks``)
    shape: tuple[int, ...]
    density: float
    kernels: tuple[str, ...]  # per token bucket (``choose.BUCKETS``); () where it stays dense
    why_dense: str  # why it was not packed ("" when it was)
    dense_bytes: int
    frozen_bytes: int


class FrozenModel(nn.Module):
    """An inference module: ``module`` with its sparse linear layers on sparse kernels (``freeze``)."""

    def __init__(
        self, module: nn.Module, report: list[LayerReport], seconds: float, cold: bool = False
    ) -> None:
        super().__init__()
        self.module = module
        self.freeze_report = report
        self.freeze_seconds = seconds
        self.timed_cold = cold  # kernels timed reading weights from memory (a model larger than the cache)
        super().train(False)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        leaves = [*args, *kwargs.values()]
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves):
            raise FreezeError("a frozen model computes no gradients; pass inputs that do not require grad")
        with torch.no_grad():
            return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> FrozenModel:
        if mode:
            raise FreezeError("a frozen model is for inference; train the SparseModel it was frozen from")
        return super().train(False)

    def parameters(self, recurse: bool = True) -> Any:
        raise FreezeError(
            "a frozen model has nothing to train (an optimizer on it would change nothing); "
            "optimize the SparseModel and freeze it again"
        )

    def requires_grad_(self, requires_grad: bool = True) -> FrozenModel:
        if requires_grad:
            raise FreezeError("a frozen model computes no gradients")
        return self

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["module"], name)  # the model's own methods: generate, config

    @property
    def dense_bytes(self) -> int:
        """Bytes the sparse weights take dense."""
        return sum(r.dense_bytes for r in self.freeze_report)

    @property
    def frozen_bytes(self) -> int:
        """Bytes they take in the frozen model (packed, or dense where they stayed dense)."""
        return sum(r.frozen_bytes for r in self.freeze_report)


def _copy_tree(sm: nn.Module) -> nn.Module:
    """The module tree ``sm`` runs, with its own tensors (a snapshot: training ``sm`` on leaves it)."""
    from sparsefx.compiler import _source_tree

    tree = _source_tree(sm)
    copies: dict[int, Any] = {}
    for module in tree.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in copies:
                    copies[id(p)] = nn.Parameter(p.detach().clone(), requires_grad=False)
                module._parameters[name] = copies[id(p)]
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = copies.setdefault(id(b), b.detach().clone())
    return tree


def _linear_of(module: nn.Module) -> bool | None:
    """Whether ``module``'s ``weight`` is stored transposed (``[in, out]``: Hugging Face GPT-2's
    ``Conv1D``) or not (``nn.Linear``); None where ``module`` is not a linear layer."""
    if type(module) is nn.Linear:
        return False
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        return True
    return None


def _owners(tree: nn.Module, weight: torch.Tensor) -> list[tuple[str, nn.Module]]:
    """Every module of ``tree`` (by path) whose ``weight`` is ``weight`` itself (tied layers too)."""
    return [
        (path, m)
        for path, m in tree.named_modules(remove_duplicate=False)
        if m._parameters.get("weight") is weight
    ]


def _replace(tree: nn.Module, path: str, layer: nn.Module) -> None:
    parent, _, child = path.rpartition(".")
    (tree.get_submodule(parent) if parent else tree)._modules[child] = layer


class _Packer:
    """Packs one sparse weight of ``tree`` at a time into the layers that read it (``freeze``)."""

    def __init__(self, tree: nn.Module, candidates: list[str], cold: bool) -> None:
        self.tree, self.candidates, self.cold = tree, candidates, cold
        self.chosen: dict[tuple, tuple[str, ...]] = {}  # one measurement per shape, geometry and density

    def pack(self, name: str, mask: torch.Tensor) -> LayerReport:
        """Mask weight ``name`` in place and swap the layers reading it for packed ones."""
        owner_name, _, param = name.rpartition(".")
        owner = self.tree.get_submodule(owner_name)
        weight = getattr(owner, param)
        weight.data.masked_fill_(~mask.to(weight.device), 0.0)  # every reader sees the masked weight
        dense_bytes = weight.numel() * weight.element_size()
        row = functools.partial(LayerReport, name, tuple(weight.shape), dense_bytes=dense_bytes)
        # the layers reading this tensor, whichever module the mask is named after (a tied LM head's
        # mask may carry the embedding's name): they share one packing
        readers = _owners(self.tree, weight)
        linears = [(path, m, _linear_of(m)) for path, m in readers if _linear_of(m) is not None]
        convs = [(path, m) for path, m in readers if conv_refusal(m) is None]
        if linears:
            return self._linear(row, weight, mask, linears)
        if convs:
            return self._conv(row, weight, mask, convs)
        why = next((w for w in map(conv_refusal, (m for _, m in readers)) if w), "")
        why = why or f"a {type(owner).__name__}'s {param}: sparse kernels run linear layers and convolutions"
        return row(float(mask.float().mean()), (), why, frozen_bytes=dense_bytes)

    def _linear(self, row: Callable, weight: torch.Tensor, mask: torch.Tensor, linears: list) -> LayerReport:
        transposed = linears[0][2]
        p = pack(weight.T if transposed else weight, mask.T if transposed else mask)
        key = ("linear", p.out_features, p.in_features, round(p.density, 2), p.values.dtype)
        if key not in self.chosen:
            self.chosen[key] = choose(p, self.candidates, linears[0][1].bias, cold=self.cold)
        picked = self.chosen[key]
        if set(picked) == {"dense"}:
            return self._dense(row, p)
        for path, module, flipped in linears:
            if flipped == transposed:
                _replace(self.tree, path, SparseLinear(p, module.bias, picked, transposed))
        return row(p.density, picked, "", frozen_bytes=p.nbytes + len(picked))

    def _conv(self, row: Callable, weight: torch.Tensor, mask: torch.Tensor, convs: list) -> LayerReport:
        out_channels = weight.shape[0]
        p = pack(weight.reshape(out_channels, -1), mask.reshape(out_channels, -1))
        first = convs[0][1]
        geometry = (first.kernel_size, first.stride, first.dilation, first._reversed_padding_repeated_twice)
        key = ("conv", tuple(weight.shape), geometry, first.padding_mode, round(p.density, 2), p.values.dtype)
        if key not in self.chosen:
            probe = SparseConv(first, p, ("dense",) * len(CONV_BUCKETS))
            self.chosen[key] = choose_conv(probe, self.candidates, cold=self.cold)
        picked = self.chosen[key]
        if set(picked) == {"dense"}:
            return self._dense(row, p)
        for path, module in convs:
            _replace(self.tree, path, SparseConv(module, p, picked))
        return row(p.density, picked, "", frozen_bytes=p.nbytes + len(picked))

    @staticmethod
    def _dense(row: Callable, p: PackedWeight) -> LayerReport:
        """A weight no sparse kernel runs faster at any size: its layers stay as they are."""
        why = "bfloat16: the sparse kernels take float32" if p.values.dtype != torch.float32 else ""
        why = why or "dense measured fastest at every size"
        return row(p.density, (), why, frozen_bytes=row.keywords["dense_bytes"])


def freeze(
    sm: nn.Module,
    backend: str = "auto",
    *,
    on_layer: Callable[[str, int, int], None] | None = None,
) -> FrozenModel:
    """``sm`` (a ``SparseModel``) as a ``FrozenModel`` (module docstring). ``backend`` is one of
    ``BACKENDS``; ``on_layer(name, done, total)`` is called before each sparse weight is packed."""
    from sparsefx.model import SparseModel

    if not isinstance(sm, SparseModel):
        raise FreezeError(f"freeze takes a SparseModel (sparsefx.compile's result); got {type(sm).__name__}")
    if backend not in BACKENDS:
        raise FreezeError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    t0 = time.perf_counter()
    masks = {name: m.detach().to("cpu") for name, m in sm.masks.items()}
    tree = _copy_tree(sm)
    cold = model_bytes(tree) > cache.last_level_bytes()
    packer = _Packer(tree, kernels.available_kernels(backend), cold)
    report: list[LayerReport] = []
    try:
        for i, (name, mask) in enumerate(masks.items()):
            if on_layer is not None:
                on_layer(name, i, len(masks))
            report.append(packer.pack(name, mask))
    finally:
        cache.release()
    if not kernels.NUMBA and backend == "auto":
        report_missing_numba()
    return FrozenModel(tree.eval(), report, time.perf_counter() - t0, cold)


def model_bytes(tree: nn.Module) -> int:
    """Bytes of ``tree``'s parameters and buffers, each tensor once (a tied weight is one)."""
    tensors = {id(t): t for t in (*tree.parameters(), *tree.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


_warned = False


def report_missing_numba() -> None:
    """Say once per process that the numba kernels are missing (the ``fast`` extra)."""
    global _warned
    if not _warned:
        import warnings

        warnings.warn(
            "sparsefx.freeze: numba is not installed (pip install 'sparsefx[fast]'), so frozen layers "
            "use torch's sparse kernels only, which are slower at 1 and at 128 or more tokens",
            UserWarning,
            stacklevel=3,
        )
        _warned = True
