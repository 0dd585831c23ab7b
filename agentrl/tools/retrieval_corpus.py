"""Corpora for retrieval: JSON lines or Parquet read with ``datasets``, checked, in one layout.

Two source layouts are understood (``format="auto"`` tells them apart by their columns):

- **search-r1**: ``contents`` whose first line is the title and the rest the text, as in the
  corpora Search-R1 and FlashRAG index (``wiki-18.jsonl``); a title in double quotes (as
  wiki-18 writes it) is unquoted, as Search-R1's BM25 retriever does. ``id`` is optional.
- **plain**: ``text``, with optional ``title`` and ``id``.

Either becomes a ``datasets.Dataset`` with the string columns ``id`` (the row number when the
source has none), ``title``, ``text`` and ``contents`` (``title`` + newline + ``text``, or
``text`` alone when there is no title): what a retriever returns for each hit.

Errors are :class:`CorpusError` with the file and what is wrong; for JSON lines, the line number
and what is wrong with that line (not valid UTF-8, not JSON, not an object, no text field, a text
that is not a string), found by reading the file line by line when the fast path fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import datasets
import pyarrow as pa

CorpusFormat = Literal["auto", "search-r1", "plain"]
COLUMNS = ("id", "title", "text", "contents")


class CorpusError(ValueError):
    """A corpus file is missing, unreadable, or has a row without usable text."""


def read_corpus(path: str | Path, format: CorpusFormat = "auto") -> datasets.Dataset:
    """The corpus at ``path`` (.jsonl, .json or .parquet) with the columns :data:`COLUMNS`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".parquet"):
        raise CorpusError(
            f"{path}: unsupported corpus file type {suffix!r}; use .jsonl or .parquet"
        )
    try:
        if suffix == ".parquet":
            raw = datasets.Dataset.from_parquet(str(path))
        else:
            raw = datasets.Dataset.from_json(str(path))
        return normalize_corpus(raw, format, where=str(path))
    except Exception as exc:  # pyarrow refused a line, let bad bytes through, or a row is bad
        problem = _first_bad_line(path, format) if suffix != ".parquet" else None
        if problem is None and isinstance(exc, CorpusError):
            raise
        raise CorpusError(problem or f"{path} cannot be read: {_cause(exc)}") from None


def normalize_corpus(
    raw: datasets.Dataset, format: CorpusFormat = "auto", *, where: str = "corpus"
) -> datasets.Dataset:
    """Check ``raw``'s text columns and map it to :data:`COLUMNS` (see the module docstring)."""
    if len(raw) == 0:
        raise CorpusError(f"{where}: the corpus is empty")
    if format == "auto":
        if "contents" in raw.column_names:
            format = "search-r1"
        elif "text" in raw.column_names:
            format = "plain"
        else:
            raise CorpusError(
                f"{where}: no 'contents' (Search-R1 layout) or 'text' (plain layout) column; "
                f"the columns are {raw.column_names}"
            )
    required = ["contents"] if format == "search-r1" else ["text"]
    optional = ["id"] if format == "search-r1" else ["id", "title"]
    for name in required:
        if name not in raw.column_names:
            raise CorpusError(f"{where}: the {format} layout needs a {name!r} column")
        _check_strings(raw, name, where, allow_null=False)
    for name in optional:
        if name in raw.column_names and name != "id":
            _check_strings(raw, name, where, allow_null=True)
    split = _split_contents if format == "search-r1" else _join_title
    return raw.map(
        split, batched=True, with_indices=True, remove_columns=raw.column_names, desc="corpus"
    )


def _check_strings(raw: datasets.Dataset, name: str, where: str, *, allow_null: bool) -> None:
    column = raw.data.column(name)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise CorpusError(f"{where}: column {name!r} holds {column.type}, not text")
    if not allow_null and column.null_count:
        row = next(i for i, value in enumerate(column) if not value.is_valid)
        raise CorpusError(f"{where}: row {row} has no {name!r}")


def _split_contents(batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[str]]:
    ids = batch.get("id") or [None] * len(indices)
    out: dict[str, list[str]] = {column: [] for column in COLUMNS}
    for index, id_, contents in zip(indices, ids, batch["contents"], strict=True):
        title, _, text = contents.partition("\n")
        out["id"].append(str(index if id_ is None else id_))
        out["title"].append(title.strip('"'))
        out["text"].append(text)
        out["contents"].append(contents)
    return out


def _join_title(batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[str]]:
    ids = batch.get("id") or [None] * len(indices)
    titles = batch.get("title") or [None] * len(indices)
    out: dict[str, list[str]] = {column: [] for column in COLUMNS}
    for index, id_, title, text in zip(indices, ids, titles, batch["text"], strict=True):
        out["id"].append(str(index if id_ is None else id_))
        out["title"].append(title or "")
        out["text"].append(text)
        out["contents"].append(f"{title}\n{text}" if title else text)
    return out


def _first_bad_line(path: Path, format: CorpusFormat) -> str | None:
    """Where a JSON-lines corpus goes wrong, line by line; None when every line looks right."""
    fields = {"auto": ("contents", "text"), "search-r1": ("contents",), "plain": ("text",)}[format]
    rows = 0
    with open(path, "rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            rows += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                where = f"byte {raw[exc.start]:#04x} at column {exc.start + 1}"
                return f"{path} line {number} is not valid UTF-8 ({where})"
            try:
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                return f"{path} line {number} is not valid JSON: {exc.msg} (column {exc.colno})"
            except (ValueError, RecursionError) as exc:
                return f"{path} line {number} is not valid JSON: {exc}"
            if not isinstance(row, dict):
                return f"{path} line {number} is a JSON {type(row).__name__}, not an object"
            present = [name for name in fields if name in row]
            if not present:
                return f"{path} line {number} has no {' or '.join(map(repr, fields))} field"
            if not isinstance(row[present[0]], str):
                kind = type(row[present[0]]).__name__
                return f"{path} line {number}: {present[0]!r} must be a string, not {kind}"
    return None if rows else f"{path}: the corpus is empty"


def _cause(exc: BaseException) -> str:
    """The innermost message of a chained exception (``datasets`` wraps pyarrow's)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return f"{type(exc).__name__}: {exc}"
