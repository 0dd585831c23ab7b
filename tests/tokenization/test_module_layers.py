"""The modules of agentrl.tokenization form layers: no import cycle, no hidden upward import.

STYLE.md point 14: a lower module never imports a higher one, not even lazily inside a function or
under ``TYPE_CHECKING``. Every import between these modules is therefore at module level, and the
graph they form is acyclic.
"""

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import agentrl.tokenization

PACKAGE = "agentrl.tokenization"
ROOT = Path(agentrl.tokenization.__file__).parent


def _module_name(path: Path) -> str:
    return PACKAGE if path.name == "__init__.py" else f"{PACKAGE}.{path.stem}"


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The package's modules ``node`` imports (``from package import module`` included)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert node.level == 0, "relative imports are not used in this package"
        module = node.module or ""
        names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
    modules = {_module_name(path) for path in ROOT.glob("*.py")}
    return [name for name in names if name in modules and name != PACKAGE]


def _imports() -> dict[str, list[tuple[str, bool]]]:
    """For each module: the package modules it imports, and whether at module level."""
    graph: dict[str, list[tuple[str, bool]]] = {}
    for path in sorted(ROOT.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        top = {id(node) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)}
        graph[_module_name(path)] = [
            (name, id(node) in top)
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for name in _imported(node)
        ]
    return graph


def test_imports_between_tokenization_modules_are_at_module_level():
    hidden = [
        f"{module} imports {name}"
        for module, imports in _imports().items()
        for name, top_level in imports
        if not top_level
    ]
    assert hidden == []


def test_tokenization_modules_import_each_other_without_cycles():
    graph = {module: {name for name, _ in imports} for module, imports in _imports().items()}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as error:
        raise AssertionError(f"import cycle: {error.args[1]}") from None
    assert order.index(f"{PACKAGE}.token_trajectory") < order.index(f"{PACKAGE}.checker")
    assert order.index(f"{PACKAGE}.checker") < order.index(f"{PACKAGE}.trajectory")
