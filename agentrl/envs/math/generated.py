"""A built-in, offline set of arithmetic word problems, generated deterministically from a seed.

Difficulty 1 is one operation on small numbers (a model of SmolLM2's size solves some of these, so
reward has signal for learning runs); 2 chains two operations; 3 chains three with larger numbers.
"""

from __future__ import annotations

import itertools

import numpy as np

from agentrl.envs.math.dataset import MathProblem
from agentrl.envs.splits import SPLITS, Split, split_of

_NAMES = ("Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jia")
_ITEMS = ("apples", "marbles", "books", "stickers", "coins", "pencils", "shells", "cards")


def generate_problems(
    count: int, seed: int = 0, difficulty: int = 1, split: Split | None = None
) -> list[MathProblem]:
    """``count`` problems; the same arguments always give the same list. With ``split``, only
    problems of that held-out split (:mod:`agentrl.envs.splits`, by question text) are kept from
    the same stream, so the ``"train"`` and ``"test"`` sets never share a question."""
    if difficulty not in (1, 2, 3):
        raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty}")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = np.random.default_rng([seed, difficulty])
    problems: list[MathProblem] = []
    for index in itertools.count():
        problem = _problem(rng, index, difficulty)
        if split is None or split_of(problem.question) == split:
            problems.append(problem)
            if len(problems) == count:
                return problems
    raise AssertionError("unreachable")


def _problem(rng: np.random.Generator, index: int, difficulty: int) -> MathProblem:
    name = _NAMES[rng.integers(len(_NAMES))]
    item = _ITEMS[rng.integers(len(_ITEMS))]
    high = (10, 50, 200)[difficulty - 1]
    total = int(rng.integers(2, high))
    sentences = [f"{name} has {total} {item}."]
    for _ in range(difficulty):
        kind = rng.integers(3)
        n = int(rng.integers(2, max(3, high // 2)))
        if kind == 0:
            sentences.append(f"Then {name} gets {n} more.")
            total += n
        elif kind == 1 and total > n:
            sentences.append(f"Then {name} gives away {n}.")
            total -= n
        else:
            k = int(rng.integers(2, 4))
            sentences.append(f"Then the number of {item} is multiplied by {k}.")
            total *= k
    sentences.append(f"How many {item} does {name} have now?")
    return MathProblem(f"gen-{difficulty}-{index}", " ".join(sentences), str(total))
