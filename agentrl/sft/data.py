"""Conversations for supervised fine-tuning, tokenized exactly as a rollout would hold them.

A conversation is a row ``{"messages": [...], "tools": [...]?}`` of a JSONL or Parquet file
(loaded with ``datasets``): chat messages with ``role`` and ``content``, at least one assistant
turn, the last message an assistant turn. ``messages`` and ``tools`` may also be JSON strings (the
``messages`` column of ``agentrl rollout``'s output is one). Other columns are kept as they are.

Tokenization (:func:`tokenize_conversation`) replays the conversation through the rollout's
:class:`~agentrl.tokenization.TrajectoryBuilder`: the messages before the first assistant turn
are the initial prompt (chat template with the tool schemas, plus the generation prompt); each
assistant turn is appended as if an engine had produced it, ``encode(content + closing)`` where
``closing`` is what the template writes after the content up to its end-of-turn token (ChatML:
``<|im_end|>``), with loss mask 1; the messages between assistant turns are appended as the
template's delta ids with loss mask 0, the next generation prompt included. So:

* the loss mask is 1 on exactly the ids a policy generates in a rollout (each assistant turn's
  content and its end-of-turn token), 0 on the system prompt, user turns, tool results and the
  template's role headers;
* the ids are those a rollout would hold for the same conversation whenever the engine's ids for
  each turn are the tokenizer's own encoding of its text and each turn ended with its end-of-turn
  token (tested against real rollouts, ``tests/sft/test_sft_masks.py``); they are not
  necessarily ``encode(render(conversation))``: like a rollout, the generation prompt and the
  assistant text are encoded apart (see token seams in :mod:`agentrl.tokenization`).

Refused, with a :class:`ConversationError` naming the row: a missing or empty ``messages``, a
message without a string ``role`` or ``content``, no assistant turn, a conversation that does not
end with an assistant turn, an assistant message with OpenAI ``tool_calls`` (write the call in the
content, in the environment's tool format, as the policy would), and roles the template refuses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.tokenization import (
    ChatFormat,
    TemplateError,
    TemplatePolicy,
    TokenTrajectory,
    TrajectoryBuilder,
)

if TYPE_CHECKING:
    import datasets

DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class ConversationError(ValueError):
    """A row that is not a conversation SFT can train on."""


@dataclass(frozen=True)
class TokenizedConversations:
    """Token rows ready for :func:`~agentrl.training.packing.pack_for_rank`, and what was left out."""

    rows: list[dict[str, list[int]]]
    """``{"input_ids": [...], "loss_mask": [...]}`` per kept conversation."""
    dropped_too_long: int
    """Conversations longer than the token limit."""

    @property
    def loss_tokens(self) -> int:
        return sum(sum(row["loss_mask"]) for row in self.rows)

    @property
    def tokens(self) -> int:
        return sum(len(row["input_ids"]) for row in self.rows)


def load_conversations(path: str | Path) -> datasets.Dataset:
    """The rows of a .jsonl/.json/.parquet file as a ``datasets.Dataset``; raises
    ``FileNotFoundError``, or :class:`ConversationError` for another suffix, no ``messages``
    column or no rows."""
    import datasets

    path = Path(path)
    builder = DATA_SUFFIXES.get(path.suffix.lower())
    if builder is None:
        raise ConversationError(f"{path}: expected a .jsonl, .json or .parquet file")
    if not path.is_file():
        raise FileNotFoundError(f"no conversation file at {path}")
    if path.stat().st_size == 0:
        raise ConversationError(f"{path} is empty: no conversations to train on")
    dataset = datasets.load_dataset(builder, data_files=str(path), split="train")
    if "messages" not in dataset.column_names:
        raise ConversationError(
            f"{path}: rows have no 'messages' column (columns: {dataset.column_names}); each row "
            "must be {'messages': [{'role': ..., 'content': ...}, ...], 'tools': [...]?}"
        )
    if len(dataset) == 0:
        raise ConversationError(f"{path} holds no conversations")
    return dataset


def conversation_of(row: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict] | None]:
    """``(messages, tools)`` of a row, with the ``None`` fields Arrow adds to mixed records
    removed (a template tests ``message.tool_calls is defined``; ``None`` would pass)."""
    messages = row.get("messages")
    tools = row.get("tools")
    if isinstance(messages, str):
        messages = json.loads(messages)
    if isinstance(tools, str):
        tools = json.loads(tools)
    if not isinstance(messages, list) or not messages:
        raise ConversationError("'messages' must be a non-empty list of messages")
    cleaned = [_without_nulls(m) for m in messages]
    return cleaned, [_without_nulls(t) for t in tools] if tools else None


def tokenize_conversation(
    fmt: ChatFormat,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    policy: TemplatePolicy | str = TemplatePolicy.KEEP,
) -> TokenTrajectory:
    """The token trajectory of one conversation, with the rollout's loss mask (module docstring).

    Raises :class:`ConversationError` for a conversation SFT cannot train on (the reason in the
    message, including the template's refusal of its roles).
    """
    _check_messages(messages)
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    if first == 0:
        raise ConversationError("the conversation opens with an assistant turn: it has no prompt")
    try:
        builder = TrajectoryBuilder(fmt, messages[:first], tools, policy=policy)
        i = first
        while i < len(messages):
            content = messages[i]["content"]
            builder.add_completion(*_completion(fmt, content, tools), text=content)
            following = i + 1
            while following < len(messages) and messages[following]["role"] != "assistant":
                following += 1
            if following < len(messages):  # another assistant turn: the messages between first
                builder.add_messages(messages[i + 1 : following])
            i = following
    except TemplateError as exc:
        raise ConversationError(str(exc)) from None
    return builder.trajectory


def tokenize_dataset(
    fmt: ChatFormat,
    dataset: datasets.Dataset | Sequence[Mapping[str, Any]],
    *,
    max_tokens: int,
    policy: TemplatePolicy | str = TemplatePolicy.KEEP,
    where: str = "dataset",
) -> TokenizedConversations:
    """Tokenize every row; rows longer than ``max_tokens`` are dropped and counted. A bad row
    raises :class:`ConversationError` naming its index in ``where``."""
    rows: list[dict[str, list[int]]] = []
    dropped = 0
    for index, row in enumerate(dataset):
        try:
            messages, tools = conversation_of(row)
            tokens = tokenize_conversation(fmt, messages, tools, policy=policy)
        except (ConversationError, json.JSONDecodeError) as exc:
            raise ConversationError(f"{where}, row {index}: {exc}") from None
        if len(tokens) > max_tokens:
            dropped += 1
            continue
        rows.append({"input_ids": tokens.input_ids, "loss_mask": tokens.loss_mask})
    if not rows:
        raise ConversationError(
            f"{where}: no conversation fits in {max_tokens} tokens ({dropped} dropped); raise "
            "data.max_tokens"
        )
    return TokenizedConversations(rows, dropped)


def _completion(
    fmt: ChatFormat, content: str, tools: Sequence[Mapping[str, Any]] | None
) -> tuple[list[int], list[float], int]:
    """The ids an engine produces for assistant ``content``: the text, then the template's
    closing up to its end-of-turn token (which a rollout's engine stops on)."""
    ids = fmt.encode(content + fmt.closing_text(content, tools))
    if not ids or ids[-1] not in fmt.end_of_turn_ids:
        raise ConversationError(
            f"the template closes the assistant turn {content[:40]!r} without an end-of-turn "
            "token, so it cannot be a rollout turn"
        )
    return ids, [0.0] * len(ids), 0


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    if not messages:
        raise ConversationError("'messages' is empty")
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ConversationError(f"message {position} is not a mapping: {message!r:.80}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise ConversationError(
                f"message {position} needs a string 'role' and 'content', got role={role!r:.40} "
                f"content={content!r:.40}"
            )
        if role == "assistant" and message.get("tool_calls"):
            raise ConversationError(
                f"message {position}: assistant 'tool_calls' are not supported; write the call "
                "in the content, in the environment's tool format, as the policy generates it"
            )
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise ConversationError(f"no assistant turn to learn from (roles: {roles})")
    if roles[-1] != "assistant":
        raise ConversationError(
            f"the conversation ends with a {roles[-1]!r} message, not an assistant turn "
            f"(roles: {roles}); drop the trailing messages, nothing would learn from them"
        )


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
