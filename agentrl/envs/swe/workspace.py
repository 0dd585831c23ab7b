"""An instance's repository inside a sandbox: its base tree, one commit, and nothing else.

The host rebuilds the base tree from the project's sdist (:func:`~agentrl.envs.swe.repo.build_base_tree`:
the bug in, the hidden tests out) and packs it, without ``.git``, into a ``.tar.gz`` kept in memory
per instance. :func:`checkout` writes that archive into the sandbox, unpacks it at
:data:`REPO_DIR`, makes it a git repository with :data:`~agentrl.envs.swe.repo.COMMIT_TREE_SH` and
checks that the commit's sha is the instance's ``base_commit``: the sandbox's git then holds exactly
one commit, no refs but ``HEAD``'s branch, no reflog entries beyond that commit and no object that
is not in the base tree, so there is no future history to read the fix from.
"""

from __future__ import annotations

import io
import shlex
import tarfile
import tempfile
import threading
from pathlib import Path

from agentrl.envs.swe.instances import SWEInstance
from agentrl.envs.swe.repo import COMMIT_TREE_SH, build_base_tree
from agentrl.tools.sandbox import Sandbox

REPO_DIR = "/work/repo"
"""Where the repository lives in the sandbox (the tools' working directory)."""

_ARCHIVE = "/tmp/agentrl-base-tree.tar.gz"


class WorkspaceError(RuntimeError):
    """The repository could not be set up in the sandbox (not the agent's doing)."""


class BaseTrees:
    """Base-tree archives built on the host, one per instance, built once and then reused."""

    def __init__(self) -> None:
        self._archives: dict[tuple[str, str, str], bytes] = {}
        self._lock = threading.Lock()

    def archive(self, instance: SWEInstance, sdist: Path) -> bytes:
        """The ``.tar.gz`` of ``instance``'s base tree (files relative to the tree's root)."""
        key = (instance.instance_id, instance.base_commit, str(Path(sdist).resolve()))
        with self._lock:
            cached = self._archives.get(key)
        if cached is not None:
            return cached
        with tempfile.TemporaryDirectory(prefix="agentrl-swe-") as scratch:
            tree = Path(scratch) / "tree"
            sha = build_base_tree(sdist, instance, tree)
            if sha != instance.base_commit:
                raise WorkspaceError(
                    f"instance {instance.instance_id!r}: the base tree rebuilt from {sdist.name} "
                    f"commits as {sha}, not base_commit {instance.base_commit}"
                )
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
                for path in sorted(tree.rglob("*")):
                    relative = path.relative_to(tree)
                    if relative.parts[0] != ".git":
                        archive.add(path, arcname=str(relative), recursive=False)
        data = buffer.getvalue()
        with self._lock:
            self._archives[key] = data
        return data


async def checkout(sandbox: Sandbox, instance: SWEInstance, archive: bytes) -> None:
    """Put ``instance``'s base tree at :data:`REPO_DIR` in ``sandbox`` as one commit whose sha
    is ``base_commit``; raise :class:`WorkspaceError` otherwise."""
    await sandbox.write_file(_ARCHIVE, archive)
    script = (
        f"set -e; mkdir {REPO_DIR}; tar -xzf {_ARCHIVE} -C {REPO_DIR} --no-same-owner; "
        f"rm {_ARCHIVE}; cd {REPO_DIR}; sh -c {shlex.quote(COMMIT_TREE_SH)} sh "
        f"{shlex.quote(instance.instance_id)}"
    )
    result = await sandbox.exec(["sh", "-c", script], timeout=120)
    sha = result.stdout.strip()
    if result.exit_code != 0:
        raise WorkspaceError(
            f"setting up {instance.instance_id!r} in the sandbox failed (exit {result.exit_code}): "
            f"{result.stderr.strip()[-2000:]}"
        )
    if sha != instance.base_commit:
        raise WorkspaceError(
            f"instance {instance.instance_id!r}: the sandbox's commit is {sha!r}, not base_commit "
            f"{instance.base_commit} (another git, or a changed tree)"
        )
