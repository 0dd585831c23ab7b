"""Question-answering data and grading for Search-v0.

Questions are rows with ``question`` and ``golden_answers`` (a list of accepted answers, or one
string), the layout of FlashRAG and Search-R1's data; ``answer`` is accepted in place of
``golden_answers``, and ``columns=`` renames other layouts. ``id`` and ``metadata`` are optional.

Answers are graded as Search-R1 grades them (``verl/utils/reward_score/qa_em.py``): both sides are
normalised (lower case, punctuation removed, the articles *a*, *an*, *the* removed, whitespace
collapsed) and the answer is correct when it equals one gold answer. F1 is SQuAD's token F1 on the
normalised texts, the best over the gold answers.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import datasets

from agentrl.envs.data_files import read_data_file

DATA_DIR = Path(__file__).parent / "data"
SHIPPED_QUESTIONS = DATA_DIR / "wordnet_questions.jsonl"
"""The shipped question set (see ``data/README.md``)."""
SHIPPED_CORPUS = DATA_DIR / "wordnet_corpus.jsonl"
"""The shipped corpus: one passage per WordNet 3.0 noun instance and class (``data/README.md``)."""

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


@dataclass(frozen=True)
class Question:
    """One question: the accepted answers, and what the data says about it (``metadata``)."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD's and Search-R1's rule)."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golden_answers: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer, else 0.0."""
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(gold) for gold in golden_answers))


def f1_score(prediction: str, golden_answers: Sequence[str]) -> float:
    """SQuAD token F1 between the normalised prediction and the best-matching gold answer."""
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for gold in golden_answers:
        expected = normalize_answer(gold).split()
        common = sum((Counter(predicted) & Counter(expected)).values())
        if common:
            precision, recall = common / len(predicted), common / len(expected)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def read_questions(
    source: str | Path | datasets.Dataset | datasets.DatasetDict | None = None,
    *,
    split: str = "train",
    columns: dict[str, str] | None = None,
) -> list[Question]:
    """Questions from a file (.jsonl/.json/.parquet), a ``datasets`` object (``split`` picks a
    ``DatasetDict``'s), or the shipped set (``None``). ``columns`` maps ``question`` /
    ``golden_answers`` to the source's column names."""
    if source is None:
        source = SHIPPED_QUESTIONS
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"agentrl/Search-v0: question file not found: {path}")
        renames = tuple(sorted((columns or {}).items()))
        return list(_from_file(str(path), path.stat().st_mtime_ns, renames))
    if isinstance(source, datasets.DatasetDict):
        source = source[split]
    return to_questions(source, columns)


def to_questions(
    dataset: datasets.Dataset, columns: dict[str, str] | None = None
) -> list[Question]:
    """Map rows to :class:`Question` (see the module docstring for the accepted columns)."""
    rename = {source: target for target, source in (columns or {}).items()}
    missing = set(rename) - set(dataset.column_names)
    if missing:
        raise ValueError(f"columns {sorted(missing)} not in the dataset ({dataset.column_names})")
    questions = []
    for index, raw in enumerate(dataset):
        row = {rename.get(key, key): value for key, value in raw.items()}
        answers = row.get("golden_answers", row.get("answer"))
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(row.get("question"), str) or not answers:
            raise ValueError(
                f"question row {index} needs a string 'question' and 'golden_answers' (a list of "
                f"strings) or 'answer'; it has columns {sorted(row)}"
            )
        metadata = row.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        questions.append(
            Question(
                str(row.get("id", index)),
                row["question"],
                tuple(str(answer) for answer in answers),
                metadata,
            )
        )
    if not questions:
        raise ValueError("the question set is empty")
    return questions


@cache
def _from_file(
    path: str, mtime_ns: int, columns: tuple[tuple[str, str], ...]
) -> tuple[Question, ...]:
    return tuple(to_questions(read_data_file(path, "question"), dict(columns) or None))
