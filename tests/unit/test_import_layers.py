"""Imports point downwards: no module of the library, the broker or the consumer process
imports (even under TYPE_CHECKING, even inside a function) a module that imports it
back. A circle makes each module need the others to be read, tested or moved."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: (folder on the import path, package under it)
PACKAGES = [("libs", "gazette"), ("services/broker", "gazette_broker"),
            ("services/consumer", "gazette_consumer")]


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module by dotted name: its file, and whether it is a package's __init__."""
    found = {}
    for base, package in PACKAGES:
        for path in (ROOT / base / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT / base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of the others: ``from a.b import c`` is an import of
    ``a.b.c`` if that is a module, else of ``a.b``; every import statement counts,
    wherever it is."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in modules:
                        imported.add(full)
                    elif base in modules:
                        imported.add(base)
        imported.discard(name)
        graph[name] = imported
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (its modules in order, the first repeated at the
    end), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        stack = [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:  # all of path[-1]'s imports are explored
                stack.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                continue
            if nxt in on_path:
                return [*path[path.index(nxt):], nxt]
            if nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert "gazette.consumer.member" in graph and "gazette_broker.server" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_consumer_services_do_not_import_the_member() -> None:
    """The services a member serves know it by their host interfaces only."""
    graph = import_graph()
    importers = sorted(m for m, deps in graph.items()
                       if "gazette.consumer.member" in deps and m.startswith("gazette.consumer"))
    assert importers == []


def test_a_cycle_is_found() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
