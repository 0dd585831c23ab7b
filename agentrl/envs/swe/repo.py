"""Repository trees of generated SWE tasks: unpacking sdists, deterministic commits, rebuilding.

A generated task's trees are rebuilt from its project's source distribution, never from a git
host: the *clean tree* is the sdist unpacked with its top directory (``<name>-<version>/``)
stripped; the *base tree* is the clean tree with the gold patch reversed (which puts the bug back)
and the files that ``test_patch`` adds removed (the hidden tests). Each tree is made a single
commit by :data:`COMMIT_TREE_SH`, whose sha is the same wherever it runs, so ``base_commit`` and
``environment_setup_commit`` identify the trees.

The commit has fixed author, committer, dates and message and no parent; git's global and
system configuration are ignored. ``git add -A -f`` adds every file in the tree, those a
``.gitignore`` in the sdist would ignore included; empty directories are not recorded (git has no
such object) and of a file's mode only the executable bit is. The tree must not already be a git
repository. Needs git >= 2.32 (for ``GIT_CONFIG_GLOBAL``).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from agentrl.envs.swe.instances import GIT_SHA, SWEInstance

# Run as `sh -c "$COMMIT_TREE_SH" sh MESSAGE` in the tree; prints the commit's sha.
COMMIT_TREE_SH = """\
set -eu
if [ -e .git ]; then echo "already a git repository: $(pwd)" >&2; exit 1; fi
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=agentrl GIT_AUTHOR_EMAIL=agentrl@localhost
export GIT_COMMITTER_NAME=agentrl GIT_COMMITTER_EMAIL=agentrl@localhost
export GIT_AUTHOR_DATE='2000-01-01T00:00:00+0000' GIT_COMMITTER_DATE='2000-01-01T00:00:00+0000'
git init -q
git add -A -f
git commit -q --no-verify --allow-empty -m "$1"
git rev-parse HEAD
"""

ENVIRONMENT_MESSAGE = "environment"
"""The commit message of a project's clean tree (``environment_setup_commit``)."""

_NEW_FILE = re.compile(r"^diff --git a/(\S+) b/\S+\nnew file mode \d+$", re.MULTILINE)


class SdistProject(BaseModel):
    """What rebuilding a project's trees needs: one ``projects/<sdist stem>.json`` per project."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str
    """The distribution name, e.g. ``"toolz"``."""
    version: str
    """The version, also the instances' ``version``."""
    sdist: str
    """The source distribution's file name, next to this file."""
    sha256: str
    """The sdist's sha256."""
    license: str
    """The license as the sdist's metadata states it (License-Expression, License or classifier)."""
    source_url: str
    """Where PyPI serves the sdist."""
    pypi_url: str
    """The release's page on PyPI."""
    test_command: str
    """The command that runs the suite in the tree; the environment may append test files or ids."""
    test_env: dict[str, str]
    """Environment variables for ``test_command``."""
    environment_setup_commit: str
    """The sha of the clean tree's commit (:func:`commit_tree` with message ``"environment"``)."""
    passing_tests: int
    """How many tests passed on the clean tree when the tasks were generated."""
    apt_packages: list[str] = []
    """Debian packages the project's tests need beyond the SWE base image (python3, pytest, git,
    a C toolchain); ``sandboxes/build.sh`` installs them in the project's image."""


def git_env(cwd: Path) -> dict[str, str]:
    """The environment for git commands on a tree: no user or system configuration, and no
    repository discovered above ``cwd`` (so ``git apply`` in a plain tree patches that tree)."""
    return {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CEILING_DIRECTORIES": str(Path(cwd).resolve().parent),
    }


