"""The import graph of ``src/sluicegate``, read from the source (no module is imported).

Every ``import``/``from … import`` of a ``sluicegate`` module counts, wherever it sits (a
function-level import is a dependency too), except those under ``if TYPE_CHECKING:``
unless ``type_checking=True`` asks for them too.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "sluicegate"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    tree: ast.AST, modules: set[str], current: str, is_package: bool, type_checking: bool
) -> set[str]:
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        # The longest known module the name starts with (``a.b.C`` → ``a.b``).
        while name:
            if name in modules:
                return name
            name = name.rpartition(".")[0]
        return None

    def visit(node: ast.AST) -> None:
        if not type_checking and isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE and (target := resolve(alias.name)):
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = current if is_package else current.rpartition(".")[0]
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            if base.split(".")[0] != PACKAGE:
                return
            for alias in node.names:
                target = resolve(f"{base}.{alias.name}") or resolve(base)
                if target:
                    found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(current)
    return found


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """Module → the ``sluicegate`` modules it imports (``type_checking``: also those
    imported for annotations only)."""
    paths = {module_name(p): p for p in (SRC / PACKAGE).rglob("*.py")}
    modules = set(paths)
    return {
        name: _imports(
            ast.parse(path.read_text()), modules, name, path.name == "__init__.py", type_checking
        )
        for name, path in paths.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out
