"""Which parameters of a model a config makes sparse: the config's filters plus model-aware rules.

``requires_dense = True`` on a module keeps that module's own parameters dense; weights of embedding
modules stay dense under the default filter whatever they are called (GPT-2's ``wte``)::

    >>> from sparsefx.config import load_config
    >>> m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4))
    >>> sorted(resolve_plan(load_config(0.5), m).sparse)
    ['1.weight']
"""

from __future__ import annotations

from torch import nn

from ..config import SparsityConfig, SparsityPlan

__all__ = ["resolve_plan", "dense_modules", "embedding_weights", "tied_aliases"]


def resolve_plan(cfg: SparsityConfig, model: nn.Module) -> SparsityPlan:
    """Decide every parameter of ``model``: config filters, ``requires_dense``, embedding modules."""
    return cfg.resolve(
        model.named_parameters(),
        dense=dense_modules(model),
        default_dense=embedding_weights(model),
        aliases=tied_aliases(model),
    )


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """``{other name: listed name}`` of parameters reachable under more than one name (a tied LM head);
    ``named_parameters`` lists each under its first name only."""
    first: dict[int, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    return aliases


def embedding_weights(model: nn.Module) -> dict[str, str]:
    """Weights of embedding modules, whatever they are named, with the reason they stay dense."""
    found = {}
    for path, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
            for pname, _ in module.named_parameters(recurse=False):
                found[_join(path, pname)] = f"default exclusion: {type(module).__name__} module"
    return found


def dense_modules(model: nn.Module) -> dict[str, str]:
    """Parameters of modules marked ``requires_dense = True`` (the module's own parameters only)."""
    dense = {}
    for path, module in model.named_modules():
        if getattr(module, "requires_dense", False):
            for pname, _ in module.named_parameters(recurse=False):
                dense[_join(path, pname)] = "requires_dense (module)"
    return dense


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
