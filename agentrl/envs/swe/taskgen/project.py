"""What the generator reads from a source distribution: its metadata and which files are source
modules (where bugs go) and which are test modules (which may be hidden)."""

from __future__ import annotations

import fnmatch
import re
import tarfile
from dataclasses import dataclass
from email.message import Message
from email.parser import Parser
from pathlib import Path, PurePosixPath

# Directories whose modules are never mutated: tests, documentation, benchmarks, examples.
_NON_SOURCE_DIRS = {
    "test",
    "tests",
    "testing",
    "doc",
    "docs",
    "benchmark",
    "benchmarks",
    "examples",
}
_NON_SOURCE_FILES = {"setup.py", "conftest.py", "noxfile.py", "tasks.py"}


@dataclass(frozen=True)
class SdistInfo:
    """A source distribution's identity, from its ``PKG-INFO``."""

    path: Path
    name: str
    """The normalized distribution name (PEP 503), e.g. ``"more-itertools"``."""
    version: str
    license: str
    """License-Expression, else a one-line License field, else the license classifier, else
    ``"unknown"``."""
    top: str
    """The archive's top directory, e.g. ``"toolz-1.2.0"``."""

    @property
    def pypi_url(self) -> str:
        return f"https://pypi.org/project/{self.name}/{self.version}/"

    @property
    def source_url(self) -> str:
        """PyPI's stable address for a release's sdist (it redirects to the file)."""
        return f"https://files.pythonhosted.org/packages/source/{self.name[0]}/{self.name}/{self.path.name}"


def read_sdist(path: str | Path) -> SdistInfo:
    """The metadata of the ``.tar.gz`` sdist at ``path``; ValueError if it has no PKG-INFO."""
    path = Path(path)
    with tarfile.open(path, "r:gz") as archive:
        top = archive.getmembers()[0].name.split("/", 1)[0]
        try:
            member = archive.extractfile(f"{top}/PKG-INFO")
        except KeyError:
            member = None
        if member is None:
            raise ValueError(f"{path}: no {top}/PKG-INFO; is it a source distribution?")
        metadata = Parser().parsestr(member.read().decode("utf-8"))
    name = re.sub(r"[-_.]+", "-", metadata["Name"]).lower()
    return SdistInfo(path, name, str(metadata["Version"]), _license(metadata), top)


def _license(metadata: Message) -> str:
    expression = metadata.get("License-Expression")
    if expression:
        return str(expression).strip()
    text = str(metadata.get("License") or "").strip()
    if text and "\n" not in text and len(text) <= 80 and text.upper() != "UNKNOWN":
        return text
    classifiers = metadata.get_all("Classifier") or []
    licenses = [c.split("::")[-1].strip() for c in classifiers if c.startswith("License ::")]
    return licenses[0] if licenses else "unknown"


def is_test_file(path: str) -> bool:
    """Whether ``path`` (relative, posix) is a pytest test module: ``test_*.py`` or ``*_test.py``."""
    name = PurePosixPath(path).name
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def source_modules(tree: Path, patterns: list[str] | None = None) -> list[str]:
    """The modules bugs may go in, relative posix paths in sorted order: those matching one of
    ``patterns`` (fnmatch on the relative path), or by default every ``.py`` file that is not a
    test module, ``conftest.py``, ``setup.py``, nor under a tests, docs, benchmarks or examples
    directory."""
    found = []
    for file in sorted(tree.rglob("*.py")):
        relative = file.relative_to(tree).as_posix()
        parts = PurePosixPath(relative).parts
        if patterns is not None:
            chosen = any(fnmatch.fnmatch(relative, pattern) for pattern in patterns)
        else:
            chosen = not (
                is_test_file(relative)
                or parts[-1] in _NON_SOURCE_FILES
                or _NON_SOURCE_DIRS.intersection(parts[:-1])
                or any(part.endswith(".egg-info") for part in parts)
            )
        if chosen and file.is_file() and not file.is_symlink():
            found.append(relative)
    return found
