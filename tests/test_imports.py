"""The house's import graph: every top-level module of the repo, with every import in it (lazy ones inside
functions included), has no circle — each room imports only rooms below it (REFERENCE, "How the code is
organised")."""
from __future__ import annotations

import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "*.py"))}


def import_graph() -> dict[str, set[str]]:
    """Module → the repo modules it imports anywhere in its text."""
    graph = {}
    for name in MODULES:
        with open(os.path.join(ROOT, f"{name}.py")) as f:
            tree = ast.parse(f.read())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
        graph[name] = (found & MODULES) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as a path [a, b, …, a], or None (depth-first search with colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_has_no_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " → ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_rooms_of_the_transform_sit_below_it():
    graph = import_graph()
    for room in ("maps", "roles", "porting", "paper_rules", "carry", "refit", "grow"):
        assert "transform" not in graph[room], f"{room}.py imports transform.py, the pipeline above it"
