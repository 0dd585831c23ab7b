"""Local data files (JSON lines, JSON, Parquet, CSV) read with ``datasets``, by their suffix."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

# File suffix -> the datasets.Dataset constructor that reads it (datasets is imported on use: it
# takes a second to import).
READERS = {
    ".jsonl": "from_json",
    ".json": "from_json",
    ".parquet": "from_parquet",
    ".csv": "from_csv",
}
JSON_AND_PARQUET = (".jsonl", ".json", ".parquet")


def read_data_file(
    path: str | Path, what: str, suffixes: Collection[str] = JSON_AND_PARQUET
) -> datasets.Dataset:
    """The ``datasets.Dataset`` in ``path``. Raises :class:`FileNotFoundError` ("``what`` file not
    found") and :class:`ValueError` for a suffix not in ``suffixes``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    suffix = path.suffix.lower()
    if suffix not in suffixes:
        raise ValueError(
            f"unsupported {what} file type {path.suffix!r}; use one of {sorted(suffixes)}"
        )
    import datasets

    return getattr(datasets.Dataset, READERS[suffix])(str(path))
