"""The package's layers, checked on its source: a lower layer never imports a higher one, not
lazily inside a function and not under ``TYPE_CHECKING`` either (every import statement counts).

Each contract names a layer (a package or module) and the agentrl modules it may import; the
table grows as the re-layout of issue 30 moves code into layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "agentrl"

CONTRACTS: dict[str, tuple[str, ...]] = {
    "agentrl.algorithms": ("agentrl.algorithms",),
}
"""Layer -> the agentrl modules (prefixes) it may import."""


def agentrl_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of an agentrl module in ``path``, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.ImportFrom):  # relative: within its own package
            names = []
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] == "agentrl"]
    return found


def upward_imports(layer: str, allowed: tuple[str, ...]) -> list[str]:
    root = PACKAGE.parent.joinpath(*layer.split("."))
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    return [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in files
        for line, name in agentrl_imports(path)
        if not any(name == a or name.startswith(a + ".") for a in allowed)
    ]


@pytest.mark.parametrize("layer", sorted(CONTRACTS))
def test_no_layer_imports_upwards(layer):
    wrong = upward_imports(layer, CONTRACTS[layer])
    assert not wrong, "\n".join(wrong)


def test_a_planted_upward_import_is_caught(tmp_path, monkeypatch):
    planted = tmp_path / "agentrl" / "algorithms"
    planted.mkdir(parents=True)
    (planted / "bad.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from agentrl.training.actor import Actor\n"
        "def f():\n    import agentrl.rollout\n"
    )
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path / "agentrl")
    assert upward_imports("agentrl.algorithms", ("agentrl.algorithms",)) == [
        "agentrl/algorithms/bad.py:3 imports agentrl.training.actor",
        "agentrl/algorithms/bad.py:5 imports agentrl.rollout",
    ]
