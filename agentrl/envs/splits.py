"""Held-out splits of the built-in task sets, decided by content, so train and test never share a task.

A task's split comes from the SHA-256 of a key taken from its content: ``"test"`` when the hash's
first 8 bytes, read as an integer, fall in the first :data:`TEST_SHARE` of their range, else
``"train"``. The rule needs no list of ids and holds for any set size or seed: the same content
always lands in the same split, so a generated problem that appears in two streams, or twice in
one, is never on both sides.

What each environment hashes (and so what the two sides never share):

- Math-v0's generated set: the question text.
- Search-v0's shipped questions: their answers. Questions that share a normalised gold answer
  are one group (transitively: a question answered "a" or "b" joins the group of every "a" and
  every "b"), and the group's smallest answer is hashed, so no test answer is a train answer.

A dataset the user gives has its own splits (a ``DatasetDict``'s ``split``) or none; it is never
re-split here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal

Split = Literal["train", "test"]
SPLITS: tuple[Split, ...] = ("train", "test")
TEST_SHARE = 0.2
"""The share of the hash space (so, roughly, of the tasks) held out as ``"test"``."""


def split_of(key: str) -> Split:
    """The split of the task whose content key is ``key`` (see the module docstring)."""
    value = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "test" if value < TEST_SHARE * 2**64 else "train"


def answer_group_keys(answers: Sequence[Sequence[str]]) -> list[str]:
    """For each task's normalised answers, the key of its group: tasks that share an answer,
    directly or through others, get the same key (the group's smallest answer)."""
    parent: dict[str, str] = {}

    def root(answer: str) -> str:
        while parent.setdefault(answer, answer) != answer:
            parent[answer] = parent[parent[answer]]  # path halving
            answer = parent[answer]
        return answer

    for task in answers:
        for other in task[1:]:
            a, b = root(task[0]), root(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return [root(task[0]) if task else "" for task in answers]
