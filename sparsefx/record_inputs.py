"""Record the first inputs each of some submodules receives while a model runs.

A ``with_kwargs`` forward pre-hook per submodule keeps the first ``(args, kwargs)`` of each path and
changes nothing; the hooks are gone when the block ends, error or not::

    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    >>> with record_inputs({"0": model[0]}) as seen:
    ...     _ = model(torch.ones(2, 4))
    >>> [tuple(a.shape) for a in seen["0"][0]], seen["0"][1], len(model[0]._forward_pre_hooks)
    ([(2, 4)], {}, 0)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from torch import nn

__all__ = ["Inputs", "record_inputs"]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


@contextlib.contextmanager
def record_inputs(modules: Mapping[str, nn.Module]) -> Iterator[dict[str, Inputs]]:
    """Yield ``{path: (args, kwargs)}``, filled while the block runs with the first call of each module.

    Later calls of a module are not recorded and run with their own inputs.
    """
    seen: dict[str, Inputs] = {}

    def hook(path: str) -> Any:
        def record(module: nn.Module, args: tuple, kwargs: dict) -> None:
            seen.setdefault(path, (args, kwargs))

        return record

    handles = [
        module.register_forward_pre_hook(hook(path), with_kwargs=True) for path, module in modules.items()
    ]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
