"""The package's layout holds: no import circle in fastload/, and
docs/design.md's map names every source file.

An import counts wherever it stands (a function-level import is still a
dependency: deferring it only hides a circle).  Importing a package's
submodule is an edge to that submodule, not to the package's __init__.
"""

import ast
import os
import pathlib

import pytest

import fastload
from graphs import find_cycle

# Reads source files and runs no C: nothing for the sanitizer run
# (scripts/test.sh sets FASTLOAD_SANITIZER_RUN) to check.
pytestmark = pytest.mark.skipif(bool(os.environ.get("FASTLOAD_SANITIZER_RUN")),
                                reason="reads source files only: no C runs (sanitizer run)")


ROOT = pathlib.Path(__file__).resolve().parent.parent
# The package under test: the checkout's, or the installed wheel's when the
# suite runs from a copy of the tree without fastload/ (scripts/test.sh).
PACKAGE = pathlib.Path(fastload.__file__).resolve().parent


def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules["fastload._C"] = None  # the extension: it imports nothing of fastload
    return modules


def _imported(module, path, node, modules):
    """The fastload modules an import statement of ``module`` names."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in modules]
    if node.level:
        base = package.split(".")
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not (target == "fastload" or target.startswith("fastload.")):
        return []
    names = [f"{target}.{alias.name}" for alias in node.names]
    found = [name for name in names if name in modules]
    # Names that are not modules are attributes of ``target`` itself.
    if len(found) < len(names) and target in modules:
        found.append(target)
    return found


def _graph():
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        if path is None:
            graph[module] = set()
            continue
        tree = ast.parse(path.read_text(), str(path))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_imported(module, path, node, modules))
        edges.discard(module)
        graph[module] = edges
    return graph


def test_the_graph_sees_the_package():
    graph = _graph()
    assert len(graph) > 40
    assert "fastload.loader.dataloader" in graph
    assert "fastload.loader.iterators" in graph["fastload.loader.dataloader"]
    assert "fastload.datasets.indexing" in graph["fastload.datasets.arrays"]


def test_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    graph["c"] = set()
    assert find_cycle(graph) is None


def test_no_import_circle_in_the_package():
    cycle = find_cycle(_graph())
    assert cycle is None, "modules that import each other: " + " -> ".join(cycle)


def _design_map():
    """The paths docs/design.md's map names (``x.{c,h}`` names both)."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("\n## Map\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    named = set()
    for line in block.splitlines():
        if not line.strip():
            continue
        path = line.split()[0]
        if path.endswith(".{c,h}"):
            named.update({path[:-6] + ".c", path[:-6] + ".h"})
        else:
            named.add(path)
    return named


def _source_files():
    files = {str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")}
    files |= {str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*")
              if p.suffix in (".c", ".h")}
    return files


def test_design_map_names_every_source_file():
    named, present = _design_map(), _source_files()
    assert not present - named, f"add to docs/design.md's map: {sorted(present - named)}"
    assert not named - present, f"no longer there: {sorted(named - present)}"
