"""A task's two diffs, as ``git diff`` writes them, and the check that a diff applies.

``patch`` turns the base tree's buggy module back into the clean one; ``test_patch`` creates the
hidden test files (``new file mode``). Both have git's ``a/`` and ``b/`` prefixes and three lines
of context, and apply with ``git apply`` and with ``patch -p1``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from agentrl.envs.swe.repo import commit_tree, git_apply, git_env


def write_patches(clean: Path, scratch: Path, module: str, hidden: list[str]) -> tuple[str, str]:
    """``(patch, test_patch)`` for the base tree copied at ``scratch``: the diff that makes
    ``module`` as in the ``clean`` tree, and the one that adds the ``hidden`` files from it.
    ``scratch`` is used up (committed, changed, then removed)."""
    commit_tree(scratch, "draft")
    for file in [module, *hidden]:
        shutil.copy2(clean / file, scratch / file)
    _git(scratch, "add", "-A", "-f")
    patch = _git(scratch, "diff", "--cached", "--no-color", "--no-ext-diff", "--", module)
    test_patch = _git(scratch, "diff", "--cached", "--no-color", "--no-ext-diff", "--", *hidden)
    shutil.rmtree(scratch)
    return patch, test_patch


def check_applies(tree: Path, diff: str) -> None:
    """Raise RuntimeError unless ``diff`` applies to ``tree`` with both ``git apply`` and
    ``patch -p1`` (nothing is changed)."""
    git_apply(tree, diff, check=True)
    result = subprocess.run(
        ["patch", "-p1", "--dry-run", "--batch", "--forward", "--silent"],
        cwd=tree,
        input=diff,
        capture_output=True,
        encoding="utf-8",
    )
    if result.returncode != 0:
        raise RuntimeError(f"patch -p1 --dry-run failed in {tree}: {result.stdout}{result.stderr}")


def _git(repo: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=repo, env=git_env(repo), capture_output=True, encoding="utf-8"
    )
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {result.stderr}")
    return result.stdout