def commit_tree(path: str | Path, message: str) -> str:
    """Make the tree at ``path`` a git repository with one deterministic commit (see
    :data:`COMMIT_TREE_SH`) and return its sha."""
    result = subprocess.run(
        ["sh", "-c", COMMIT_TREE_SH, "sh", message],
        cwd=path,
        env=git_env(Path(path)),
        capture_output=True,
        text=True,
    )
    sha = result.stdout.strip()
    if result.returncode != 0 or not GIT_SHA.fullmatch(sha):
        raise RuntimeError(f"committing {path} failed: {result.stderr.strip() or result.stdout}")
    return sha


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def unpack_sdist(sdist: str | Path, dest: str | Path) -> str:
    """Extract the ``.tar.gz`` ``sdist`` into ``dest`` (created, must not exist) with its single
    top directory stripped, as ``tar xzf SDIST --strip-components=1`` does; returns that
    directory's name. Links out of the tree and absolute paths are refused (tarfile's ``data``
    filter, or the same checks on Pythons before 3.11.4, which lack it: Debian 12's 3.11.2)."""
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} exists")
    with tarfile.open(sdist, "r:gz") as archive:
        members = archive.getmembers()
        tops = {member.name.split("/", 1)[0] for member in members}
        if len(tops) != 1:
            raise ValueError(f"{sdist}: expected one top directory, found {sorted(tops)}")
        (top,) = tops
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent) as scratch:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(scratch, members=members, filter="data")
            else:
                _refuse_unsafe(members, Path(scratch), sdist)
                for member in members:  # as the filter: owned by us, no setuid or shared write
                    member.uid, member.gid, member.uname, member.gname = (
                        os.getuid(),
                        os.getgid(),
                        "",
                        "",
                    )
                    member.mode = (member.mode & 0o755) | (0o600 if member.isfile() else 0o700)
                archive.extractall(scratch, members=members)
            (Path(scratch) / top).rename(dest)
    return top


def _refuse_unsafe(members: list[tarfile.TarInfo], root: Path, sdist: str | Path) -> None:
    """Refuse what tarfile's ``data`` filter refuses: absolute paths, paths and links that leave
    ``root``, and special files."""
    root = root.resolve()

    def inside(path: Path) -> bool:
        return path.resolve().is_relative_to(root)

    for member in members:
        where = root / member.name
        if Path(member.name).is_absolute() or not inside(where):
            raise ValueError(f"{sdist}: {member.name!r} is outside the archive's tree")
        if member.issym() and not inside(where.parent / member.linkname):
            raise ValueError(f"{sdist}: the link {member.name!r} leaves the tree")
        if member.islnk() and not inside(root / member.linkname):
            raise ValueError(f"{sdist}: the link {member.name!r} leaves the tree")
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise ValueError(f"{sdist}: {member.name!r} is a special file")


def files_added_by(diff: str) -> list[str]:
    """Paths of the files a git-style diff creates (``new file mode``)."""
    return _NEW_FILE.findall(diff)


def git_apply(tree: Path, diff: str, *, reverse: bool = False, check: bool = False) -> None:
    """Apply ``diff`` to the files of ``tree`` with ``git apply``; raise RuntimeError if it does
    not apply (``check``: only test that it would)."""
    args = ["git", "apply", *(["-R"] if reverse else []), *(["--check"] if check else []), "-"]
    result = subprocess.run(
        args, cwd=tree, env=git_env(tree), input=diff, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"git apply {' '.join(args[2:-1])} failed in {tree}: {result.stderr}")


def build_environment_tree(sdist: str | Path, dest: str | Path) -> str:
    """Unpack the clean tree into ``dest`` and commit it; returns ``environment_setup_commit``."""
    unpack_sdist(sdist, dest)
    return commit_tree(dest, ENVIRONMENT_MESSAGE)


def build_base_tree(sdist: str | Path, instance: SWEInstance, dest: str | Path) -> str:
    """Rebuild ``instance``'s base tree into ``dest`` and commit it; returns the sha, which equals
    ``instance.base_commit`` for a generated instance. Shell equivalent, in ``dest``::

        tar xzf SDIST --strip-components=1
        git apply -R gold.patch         # the bug back
        rm FILES_THAT_TEST_PATCH_ADDS   # the hidden tests
        sh -c "$COMMIT_TREE_SH" sh INSTANCE_ID
    """
    dest = Path(dest)
    unpack_sdist(sdist, dest)
    git_apply(dest, instance.patch, reverse=True)
    for path in files_added_by(instance.test_patch):
        (dest / path).unlink()
    return commit_tree(dest, instance.instance_id)
