"""Where agentrl keeps what it derives once per machine (converted models, retriever indexes).

``cache_root()`` is ``$AGENTRL_CACHE_DIR`` when set, else ``~/.cache/agentrl``; entries live in a
subdirectory per kind (``models``, ``retriever``), named after a digest of what they were made from
(:func:`hash_file` feeds a file's bytes into one).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir`` if given, else ``$AGENTRL_CACHE_DIR``, else ``~/.cache/agentrl``."""
    return Path(
        cache_dir or os.environ.get("AGENTRL_CACHE_DIR") or Path.home() / ".cache" / "agentrl"
    )


def hash_file(digest: hashlib._Hash, path: Path, block: int = 1 << 22) -> None:
    """Update ``digest`` with the bytes of ``path``, read ``block`` bytes at a time."""
    with open(path, "rb") as data:
        for chunk in iter(lambda: data.read(block), b""):
            digest.update(chunk)
