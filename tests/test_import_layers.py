"""The import graph of ``sparsefx`` (with ``passes/`` and ``runtime/``) keeps its layers and has no cycle.

The graph is read with ``ast``, not by importing: an edge ``a -> b`` means that running module ``a``'s
top level imports ``b`` (imports inside functions and under ``if TYPE_CHECKING`` are left out). Importing
``x.y.z`` runs the packages ``x`` and ``x.y`` first, so those are edges too, except the importer's own
ancestors (already running when it runs).

``import_graph(lazy=True)`` also counts the imports inside functions and the public names ``sparsefx``
imports on first use (its ``_LAZY`` table: ``from sparsefx import load_program``, ``sparsefx.lower``):
a cycle hidden by laziness is still a cycle (only ``if TYPE_CHECKING`` blocks, which never run, are
left out).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "sparsefx"
# passes/ and runtime/ are top-level folders installed as sparsefx.passes and sparsefx.runtime
SOURCES = {
    "sparsefx": ROOT,
    "sparsefx.passes": ROOT.parent / "passes",
    "sparsefx.runtime": ROOT.parent / "runtime",
}


def _module_name(path: Path, base: str, folder: Path) -> str:
    parts = (*base.split("."), *path.relative_to(folder).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path, base, folder): path
        for base, folder in SOURCES.items()
        for path in sorted(folder.rglob("*.py"))
    }


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run at import: not function bodies, not ``if TYPE_CHECKING`` blocks."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _top_level(node.orelse)
            continue
        yield node
        if isinstance(node, (ast.If, ast.With, ast.ClassDef)):
            yield from _top_level(node.body)
        if isinstance(node, ast.If):
            yield from _top_level(node.orelse)
        if isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _top_level(block)


def _everywhere(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node``, function bodies included, but not ``if TYPE_CHECKING`` blocks."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in child.orelse:
                yield other
                yield from _everywhere(other)
            continue
        yield child
        yield from _everywhere(child)


@functools.cache
def _package_lazy() -> dict[str, str]:
    """Public name -> the module ``sparsefx.__getattr__`` imports for it (read from its ``_LAZY`` table)."""
    tree = ast.parse((ROOT / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "_LAZY" and node.value is not None:
            return {name: "sparsefx" + module for name, (module, _) in ast.literal_eval(node.value).items()}
    raise AssertionError("sparsefx/__init__.py has no _LAZY table")


def _imports(name: str, path: Path, modules: dict[str, Path], lazy: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    public = _package_lazy() if lazy else {}
    targets: set[str] = set()
    for node in _everywhere(tree) if lazy else _top_level(tree.body):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
            if base == "sparsefx":
                targets.update(public[alias.name] for alias in node.names if alias.name in public)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in public:
            targets.update([public[node.attr]] if node.value.id == "sparsefx" else [])
    ancestors = {name.rsplit(".", i)[0] for i in range(name.count(".") + 1)}
    edges: set[str] = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in modules and prefix not in ancestors:
                edges.add(prefix)
    return edges


def import_graph(lazy: bool = False) -> dict[str, set[str]]:
    """{module: the sparsefx modules its top level imports}; ``lazy``: the modules it imports anywhere."""
    modules = _modules()
    return {name: _imports(name, path, modules, lazy) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] != index[node]:
            return
        component = []
        while True:
            member = stack.pop()
            on_stack.discard(member)
            component.append(member)
            if member == node:
                break
        if len(component) > 1:
            found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _layer(name: str) -> str | None:
    for layer in ("sparsefx.config", "sparsefx.sparse"):
        if name == layer or name.startswith(layer + "."):
            return layer
    return None


def test_graph_sees_the_modules() -> None:
    graph = import_graph()
    assert "sparsefx.sparse.base" in graph
    assert any(_layer(dep) == "sparsefx.config" for dep in graph["sparsefx.sparse.base"])


def test_no_cycle_between_config_and_sparse() -> None:
    for component in cycles(import_graph()):
        layers = {_layer(name) for name in component} - {None}
        assert len(layers) < 2, f"import cycle across config and sparse: {' -> '.join(component)}"


def test_no_import_cycle_anywhere() -> None:
    assert cycles(import_graph()) == []


def test_no_import_cycle_anywhere_counting_lazy_imports() -> None:
    assert cycles(import_graph(lazy=True)) == []


def test_the_lazy_graph_sees_imports_in_functions_and_the_public_names(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sparsefx\n"
        "def f():\n"
        "    from .text import print_program\n"
        "    from sparsefx import load_program\n"
        "    return sparsefx.lower\n"
        "if TYPE_CHECKING:\n"
        "    from .verify import verify_program\n"
    )
    modules = _modules()
    edges = _imports("sparsefx.runtime.probe", probe, modules, lazy=True)
    assert {"sparsefx.runtime.text", "sparsefx.runtime.archive", "sparsefx.lowering"} <= edges
    assert "sparsefx.runtime.verify" not in edges
    assert _imports("sparsefx.runtime.probe", probe, modules) == set()


def test_a_lazy_import_of_the_printer_in_program_py_is_a_cycle(tmp_path: Path) -> None:
    """What ``program.py`` once did: a method importing ``print_program``, whose module imports it."""
    probe = tmp_path / "program.py"
    source = (SOURCES["sparsefx.runtime"] / "program.py").read_text(encoding="utf-8")
    probe.write_text(
        source + "\n\ndef _text(p):\n    from .text import print_program\n\n    return print_program(p)\n"
    )
    graph = import_graph(lazy=True)
    graph["sparsefx.runtime.program"] = _imports("sparsefx.runtime.program", probe, _modules(), lazy=True)
    assert any({"sparsefx.runtime.program", "sparsefx.runtime.text"} <= set(c) for c in cycles(graph))


def test_program_data_knows_nothing_of_its_checks_text_or_file() -> None:
    """``runtime/program.py`` is plain data; ``DataflowProgram`` (``runtime/dataflow.py``) sits above."""
    graph = import_graph(lazy=True)
    reached: set[str] = set()
    todo = ["sparsefx.runtime.program"]
    while todo:
        for dep in graph[todo.pop()] - reached:
            reached.add(dep)
            todo.append(dep)
    tools = {
        f"sparsefx.runtime.{m}"
        for m in ("verify", "text", "textprint", "archive", "archive_write", "dataflow")
    }
    assert not reached & tools, f"runtime/program.py reaches {sorted(reached & tools)}"


def test_the_config_layer_imports_nothing_from_sparse() -> None:
    graph = import_graph()
    for name, deps in graph.items():
        if _layer(name) == "sparsefx.config":
            wrong = sorted(d for d in deps if _layer(d) == "sparsefx.sparse")
            assert not wrong, f"{name} imports {wrong}: the config layer sits below the algorithms"


def test_sparse_never_imports_passes() -> None:
    graph = import_graph()
    for name, deps in graph.items():
        if _layer(name) == "sparsefx.sparse":
            wrong = sorted(d for d in deps if d.startswith("sparsefx.passes"))
            assert not wrong, f"{name} imports {wrong}"


if __name__ == "__main__":
    for lazy in (False, True):
        for component in cycles(import_graph(lazy)):
            print("lazy" if lazy else "top-level", " <-> ".join(component))


def _all_imports(path: Path) -> set[str]:
    """Every module an import statement anywhere in ``path`` names (function bodies included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_graph_sees_passes_and_runtime() -> None:
    graph = import_graph()
    assert "sparsefx.passes.lower.steps" in graph and "sparsefx.runtime.program" in graph


def test_runtime_imports_neither_passes_nor_fx() -> None:
    """The dataflow program and its tools stand alone: no graph passes, no torch.fx, not even lazily."""
    for name, path in _modules().items():
        if not name.startswith("sparsefx.runtime"):
            continue
        text = path.read_text(encoding="utf-8")
        wrong = sorted(
            m for m in _all_imports(path) if m.startswith(("sparsefx.passes", "torch.fx")) or m == "torch.fx"
        )
        wrong += ["from .. passes"] if "from ..passes" in text else []
        wrong += ["torch import fx"] if "from torch import fx" in text else []
        assert not wrong, f"{name} imports {wrong}"


def test_passes_never_import_the_assembly_layer() -> None:
    """Passes (lowering included) work on graphs; the model, compiler and capture sit above them."""
    above = (
        "sparsefx.compiler",
        "sparsefx.model",
        "sparsefx.dispatch",
        "sparsefx.capture",
        "sparsefx.lowering",
    )
    for name, path in _modules().items():
        if not name.startswith("sparsefx.passes"):
            continue
        wrong = sorted(m for m in _all_imports(path) if m.startswith(above))
        assert not wrong, f"{name} imports {wrong}"
