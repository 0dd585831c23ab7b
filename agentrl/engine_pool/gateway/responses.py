"""OpenAI's response bodies and stream chunks, with the token fields RL gateways read.

Every chat and text completion carries, besides OpenAI's fields, ``prompt_token_ids`` (top level,
as vLLM writes it, and on every choice, as SGLang does) and each choice's ``token_ids``: exactly
the ids the engine sampled, the end-of-turn or stop token included. ``logprobs.content`` (chat) and
``logprobs.token_logprobs`` (completions) have one entry per sampled id, in order, each the
engine's log-prob; ``top_logprobs`` is always empty (engines return the sampled token's only).
A token's ``token`` is its id decoded alone and ``bytes`` that text's UTF-8 (a token that holds
part of a multi-byte character decodes to U+FFFD).

Streams are OpenAI's chunks: per choice a role chunk (with ``prompt_token_ids``), a content chunk
(with ``token_ids`` and log-probs), a chunk per tool call, a finish chunk; then a usage chunk when
``stream_options.include_usage``; then ``data: [DONE]``. The engine protocol returns whole
generations, so the chunks are sent when the generation is complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.engine_pool.engine import GenerateResult
from agentrl.engine_pool.gateway.messages import Reply


@dataclass(frozen=True)
class Choice:
    """One generated choice: the engine's result, its text and its OpenAI reading."""

    index: int
    result: GenerateResult
    text: str
    """The decoded text (special tokens skipped, a matched stop string and what follows cut)."""
    reply: Reply
    finish_reason: str


def finish_reason(result: GenerateResult, reply: Reply) -> str:
    """OpenAI's finish reason: ``tool_calls`` when calls were parsed, else the engine's
    (``stop``, ``length``, or ``abort`` as SGLang reports it)."""
    return "tool_calls" if reply.tool_calls else result.finish_reason


def usage(prompt_ids: Sequence[int], choices: Sequence[Choice]) -> dict[str, int]:
    completion = sum(len(choice.result.token_ids) for choice in choices)
    return {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(prompt_ids) + completion,
    }


Decode = Callable[[Sequence[int]], str]


def token_logprobs(result: GenerateResult, decode: Decode) -> list[dict[str, Any]]:
    """``logprobs.content`` of a chat choice: one entry per sampled id."""
    entries = []
    for token_id, logprob in zip(result.token_ids, result.logprobs, strict=True):
        token = decode([token_id])
        entries.append(
            {
                "token": token,
                "logprob": logprob,
                "bytes": list(token.encode("utf-8")),
                "top_logprobs": [],
            }
        )
    return entries


def chat_completion(
    header: dict[str, Any],
    prompt_ids: list[int],
    choices: Sequence[Choice],
    logprobs: bool,
    decode: Decode,
) -> dict[str, Any]:
    """A ``chat.completion`` body; ``header`` holds ``id``, ``created``, ``model``."""
    return {
        **header,
        "object": "chat.completion",
        "choices": [
            {
                "index": choice.index,
                "message": choice.reply.message(),
                "logprobs": {"content": token_logprobs(choice.result, decode)}
                if logprobs
                else None,
                "finish_reason": choice.finish_reason,
                "prompt_token_ids": prompt_ids,
                "token_ids": choice.result.token_ids,
                "weight_version": choice.result.weight_version,
            }
            for choice in choices
        ],
        "usage": usage(prompt_ids, choices),
        "prompt_token_ids": prompt_ids,
    }


def chat_chunks(
    header: dict[str, Any],
    prompt_ids: list[int],
    choices: Sequence[Choice],
    logprobs: bool,
    include_usage: bool,
    decode: Decode,
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a stream (``[DONE]`` not included)."""
    base = {**header, "object": "chat.completion.chunk"}

    def chunk(index: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        fields = {"logprobs": None, "finish_reason": None, **extra}
        return {**base, "choices": [{"index": index, "delta": delta, **fields}]}

    chunks = []
    for choice in choices:
        i = choice.index
        role = chunk(i, {"role": "assistant", "content": ""})
        role["prompt_token_ids"] = prompt_ids
        chunks.append(role)
        content = choice.reply.content
        chunks.append(
            chunk(
                i,
                {"content": content or ""},
                logprobs={"content": token_logprobs(choice.result, decode)} if logprobs else None,
                token_ids=choice.result.token_ids,
            )
        )
        for k, call in enumerate(choice.reply.tool_calls):
            chunks.append(chunk(i, {"tool_calls": [{"index": k, **call}]}))
        chunks.append(chunk(i, {}, finish_reason=choice.finish_reason))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": usage(prompt_ids, choices)})
    return chunks


def _completion_logprobs(result: GenerateResult, decode: Decode) -> dict[str, Any]:
    tokens = [decode([token_id]) for token_id in result.token_ids]
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": list(result.logprobs),
        "top_logprobs": None,
        "text_offset": offsets,
    }


def completion(
    header: dict[str, Any],
    prompt_ids: list[int],
    choices: Sequence[Choice],
    logprobs: bool,
    decode: Decode,
) -> dict[str, Any]:
    """A ``text_completion`` body."""
    return {
        **header,
        "object": "text_completion",
        "choices": [_completion_choice(c, prompt_ids, logprobs, decode) for c in choices],
        "usage": usage(prompt_ids, choices),
        "prompt_token_ids": prompt_ids,
    }


def completion_chunks(
    header: dict[str, Any],
    prompt_ids: list[int],
    choices: Sequence[Choice],
    logprobs: bool,
    include_usage: bool,
    decode: Decode,
) -> list[dict[str, Any]]:
    """The ``text_completion`` chunks of a stream: per choice its text, then its finish."""
    base = {**header, "object": "text_completion"}
    chunks: list[dict[str, Any]] = []
    for choice in choices:
        body = _completion_choice(choice, prompt_ids, logprobs, decode)
        body["finish_reason"] = None
        chunks.append({**base, "choices": [body]})
        finish = {"index": choice.index, "text": "", "logprobs": None}
        chunks.append({**base, "choices": [{**finish, "finish_reason": choice.finish_reason}]})
    if include_usage:
        chunks.append({**base, "choices": [], "usage": usage(prompt_ids, choices)})
    return chunks


def _completion_choice(
    choice: Choice, prompt_ids: list[int], logprobs: bool, decode: Decode
) -> dict[str, Any]:
    return {
        "index": choice.index,
        "text": choice.text,
        "logprobs": _completion_logprobs(choice.result, decode) if logprobs else None,
        "finish_reason": choice.finish_reason,
        "prompt_token_ids": prompt_ids,
        "token_ids": choice.result.token_ids,
        "weight_version": choice.result.weight_version,
    }
