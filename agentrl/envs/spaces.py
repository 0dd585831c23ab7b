"""Gymnasium spaces for chat environments: a list of chat messages in, the assistant's text out."""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

Message = dict[str, Any]
"""A chat message: ``{"role": ..., "content": str}`` plus optional ``name``, ``tool_calls``,
``tool_call_id``."""

ROLES = ("system", "user", "assistant", "tool")
OPTIONAL_KEYS = frozenset({"name", "tool_calls", "tool_call_id"})
_SAMPLE_CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"


def is_message(value: Any, roles: Sequence[str] = ROLES) -> bool:
    """True when ``value`` is a well-formed chat message with a role from ``roles``."""
    return (
        isinstance(value, dict)
        and value.get("role") in roles
        and isinstance(value.get("content"), str)
        and set(value) - {"role", "content"} <= OPTIONAL_KEYS
    )


class AssistantText(spaces.Space[str]):
    """The action space: any string the model produced (empty allowed), up to ``max_length`` chars."""

    def __init__(self, max_length: int = 1 << 20, seed: int | np.random.Generator | None = None):
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        length = int(self.np_random.integers(0, min(self.max_length, 64) + 1))
        picks = self.np_random.integers(0, len(_SAMPLE_CHARS), size=length)
        return "".join(_SAMPLE_CHARS[i] for i in picks)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AssistantText(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AssistantText) and other.max_length == self.max_length


class ChatMessages(spaces.Space[list[Message]]):
    """The observation space: a list of chat messages whose roles come from ``roles``.

    ``reset`` observes the opening messages (system prompt, task); ``step`` observes only the messages
    the environment adds after the assistant's turn (tool results, feedback), possibly none.
    """

    def __init__(
        self,
        roles: Sequence[str] = ROLES,
        max_messages: int = 1 << 16,
        seed: int | np.random.Generator | None = None,
    ):
        self.roles = tuple(roles)
        self.max_messages = max_messages
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        text = AssistantText(max_length=64, seed=int(self.np_random.integers(1 << 31)))
        count = int(self.np_random.integers(0, min(self.max_messages, 4) + 1))
        return [
            {
                "role": self.roles[int(self.np_random.integers(len(self.roles)))],
                "content": text.sample(),
            }
            for _ in range(count)
        ]

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, list)
            and len(x) <= self.max_messages
            and all(is_message(m, self.roles) for m in x)
        )

    def __repr__(self) -> str:
        return f"ChatMessages(roles={self.roles}, max_messages={self.max_messages})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ChatMessages)
            and other.roles == self.roles
            and other.max_messages == self.max_messages
        )
