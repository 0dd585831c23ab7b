"""The package's layers, as ``make lint`` checks them: import-linter's ``layers`` contract in
pyproject.toml, over every import statement (inside functions and under ``TYPE_CHECKING`` too).

The contract holds on the package, and a planted upward import (of each kind that could hide one)
breaks it in a copy of the package, so the check in ``make lint`` can fail. Within a layer no
module imports itself back either (no import cycle), on the same graph (grimp's, which
import-linter builds)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(source_root: Path) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports`` with the project's contract on the ``agentrl`` under ``source_root``."""
    env = {**os.environ, "PYTHONPATH": str(source_root)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=source_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


CYCLES = """
import grimp
graph = grimp.build_graph("agentrl", cache_dir=None)
for importer in sorted(graph.modules):
    for imported in sorted(graph.find_modules_directly_imported_by(importer)):
        back = graph.find_shortest_chain(importer=imported, imported=importer)
        if back:
            print(" -> ".join((importer, *back)))
"""


def import_cycles(source_root: Path) -> list[str]:
    """Every import that some chain of imports leads back from, as ``a -> b -> ... -> a``."""
    done = subprocess.run(
        [sys.executable, "-c", CYCLES],
        cwd=source_root,
        env={**os.environ, "PYTHONPATH": str(source_root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.splitlines()


def copy_package(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "agentrl", tmp_path / "agentrl", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path / "agentrl"


def test_no_module_imports_itself_back(tmp_path):
    assert import_cycles(ROOT) == []
    optim = copy_package(tmp_path) / "training" / "optim.py"  # actor.py imports optim
    optim.write_text(optim.read_text() + "\ndef f():\n    from agentrl.training import actor\n")
    assert "agentrl.training.optim -> agentrl.training.actor -> agentrl.training.optim" in (
        import_cycles(tmp_path)
    )


def test_the_package_keeps_its_layers():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "planted"),
    [
        ("algorithms/gae.py", "from agentrl.training.packing import pack\n"),
        ("training/metrics.py", "def f():\n    from agentrl.rl.loop import Trainer\n"),
        (
            "models.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from agentrl.training.checkpoint import export_hf\n",
        ),
        ("training/actor.py", "import agentrl.sft.trainer\n"),
        ("rl/batch.py", "from agentrl.sft import data\n"),  # siblings are independent
    ],
)
def test_a_planted_upward_import_breaks_the_contract(tmp_path, module, planted):
    target = copy_package(tmp_path) / module
    target.write_text(target.read_text() + "\n" + planted)
    done = lint_imports(tmp_path)
    assert done.returncode != 0, done.stdout
    assert "1 broken" in done.stdout
    assert f"agentrl.{module.removesuffix('.py').replace('/', '.')}" in done.stdout
