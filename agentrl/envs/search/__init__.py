"""The Search environment: ``agentrl/Search-v0``."""

from agentrl.envs.search.env import SearchConfig, SearchEnv, extract_answer, make_retriever
from agentrl.envs.search.qa import (
    SHIPPED_CORPUS,
    SHIPPED_QUESTIONS,
    Question,
    exact_match,
    f1_score,
    normalize_answer,
    read_questions,
)

__all__ = [
    "SHIPPED_CORPUS",
    "SHIPPED_QUESTIONS",
    "Question",
    "SearchConfig",
    "SearchEnv",
    "exact_match",
    "extract_answer",
    "f1_score",
    "make_retriever",
    "normalize_answer",
    "read_questions",
]
