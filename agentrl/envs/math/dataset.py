"""Math problems from local files or ``datasets`` objects, mapped to one record type.

Two source formats are understood, and anything else through an explicit column mapping:

- **gsm8k**: columns ``question`` and ``answer``, the gold answer after ``####`` in ``answer``.
- **math** (Hendrycks MATH, MATH-500): columns ``problem`` and ``solution``, the gold answer in an
  ``answer`` column when present, else the last ``\\boxed{...}`` of ``solution``.

Files are read with ``datasets`` (JSON lines, JSON, Parquet, CSV by extension); nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentrl.envs.data_files import READERS, read_data_file

if TYPE_CHECKING:
    import datasets

Format = Literal["auto", "gsm8k", "math", "plain"]


@dataclass(frozen=True)
class MathProblem:
    """One problem: ``answer`` is the gold final answer as text (LaTeX or plain)."""

    id: str
    question: str
    answer: str


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def gsm8k_answer(answer: str) -> str:
    """The final answer of a GSM8K ``answer`` field (the text after ``####``, commas removed)."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer has no '####' marker: {answer[-80:]!r}")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def detect_format(columns: list[str]) -> Format:
    if {"question", "answer"} <= set(columns):
        return "gsm8k"
    if {"problem", "solution"} <= set(columns) or {"problem", "answer"} <= set(columns):
        return "math"
    raise ValueError(
        f"cannot tell the dataset format from its columns {columns}; expected GSM8K "
        "(question, answer) or MATH (problem, solution[, answer]), or pass "
        "columns={'question': ..., 'answer': ...} with format='plain'"
    )


def read_dataset(source: str | Path | datasets.Dataset, split: str = "train") -> datasets.Dataset:
    """A ``datasets.Dataset`` from a file path, a ``DatasetDict`` split, or a dataset as is."""
    if isinstance(source, (str, Path)):
        return read_data_file(source, "dataset", READERS)
    import datasets  # on use: about 80 MB resident with pyarrow

    if isinstance(source, datasets.DatasetDict):
        return source[split]
    if isinstance(source, datasets.Dataset):
        return source
    raise TypeError(f"not a dataset: {type(source).__name__}")


def to_problems(
    dataset: datasets.Dataset,
    format: Format = "auto",
    columns: dict[str, str] | None = None,
) -> list[MathProblem]:
    """Map rows to :class:`MathProblem`. ``columns`` renames source columns to ``question``,
    ``answer`` (and for MATH, ``solution``) before the format's extraction applies."""
    rename = {source: target for target, source in (columns or {}).items()}
    missing = set(rename) - set(dataset.column_names)
    if missing:
        raise ValueError(f"columns {sorted(missing)} not in the dataset ({dataset.column_names})")
    names = [rename.get(c, c) for c in dataset.column_names]
    if format == "auto":
        format = "plain" if columns else detect_format(names)
    problems = []
    for index, raw in enumerate(dataset):
        row = {rename.get(k, k): v for k, v in raw.items()}
        problems.append(_problem(row, index, format))
    if not problems:
        raise ValueError("the math dataset is empty")
    return problems


def _problem(row: dict[str, Any], index: int, format: Format) -> MathProblem:
    pid = str(row.get("id", row.get("unique_id", index)))
    if format == "gsm8k":
        return MathProblem(pid, row["question"], gsm8k_answer(row["answer"]))
    if format == "math":
        answer = row.get("answer") or last_boxed(row.get("solution") or "")
        if answer is None:
            raise ValueError(f"row {index}: no 'answer' column and no \\boxed{{}} in 'solution'")
        return MathProblem(pid, row["problem"], str(answer))
    return MathProblem(pid, str(row["question"]), str(row["answer"]))
