"""The house's import rules (docs/architecture.md): the top level holds the model and the commands; the library
``lgpt/`` has three rooms — ``method`` (the rules), ``plumbing`` (checkpoints, data, devices, logging, CLI) and
``formats`` (one file per model family) — and the lab is ``scripts/``. Every import counts, lazy ones inside
functions included:

- no circle anywhere;
- the library never imports a command or the lab;
- plumbing imports neither the method nor the formats;
- the formats and the method do not import each other.
"""
from __future__ import annotations

import ast
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMANDS = {"train", "transform", "finetune", "eval_geometry", "sample", "convert", "fetch", "prepare"}
TOP_LEVEL = COMMANDS | {"model"}


def module_files(root: str = ROOT) -> dict[str, str]:
    """Dotted module name → file, for the top level, the library and the lab."""
    files = {os.path.basename(p)[:-3]: p for p in glob.glob(os.path.join(root, "*.py"))}
    for path in glob.glob(os.path.join(root, "lgpt", "**", "*.py"), recursive=True):
        dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
        files[dotted.removesuffix(".__init__")] = path
    for path in glob.glob(os.path.join(root, "scripts", "*.py")):
        files["scripts." + os.path.basename(path)[:-3]] = path
    return files


def imports_of(path: str, known: set[str], dotted: str = "") -> set[str]:
    """The repo modules a file imports anywhere in its text (``from lgpt.method import maps`` counts as
    lgpt.method.maps; a lab script's ``import harness`` as scripts.harness; ``from ..formats import gguf_file`` in
    the module ``dotted`` as lgpt.formats.gguf_file)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    package = dotted.split(".") if path.endswith("__init__.py") else dotted.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importer's package, one level up per dot past the first
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            for candidate in (name, "scripts." + name):
                if candidate in known:
                    found.add(candidate)
    return found


def import_graph(root: str = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    known = set(files)
    return {name: imports_of(path, known, name) - {name} for name, path in files.items()}


def room(module: str) -> str:
    if module in COMMANDS:
        return "command"
    if module == "model":
        return "model"
    if module.startswith("scripts."):
        return "lab"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "library"


def broken_rules(graph: dict[str, set[str]]) -> list[str]:
    """Every import that breaks a rule of the house, as 'a → b: why'."""
    forbidden = {  # (importer's room, imported room): why not
        ("method", "command"): "the library never imports a command",
        ("plumbing", "command"): "the library never imports a command",
        ("formats", "command"): "the library never imports a command",
        ("method", "lab"): "the library never imports scripts/",
        ("plumbing", "lab"): "the library never imports scripts/",
        ("formats", "lab"): "the library never imports scripts/",
        ("model", "command"): "the model imports no command",
        ("model", "lab"): "the model imports no script",
        ("plumbing", "method"): "plumbing never imports the method",
        ("plumbing", "formats"): "plumbing never imports the formats",
        ("method", "formats"): "the method and the formats do not import each other",
        ("formats", "method"): "the method and the formats do not import each other",
    }
    broken = []
    for importer, imported in sorted(graph.items()):
        for target in sorted(imported):
            why = forbidden.get((room(importer), room(target)))
            if why:
                broken.append(f"{importer} → {target}: {why}")
    return broken


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as a path [a, b, …, a], or None (depth-first search with colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
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


def test_every_import_keeps_the_rooms_apart():
    broken = broken_rules(import_graph())
    assert not broken, "\n".join(broken)


def test_the_top_level_is_the_model_and_the_commands():
    top = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "*.py"))}
    assert top <= TOP_LEVEL, f"top-level modules that belong in lgpt/: {sorted(top - TOP_LEVEL)}"
    assert len(top) <= 10


@pytest.mark.parametrize("importer, imported, why", [
    ("lgpt/plumbing/checkpoint.py", "from lgpt.method.grow import x", "plumbing never imports the method"),
    ("lgpt/method/maps.py", "import train", "the library never imports a command"),
    ("lgpt/formats/llama.py", "from lgpt.method import porting", "the method and the formats"),
    ("lgpt/method/porting.py", "def f():\n    from lgpt.formats.gguf_file import y", "the method and the formats"),
    ("lgpt/method/maps.py", "import harness", "the library never imports scripts/"),
    ("lgpt/method/porting.py", "from ..formats import gguf_file", "the method and the formats"),  # relative
    ("lgpt/plumbing/checkpoint.py", "from ..method.grow import x", "plumbing never imports the method"),
])
def test_a_broken_rule_is_named(tmp_path, importer, imported, why):
    """The checker itself: a tree with one forbidden import (lazy ones too) is caught, with the rule's words."""
    for rel, text in {"train.py": "", "model.py": "", "scripts/harness.py": "", "lgpt/__init__.py": "",
                      "lgpt/method/__init__.py": "", "lgpt/method/grow.py": "x = 1",
                      "lgpt/method/porting.py": "", "lgpt/method/maps.py": "",
                      "lgpt/plumbing/__init__.py": "", "lgpt/plumbing/checkpoint.py": "",
                      "lgpt/formats/__init__.py": "", "lgpt/formats/llama.py": "",
                      "lgpt/formats/gguf_file.py": "y = 1"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / importer).write_text(imported + "\n")
    assert any(why in b for b in broken_rules(import_graph(str(tmp_path))))
