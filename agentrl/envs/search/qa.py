"""Question-answering data and grading for Search-v0.

Questions are rows with ``question`` and ``golden_answers`` (a list of accepted answers, or one
string), the layout of FlashRAG and Search-R1's data; ``answer`` is accepted in place of
``golden_answers``, and ``columns=`` renames other layouts. ``id`` and ``metadata`` are optional.

Search-R1's parquet rows (``scripts/data_process/nq_search.py`` and ``qa_search_*_merge.py``: the
FlashRAG columns ``id``, ``question``, ``golden_answers``, plus ``data_source``, ``prompt`` (one
user message), ``ability``, ``reward_model`` (``{"style": "rule", "ground_truth": {"target":
[...]}}``) and ``extra_info``) are read as they are: the gold answers are ``golden_answers``, else
``reward_model.ground_truth.target``; ``data_source`` and ``prompt`` go into ``metadata``, where
``protocol="search-r1"`` takes its prompt from.

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
from typing import Any, cast

import datasets

from agentrl.envs.data_files import read_data_file
from agentrl.envs.splits import SPLITS, Split, answer_group_keys, split_of

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
    ``DatasetDict``'s), or the shipped set (``None``: ``split`` is ``"train"`` or ``"test"``,
    held out by answer, :func:`held_out`). ``columns`` maps ``question`` / ``golden_answers`` to
    the source's column names. A file or a single Dataset is used whole."""
    if source is None:
        if split not in SPLITS:
            raise ValueError(
                f"agentrl/Search-v0: the shipped questions have the splits {SPLITS}, not {split!r}"
            )
        return held_out(
            list(_from_file(str(SHIPPED_QUESTIONS), SHIPPED_QUESTIONS.stat().st_mtime_ns, ())),
            cast(Split, split),
        )
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"agentrl/Search-v0: question file not found: {path}")
        renames = tuple(sorted((columns or {}).items()))
        return list(_from_file(str(path), path.stat().st_mtime_ns, renames))
    if isinstance(source, datasets.DatasetDict):
        source = source[split]
    return to_questions(source, columns)


def held_out(questions: list[Question], split: Split) -> list[Question]:
    """The questions of ``split``, grouped by answer so that no test answer is a train answer
    (:func:`agentrl.envs.splits.answer_group_keys` over the normalised gold answers)."""
    answers = [sorted({normalize_answer(a) for a in q.golden_answers}) for q in questions]
    keys = answer_group_keys(answers)
    return [q for q, key in zip(questions, keys, strict=True) if split_of(key) == split]


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
        answers = row.get("golden_answers", row.get("answer")) or _target(row)
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(row.get("question"), str) or not answers:
            raise ValueError(
                f"question row {index} needs a string 'question' and 'golden_answers' (a list of "
                f"strings) or 'answer'; it has columns {sorted(row)}"
            )
        metadata = row.get("metadata")
        metadata = dict(metadata) if isinstance(metadata, dict) else {}
        if row.get("data_source") is not None:
            metadata["data_source"] = str(row["data_source"])
        if row.get("prompt") is not None:
            metadata["prompt"] = _messages(row["prompt"], index)
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


def _target(row: dict[str, Any]) -> Any:
    """Search-R1's ``reward_model.ground_truth.target``, or None."""
    reward_model = row.get("reward_model")
    ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    return ground_truth.get("target") if isinstance(ground_truth, dict) else None


def _messages(prompt: Any, index: int) -> list[dict[str, str]]:
    """A row's ``prompt``: a non-empty list of ``{"role", "content"}`` string messages."""
    if (
        not isinstance(prompt, list)
        or not prompt
        or not all(
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
            for message in prompt
        )
    ):
        raise ValueError(
            f"question row {index}: 'prompt' must be a list of messages with string 'role' and "
            f"'content' (Search-R1's layout), got {prompt!r:.200}"
        )
    return [{"role": message["role"], "content": message["content"]} for message in prompt]


@cache
def _from_file(
    path: str, mtime_ns: int, columns: tuple[tuple[str, str], ...]
) -> tuple[Question, ...]:
    return tuple(to_questions(read_data_file(path, "question"), dict(columns) or None))
