"""The package's shape (docs/architecture.md): every package in exactly one import-linter layer,
few modules at the top, short modules and functions. `make lint` (lint-imports) checks the
imports themselves."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "grammarrl"
MAX_TOP_MODULES, MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_CLASS_LINES = 10, 400, 60, 250


def layered_names() -> list[str]:
    """The names the layers contract of pyproject.toml places, in order."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in contracts["contracts"] if c["type"] == "layers"]
    return [
        name.strip().removeprefix("grammarrl.")
        for layer in layers
        for name in layer.replace(":", "|").split("|")
    ]


def test_every_package_and_top_module_sits_in_one_layer():
    placed = layered_names()
    present = sorted(
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    )
    assert sorted(placed) == present  # a new package or module must be given its layer
    assert len(placed) == len(set(placed))


def test_few_modules_at_the_top():
    top = [p.name for p in PACKAGE.glob("*.py") if p.stem != "__init__"]
    assert len(top) <= MAX_TOP_MODULES, sorted(top)


def test_modules_classes_and_functions_are_short():
    long_modules, long_functions, long_classes = [], [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(ROOT).as_posix()
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}:{node.lineno} {node.name}: {length} lines")
            if isinstance(node, ast.ClassDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_CLASS_LINES:
                    long_classes.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert not long_modules, long_modules
    assert not long_functions, long_functions
    assert not long_classes, long_classes


NODES = {  # docs/architecture.md draws the entry modules as one node, errors and types as one
    **dict.fromkeys(("run", "api", "plan", "prepare", "export"), "entry"),
    **dict.fromkeys(("errors", "types"), "base"),
}
ARROW = re.compile(r"^\s+(\w+)(?:\[[^\]]*\])? --> (\w+)(?:\[[^\]]*\])?\s*$")


def package_edges() -> set[tuple[str, str]]:
    """The imports between the diagram's nodes (grammarrl's packages, the entry node, the base
    node), less those a longer path implies (grimp: import-linter's import graph)."""
    import grimp

    graph = grimp.build_graph("grammarrl", include_external_packages=False)
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = (
                NODES.get(n, n)
                for n in (m.split(".")[1] if "." in m else m for m in (module, imported))
            )
            if a != b:
                edges.setdefault(a, set()).add(b)

    def reaches(start: str, target: str, skip: tuple[str, str]) -> bool:
        seen, stack = set(), [b for b in edges.get(start, ()) if (start, b) != skip]
        while stack:
            node = stack.pop()
            if node == target:
                return True
            if node not in seen:
                seen.add(node)
                stack += edges.get(node, ())
        return False

    return {(a, b) for a in edges for b in edges[a] if not reaches(a, b, (a, b))}


def test_the_architecture_diagram_is_drawn_from_the_imports():
    """docs/architecture.md's arrows are the real imports between its nodes, every one of them
    (run.py loads the mode handlers by name: grimp sees no import from it to the modes)."""
    lines = [
        line for line in (ROOT / "docs/architecture.md").read_text().splitlines() if "-->" in line
    ]
    arrows = [ARROW.match(line) for line in lines]
    assert all(arrows), [line for line, arrow in zip(lines, arrows) if not arrow]
    assert {arrow.groups() for arrow in arrows} == package_edges()


def test_every_file_where_to_change_what_names_exists():
    """docs/architecture.md's "Where to change what": each path it names is in the repository
    (a `<name>` placeholder stands for any file of that folder)."""
    text = (ROOT / "docs/architecture.md").read_text()
    section = text.split("## Where to change what", 1)[1].split("\n## ", 1)[0]
    paths = [
        p for p in re.findall(r"`([\w./<>-]+/[\w./<>-]*)`", section) if "." in p or p.endswith("/")
    ]
    assert len(paths) >= 8
    for path in paths:
        folder, _, name = path.partition("<name>")
        found = list((ROOT / folder).glob("*" + name)) if "<name>" in path else [ROOT / path]
        assert any(p.exists() for p in found), f"docs/architecture.md names {path}: not found"
