"""The training machinery (bound weights, step trust) stays out of the graph vocabulary, and its
global optimizer-step hooks live only while some weight is bound.

Each check runs in a fresh interpreter: what is imported, and whether any weight is bound, is
process-wide state that other tests change.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_ops_do_not_import_the_training_machinery() -> None:
    out = _run(
        """
        import sys
        import sparsefx.ops
        print(sorted(m for m in ("sparsefx.bound", "sparsefx.step_trust") if m in sys.modules))
        """
    )
    assert out == "[]"


def test_bound_does_not_import_step_trust() -> None:
    out = _run(
        """
        import sys
        import sparsefx.bound, sparsefx.ops
        print("sparsefx.step_trust" in sys.modules, sparsefx.ops._bound_fast_path is sparsefx.bound.use_bound)
        """
    )
    assert out == "False True"


def test_step_hooks_live_while_a_weight_is_bound() -> None:
    out = _run(
        """
        import gc
        import torch
        from torch.optim.optimizer import _global_optimizer_post_hooks as post
        from torch.optim.optimizer import _global_optimizer_pre_hooks as pre
        from sparsefx import bound, step_trust
        from sparsefx.ops import apply_mask

        def hooks():
            return step_trust.step_hooks_installed(), len(pre), len(post)

        def bind():
            w = torch.nn.Parameter(torch.ones(4))
            bound.bind_weight(w, {"m": torch.tensor([True, False, True, False])}, "m")
            return w

        print(hooks())
        w, v = bind(), bind()
        print(hooks())
        del w
        gc.collect()
        print(hooks())  # one weight is still bound
        bound.bind_weight(v, None)
        print(hooks())  # unbound: the last binding went
        w = bind()
        print(hooks())  # installed again
        opt = torch.optim.SGD([w], lr=0.1)
        apply_mask(w, w_mask := bound.binding_of(w).mask()).sum().backward()
        opt.step()
        print(bound.is_clean(w, w_mask), w.data[1].item())  # the re-installed hooks keep it clean
        del w, opt
        gc.collect()
        print(hooks())  # collected: the last binding went
        """
    )
    assert out.splitlines() == [
        "(False, 0, 0)",
        "(True, 1, 1)",
        "(True, 1, 1)",
        "(False, 0, 0)",
        "(True, 1, 1)",
        "True 0.0",
        "(False, 0, 0)",
    ]


def test_the_last_binding_collected_during_a_step_leaves_the_step_intact() -> None:
    out = _run(
        """
        import gc
        import torch
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        from sparsefx import bound, step_trust

        class Cycle:
            pass

        gc.disable()  # until the hook collects
        w = torch.nn.Parameter(torch.ones(4))
        bound.bind_weight(w, {"m": torch.tensor([True, False, True, False])}, "m")
        c = Cycle()
        c.self, c.w = c, w  # collected only by a garbage collection
        del w, c

        def collect(*_):
            gc.collect()  # inside torch's loop over the global pre-hooks

        register_optimizer_step_pre_hook(collect)
        register_optimizer_step_pre_hook(lambda *_: None)  # so that torch's loop goes on after it
        v = torch.nn.Parameter(torch.ones(2))
        v.grad = torch.full((2,), 2.0)
        torch.optim.SGD([v], lr=0.5).step()
        print(v.data.tolist(), len(bound._BOUND), step_trust.step_hooks_installed())
        w = torch.nn.Parameter(torch.ones(4))
        bound.bind_weight(w, {"m": torch.tensor([True, False, True, False])}, "m")
        bound.bind_weight(w, None)
        print(step_trust.step_hooks_installed())  # removed once a binding goes outside a step
        """
    )
    assert out.splitlines() == ["[0.0, 0.0] 0 True", "False"]
