"""Put back, inside the grading sandbox, every file of the repository that the grade depends on.

SWE-v0's grader (:mod:`agentrl.envs.swe.grading`) copies this file into the fresh grading sandbox
and runs it there with ``python3 -I`` (standard library only, nothing of the repository on
``sys.path``), twice:

``save REPO STORE PATH...``
    Before the patch is applied, on the base tree: copies each ``PATH`` (relative to ``REPO``)
    that exists as a regular file into ``STORE``, and records which are absent, which
    ``conftest.py`` files and which symbolic links the base tree has.

``restore REPO STORE``
    After the patch is applied: refuses a tree that holds an entry named ``.git`` or a symbolic
    link the base tree did not have; removes every ``conftest.py`` the base tree did not have;
    then puts every saved path back as it was (its saved copy, or absent) and every base
    ``conftest.py`` too. Prints one JSON object: ``{"refused": reason}`` or ``{"restored":
    [paths that had changed]}``.

Nothing here follows a symbolic link, so a tree the patch shaped cannot redirect a write outside
``REPO``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys

_MANIFEST = "manifest.json"
_FILES = "files"


def save(repo: str, store: str, paths: list[str]) -> None:
    """Record the base state of ``paths`` (added to what an earlier ``save`` recorded) and of the
    tree's conftest files and links."""
    os.makedirs(os.path.join(store, _FILES), exist_ok=True)
    manifest = _read_manifest(store) or {"present": {}}
    for path in paths:
        source = os.path.join(repo, path)
        is_file = os.path.isfile(source) and not os.path.islink(source)
        manifest["present"][path] = is_file
        if is_file:
            _keep(repo, store, path)
    if "conftests" not in manifest:
        conftests, links, _ = _scan(repo)
        manifest |= {"conftests": sorted(conftests), "links": sorted(links)}
        for path in conftests:
            _keep(repo, store, path)
    with open(os.path.join(store, _MANIFEST), "w") as handle:
        json.dump(manifest, handle)


def _keep(repo: str, store: str, path: str) -> None:
    """Copy ``repo/path`` (bytes and mode) to the store."""
    target = os.path.join(store, _FILES, path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copy2(os.path.join(repo, path), target)


def _read_manifest(store: str) -> dict | None:
    try:
        with open(os.path.join(store, _MANIFEST)) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def restore(repo: str, store: str) -> dict:
    """Put the saved state back; see the module docstring."""
    manifest = _read_manifest(store)
    assert manifest is not None, f"no manifest in {store}: run save first"
    conftests, links, git_entries = _scan(repo)
    if git_entries:
        return {"refused": f"the patch adds a .git entry: {sorted(git_entries)[0]}"}
    new_links = sorted(links - set(manifest["links"]))
    if new_links:
        return {"refused": f"the patch adds a symbolic link: {new_links[0]}"}
    changed = []
    for path in sorted(conftests - set(manifest["conftests"])):
        _remove(os.path.join(repo, path))
        changed.append(path)
    wanted = dict(manifest["present"])
    wanted.update({path: True for path in manifest["conftests"]})
    for path, present in sorted(wanted.items()):
        saved = os.path.join(store, _FILES, path)
        target = os.path.join(repo, path)
        parent = os.path.dirname(target)
        if not _is_directory_chain(repo, parent):
            return {"refused": f"the patch replaces a directory on the path of {path}"}
        if _same(target, saved if present else None):
            continue
        _remove(target)
        if present:
            os.makedirs(parent, exist_ok=True)
            shutil.copy2(saved, target)
        changed.append(path)
    return {"restored": sorted(set(changed))}


def _scan(repo: str) -> tuple[set[str], set[str], set[str]]:
    """(conftest.py files, symbolic links, entries named .git) under ``repo``, relative."""
    conftests, links, git_entries = set(), set(), set()
    for directory, dirnames, filenames in os.walk(repo):
        relative = os.path.relpath(directory, repo)
        for name in dirnames + filenames:
            path = os.path.normpath(os.path.join(relative, name))
            if name == ".git":
                git_entries.add(path)
            if os.path.islink(os.path.join(directory, name)):
                links.add(path)
            elif name == "conftest.py" and name in filenames:
                conftests.add(path)
    return conftests, links, git_entries


def _is_directory_chain(repo: str, directory: str) -> bool:
    """Every existing component from ``repo`` down to ``directory`` is a real directory."""
    current = repo
    for part in os.path.relpath(directory, repo).split(os.sep):
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(mode):
            return False
    return True


def _same(target: str, saved: str | None) -> bool:
    """``target`` is exactly ``saved`` (a regular file with its bytes and mode), or both absent."""
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return saved is None
    if saved is None or not stat.S_ISREG(info.st_mode):
        return False
    if stat.S_IMODE(info.st_mode) != stat.S_IMODE(os.stat(saved).st_mode):
        return False
    with open(target, "rb") as a, open(saved, "rb") as b:
        return a.read() == b.read()


def _remove(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def main(argv: list[str]) -> int:
    command, repo, store, *paths = argv
    if command == "save":
        save(repo, store, paths)
        return 0
    if command == "restore":
        print(json.dumps(restore(repo, store)))
        return 0
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
