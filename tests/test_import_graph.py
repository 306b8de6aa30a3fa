"""fold_guard's import graph has no cycle, and each adapter's stages keep their seams (read from the source).

    relax/_pass ---> _translate/ ---> _sites <--- _engine/ <--- _pass
    (the coordinator)  (translation)   (the leaf)   (evaluation)
                                          ^
                                      _rewrite <--- _pass

- no cycle among fold_guard's modules (a module that imports itself through others);
- no adapter module imports the package root (``fold_guard/__init__.py`` imports the adapters);
- translation is behind one door: outside ``relax/_translate`` (and ``relay/_translate``) nothing
  imports a module inside it, only the package itself (``analyse``);
- only the coordinator (``_pass``) and ``_config`` import the engine;
- ``annotate`` reads a module through translation, not through the fold's coordinator;
- nothing under ``relax/_engine`` reads the environment (``_config`` resolves every setting);
- the reference engine shares no helper with the fast engine (the fast one hands it a call to
  rerun, nothing more), so that comparing the two can catch a bug in either;
- no module of ``relax/`` is longer than 450 lines.

The graph is read with ``ast`` from every file of the package, so it covers imports that run
only in a function or under ``TYPE_CHECKING`` too.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fold_guard"
MAX_LINES = 450
#: The modules that may import the Relax engine: the coordinator, and the options it resolves.
ENGINE_USERS = {"fold_guard.relax._pass", "fold_guard.relax._config"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> Dict[str, Set[str]]:
    """module -> the fold_guard modules it imports (``from . import x`` names module ``x``)."""
    files = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    edges: Dict[str, Set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")
                if node.level:
                    base = base[: len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                named = [f"{module}.{alias.name}" for alias in node.names]
                targets = [t for t in named if t in files]
                if len(targets) < len(named):
                    targets.append(module)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            edges[name].update(t for t in targets if t in files and t != name)
    return edges


GRAPH = _graph()


def _cycle() -> List[str]:
    """One import cycle, as the modules along it, or [] (depth-first search)."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(name: str) -> List[str]:
        state[name] = 1
        stack.append(name)
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[name] = 2
        return []

    for name in sorted(GRAPH):
        if name not in state:
            found = visit(name)
            if found:
                return found
    return []


def test_the_graph_is_read():
    """Guard against a vacuous graph: known arrows are there."""
    assert "fold_guard.relax._sites" in GRAPH["fold_guard.relax._translate.walk"]
    assert "fold_guard.relax._engine" in GRAPH["fold_guard.relax._pass"]
    assert "fold_guard.relax" in GRAPH["fold_guard"]


def test_no_import_cycle():
    assert _cycle() == []


@pytest.mark.parametrize("adapter", ["fold_guard.relax", "fold_guard.relay", "fold_guard._core"])
def test_no_adapter_imports_the_package_root(adapter):
    offenders = [
        name
        for name, targets in GRAPH.items()
        if name.startswith(adapter) and "fold_guard" in targets
    ]
    assert offenders == []


def test_only_the_coordinator_imports_the_engine():
    offenders: List[Tuple[str, str]] = [
        (name, target)
        for name, targets in GRAPH.items()
        if name.startswith("fold_guard.relax.") and not name.startswith("fold_guard.relax._engine")
        for target in targets
        if target.startswith("fold_guard.relax._engine") and name not in ENGINE_USERS
    ]
    assert offenders == []


@pytest.mark.parametrize("adapter", ["fold_guard.relax", "fold_guard.relay"])
def test_translation_is_behind_one_door(adapter):
    """Only ``_translate`` itself (its ``analyse``) is imported from outside the folder."""
    door = f"{adapter}._translate"
    assert any(name.startswith(door + ".") for name in GRAPH), "the folder is read"
    offenders = [
        (name, target)
        for name, targets in GRAPH.items()
        if name != door and not name.startswith(door + ".")
        for target in targets
        if target.startswith(door + ".")
    ]
    assert offenders == []
    # and translation never reaches the stages after it
    later = [f"{adapter}._pass", f"{adapter}._engine", f"{adapter}._rewrite"]
    reached = [
        (name, target)
        for name, targets in GRAPH.items()
        if name == door or name.startswith(door + ".")
        for target in targets
        if any(target == stage or target.startswith(stage + ".") for stage in later)
    ]
    assert reached == []


@pytest.mark.parametrize("adapter", ["fold_guard.relax", "fold_guard.relay"])
def test_annotate_reads_a_module_through_translation(adapter):
    assert f"{adapter}._translate" in GRAPH[f"{adapter}._annotate"]


def test_relax_annotate_does_not_import_the_coordinator():
    """(Relay's ``annotate`` folds first, with ``fold``: RFC.md, Appendix A.)"""
    assert "fold_guard.relax._pass" not in GRAPH["fold_guard.relax._annotate"]


def test_the_engine_reads_no_environment():
    for path in (PACKAGE / "relax" / "_engine").rglob("*.py"):
        tree = ast.parse(path.read_text())
        reads = [
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
        ]
        assert reads == [], path


def _imported_names(path: Path, module: str) -> Set[str]:
    """The names ``path`` imports from the sibling module ``module`` (``from .module import ...``)."""
    return {
        alias.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module == module
        for alias in node.names
    }


def test_the_reference_engine_shares_no_helper_with_the_fast_engine():
    engine = PACKAGE / "relax" / "_engine"
    # the fast engine reruns a call on the reference engine: the class, nothing of its insides
    assert _imported_names(engine / "fast.py", "reference") == {"ReferenceEngine"}
    own = {name.rpartition(".")[2] for name in GRAPH["fold_guard.relax._engine.reference"]}
    siblings = {path.stem for path in engine.glob("*.py")} - {"__init__", "interface"}
    assert own & siblings == set()  # only the interface's types


def test_relax_modules_are_short():
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in (PACKAGE / "relax").rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
