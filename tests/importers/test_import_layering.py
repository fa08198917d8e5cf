"""The importers package has no import cycle, not even through a function-level import.

Every `import` / `from … import` is counted wherever it appears (module level, inside a
function, under `TYPE_CHECKING`), and so are the format modules that detection imports by name
(`FORMATS`). A cycle that only bites at call time is still a cycle: it makes the import order of
the package matter, and the split by concern was made to keep the layers one-way.
"""

from __future__ import annotations

import ast
from pathlib import Path

from compactd.context.importers import FORMATS

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "context"
PACKAGE = "compactd.context"
IMPORTERS = f"{PACKAGE}.importers"


def _modules() -> dict[str, Path]:
    """Every module of the engine by its import name (a package by its `__init__.py`)."""
    found = {}
    for path in ENGINE.rglob("*.py"):
        parts = path.relative_to(ENGINE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((PACKAGE, *parts))] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The engine modules that `name` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                targets.add(submodule if submodule in modules else origin)
    if name == f"{IMPORTERS}.detect":
        targets.update(FORMATS.values())  # imported lazily, by name
    return {target for target in targets if target in modules and target != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_importers_have_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph[f"{IMPORTERS}.detect"] >= set(FORMATS.values())
    cycles = [cycle for cycle in _cycles(graph) if any(m.startswith(IMPORTERS) for m in cycle)]
    assert cycles == []


def test_format_modules_import_what_they_use_not_the_package() -> None:
    """A format module imports the module that owns a name, never the package's re-exports."""
    modules = _modules()
    for module in FORMATS.values():
        imported = _imports(module, modules[module], modules)
        assert IMPORTERS not in imported, module
        assert f"{IMPORTERS}.detect" not in imported, module
