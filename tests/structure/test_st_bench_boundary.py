"""The lab's boundary: ``sluicegate.bench`` uses only the public API of the gateway packages.

Read from the source (nothing is imported). Two checks, both over every module under
``src/sluicegate/bench``:

- **imports**: no ``from sluicegate.<not bench> import _name`` and no private module in a
  ``sluicegate`` import path (``sluicegate.gateway._x``), relative imports resolved;
- **attributes**: no ``obj._name`` whose name the lab does not define itself. The lab's own
  names are every function, class, assignment target and ``self._x = …`` attribute under
  ``bench/``; an underscored attribute outside that set can only be someone else's private.
  This is a heuristic (it cannot tell a lab name from a same-named private of another
  package), so the lab avoids reusing the gateway's private names on foreign objects;
- **subclasses**: a lab class whose base comes from outside the lab touches none of the
  base's private names through ``self`` (the base's ``__slots__``, ``self._x`` attributes
  and ``_x`` methods, read from its source).
"""

from __future__ import annotations

import ast
from pathlib import Path

from import_graph import PACKAGE, SRC, module_name

BENCH = SRC / PACKAGE / "bench"
BENCH_PACKAGE = f"{PACKAGE}.bench"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(BENCH.rglob("*.py"))}


def _assigns_slots(node: ast.AST) -> bool:
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
    )


def _defined_names(trees: dict[Path, ast.Module]) -> set[str]:
    """Every name the lab defines: functions, classes, assigned names and attributes."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            if _assigns_slots(node):
                # ``__slots__`` entries declare attributes (a class's own, so the lab's)
                names.update(
                    c.value
                    for c in ast.walk(node)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
    return names


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    if not node.level:
        return node.module or ""
    current = module_name(path)
    package = current if path.name == "__init__.py" else current.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _outside_bench(module: str) -> bool:
    in_package = module == PACKAGE or module.startswith(PACKAGE + ".")
    in_bench = module == BENCH_PACKAGE or module.startswith(BENCH_PACKAGE + ".")
    return in_package and not in_bench


def private_imports(trees: dict[Path, ast.Module]) -> list[str]:
    """``file:line name`` for each private name or module imported from outside the lab."""
    found: list[str] = []
    for path, tree in trees.items():
        where = path.relative_to(SRC)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = _absolute(node, path)
                if not _outside_bench(module):
                    continue
                if any(_private(part) for part in module.split(".")):
                    found.append(f"{where}:{node.lineno} {module}")
                found += [
                    f"{where}:{node.lineno} {module}.{alias.name}"
                    for alias in node.names
                    if _private(alias.name)
                ]
            elif isinstance(node, ast.Import):
                found += [
                    f"{where}:{node.lineno} {alias.name}"
                    for alias in node.names
                    if _outside_bench(alias.name) and any(map(_private, alias.name.split(".")))
                ]
    return found


def foreign_private_attributes(trees: dict[Path, ast.Module]) -> list[str]:
    """``file:line .name`` for each underscored attribute the lab reads but never defines."""
    own = _defined_names(trees)
    return [
        f"{path.relative_to(SRC)}:{node.lineno} .{node.attr}"
        for path, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own
    ]


def _module_file(module: str) -> Path | None:
    base = SRC.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _find_class(module: str, name: str, depth: int = 0) -> ast.ClassDef | None:
    """The definition of ``module.name``, following re-exports (``from x import name``)."""
    path = _module_file(module)
    if path is None or depth > 5:
        return None
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            return _find_class(_absolute(node, path), name, depth + 1)
    return None


def _private_members(cls: ast.ClassDef) -> set[str]:
    names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(cls):
        if _assigns_slots(node):
            names.update(
                c.value
                for c in ast.walk(node)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            )
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, ast.Store)
        ):
            names.add(node.attr)
    return {n for n in names if _private(n)}


def inherited_privates(trees: dict[Path, ast.Module]) -> list[str]:
    """``file:line Class._name`` for each private of a foreign base a lab class touches."""
    found: list[str] = []
    for path, tree in trees.items():
        imported = {
            alias.asname or alias.name: _absolute(node, path)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        local = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        for cls in local.values():
            forbidden: set[str] = set()
            bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
            while bases:  # up through the lab's own classes to the foreign ones
                base = bases.pop()
                if base in local:
                    bases += [b.id for b in local[base].bases if isinstance(b, ast.Name)]
                elif _outside_bench(imported.get(base, "")):
                    foreign = _find_class(imported[base], base)
                    forbidden |= _private_members(foreign) if foreign else set()
            found += [
                f"{path.relative_to(SRC)}:{node.lineno} {cls.name}.{node.attr}"
                for node in ast.walk(cls)
                if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr in forbidden
            ]
    return found


def test_bench_imports_no_private_names() -> None:
    assert private_imports(_trees()) == []


def test_bench_reads_no_foreign_private_attributes() -> None:
    assert foreign_private_attributes(_trees()) == []


def test_bench_subclasses_touch_no_private_of_their_base() -> None:
    assert inherited_privates(_trees()) == []


def test_the_checks_catch_what_they_forbid() -> None:
    # The checks themselves, on a made-up lab module: each forbidden form is reported.
    source = (
        "from sluicegate.gateway.server import _handle\n"
        "from ...runtime import _secret\n"
        "from sluicegate.bench.des import _Queued\n"
        "import sluicegate.gateway._inner\n"
        "def f(gateway):\n"
        "    gateway._too_large()\n"
        "    self._mine = 1\n"
        "    return self._mine\n"
    )
    path = BENCH / "gateway" / "made_up.py"
    trees = {path: ast.parse(source)}
    assert [line.split(" ", 1)[1] for line in private_imports(trees)] == [
        "sluicegate.gateway.server._handle",
        "sluicegate.runtime._secret",
        "sluicegate.gateway._inner",
    ]
    assert [line.split(" ", 1)[1] for line in foreign_private_attributes(trees)] == ["._too_large"]
    subclass = (
        "from sluicegate.gateway.http import Responder\n"
        "class Mine(Responder):\n"
        "    def send(self):\n"
        "        self._started = True\n"
        "        self.begin()\n"
    )
    trees = {path: ast.parse(subclass)}
    assert [line.split(" ", 1)[1] for line in inherited_privates(trees)] == ["Mine._started"]
