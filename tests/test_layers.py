"""The dependency rule (README, Layout), checked on the source: every `import` / `from … import`
counts wherever it appears — module level, inside a function, under `TYPE_CHECKING` — and so do
the format modules that importer detection loads by name.

    core ← render ← summarizer ← tiers ← cascade ← engine ← service ← daemon, proxy
    protocol imports no engine; clients import only protocol; the two fronts (daemon, proxy)
    never import each other, nor the clients; no cycle anywhere.

A cycle that bites only at call time is still a cycle: it makes import order matter and hides a
layer that points the wrong way.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
from compactd.context.importers import FORMATS

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    folder: package
    for package, folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"].items()
}
ENGINE_LAYERS = ("core", "render", "summarizer", "tiers", "cascade", "engine")
FRONTS = ("daemon", "proxy")


def modules() -> dict[str, Path]:
    """Every module of the package by its import name (a package by its `__init__.py`)."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder)
            if "node_modules" in rel.parts or rel.parts[0] in ("node", "vscode"):
                continue
            parts = rel.with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports, anywhere in its source."""
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
                targets.add(submodule if submodule in known else origin)
    if name == "compactd.context.importers.detect":
        targets.update(FORMATS.values())  # imported lazily, by name
    return {target for target in targets if target in known and target != name}


def layer(module: str) -> str:
    """Which layer of the rule a module belongs to."""
    if module == "compactd":
        return "package"  # the namespace's `__init__`: the version, nothing else
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top in ("protocol", "service", "daemon", "proxy", "clients"):
        return top
    if top != "context":
        return "root"  # compactd itself: the console script's composition root
    sub = parts[2] if len(parts) > 2 else ""
    if sub in ("render", "summarizer", "tiers", "cascade", "engine"):
        return sub
    if sub == "replay":
        return "engine"  # a replay drives an engine
    return "core"


def allowed(source: str, target: str) -> bool:
    if target == "package":
        return True
    if source == "root":
        return True  # compactd.main: the console script's composition root
    if source in ENGINE_LAYERS:
        return target in ENGINE_LAYERS and ENGINE_LAYERS.index(target) <= ENGINE_LAYERS.index(
            source
        )
    if source == "protocol":
        return target == "protocol"
    if source == "clients":
        return target in ("protocol", "clients")
    if source == "service":
        return target in ENGINE_LAYERS or target in ("protocol", "service")
    if source in FRONTS:
        return target in ENGINE_LAYERS or target in ("protocol", "service", source)
    return False


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_no_import_cycle_anywhere(graph: dict[str, set[str]]) -> None:
    assert graph["compactd.context.importers.detect"] >= set(FORMATS.values())
    assert cycles(graph) == []


def test_every_import_points_down_the_layers(graph: dict[str, set[str]]) -> None:
    wrong = sorted(
        f"{source} ({layer(source)}) imports {target} ({layer(target)})"
        for source, targets in graph.items()
        for target in targets
        if not allowed(layer(source), layer(target))
    )
    assert wrong == []


def test_the_rule_sees_what_it_judges(graph: dict[str, set[str]]) -> None:
    """Guards the checker itself: a known function-level import is seen, and a made-up
    upward import would be judged wrong."""
    assert "compactd.daemon.main" in graph["compactd.main"]  # imported inside main()
    assert not allowed(layer("compactd.context.render.request"), layer("compactd.context.tiers"))
    assert not allowed(layer("compactd.clients.cli"), layer("compactd.daemon.main"))
    assert not allowed(layer("compactd.protocol.types"), layer("compactd.context.errors"))
    assert not allowed(layer("compactd.proxy.server"), layer("compactd.daemon.handlers"))
    assert not allowed(layer("compactd.daemon.handlers"), layer("compactd.proxy.server"))
    assert not allowed(layer("compactd.service.app"), layer("compactd.daemon.front"))
    assert allowed(layer("compactd.proxy.server"), layer("compactd.context.stores.files"))
    assert allowed(layer("compactd.proxy.server"), layer("compactd.service.app"))
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]


def test_format_modules_import_what_they_use_not_the_package(
    graph: dict[str, set[str]],
) -> None:
    """A format module imports the module that owns a name, never the package's re-exports
    nor detection (which imports it)."""
    for module in FORMATS.values():
        assert "compactd.context.importers" not in graph[module], module
        assert "compactd.context.importers.detect" not in graph[module], module


def test_every_source_folder_is_judged() -> None:
    """A new top-level package (a third front, say) cannot slip past the rule: every folder
    of the repository that holds an `__init__.py` is one `package-dir` maps, so `modules()`
    walks it."""
    packages = {
        path.parent.name
        for path in ROOT.glob("*/__init__.py")
        if path.parent.name not in ("tests", "bench")
    }
    assert packages == set(FOLDERS), packages ^ set(FOLDERS)
    assert {"proxy", "service", "daemon"} <= packages
