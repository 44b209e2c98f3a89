"""The import graph of ``sparsefx`` (with ``passes/`` and ``runtime/``) keeps its layers and has no cycle.

The graph is read with ``ast``, not by importing: an edge ``a -> b`` means that running module ``a``'s
top level imports ``b`` (imports inside functions and under ``if TYPE_CHECKING`` are left out). Importing
``x.y.z`` runs the packages ``x`` and ``x.y`` first, so those are edges too, except the importer's own
ancestors (already running when it runs).
"""

from __future__ import annotations

import ast
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


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    ancestors = {name.rsplit(".", i)[0] for i in range(name.count(".") + 1)}
    edges: set[str] = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in modules and prefix not in ancestors:
                edges.add(prefix)
    return edges


def import_graph() -> dict[str, set[str]]:
    """{module: the sparsefx modules its top level imports}."""
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


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
    for component in cycles(import_graph()):
        print(" <-> ".join(component))


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
