"""Hypothesis strategies for random multi-turn tool-using episodes, and a simulated engine."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

# The tool schema of the episodes' calls (Hermes ``calc`` calls, see assistant_turns).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "evaluate",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    }
]

# The smollm2 vocabulary has no byte token for 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d or the UTF-8 lead
# bytes of U+40000..U+BFFFF: its tokenizer drops them, so no token-level scheme can reproduce them.
_LOST = "\x04\x06\x13\x14\x16\x1d"
texts = st.one_of(
    st.text(
        st.characters(codec="utf-8", max_codepoint=0x3FFFF, exclude_characters=_LOST), max_size=24
    ),
    st.sampled_from(["", " ", "\n", "\n\n", "  two  spaces ", "\tx\n", "naïve – 日本語 🎉"]),
)


@st.composite
def assistant_turns(draw, max_calls: int = 2) -> tuple[str, int]:
    """Assistant text with optional <think> and 0-``max_calls`` Hermes tool calls, and the count."""
    parts = [f"<think>\n{draw(texts)}\n</think>\n\n"] if draw(st.booleans()) else []
    parts.append(draw(texts))
    calls = draw(st.integers(0, max_calls))
    for _ in range(calls):
        call = {"name": "calc", "arguments": {"x": draw(texts)}}
        parts.append(f"\n<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>")
    return "".join(parts), calls


@dataclass
class Turn:
    content: str
    truncate: float | None  # fraction of the content's tokens kept, or None: finished normally
    pass_text: bool
    env: list[dict]


@st.composite
def episodes(draw, tools: bool = True) -> tuple[list[dict], list[Turn]]:
    """Reset messages and turns; ``tools=False``: no tool calls, so no tool messages."""
    reset = [{"role": "system", "content": draw(texts)}] if draw(st.booleans()) else []
    reset.append({"role": "user", "content": draw(texts)})
    turns = []
    for _ in range(draw(st.integers(1, 6))):
        content, calls = draw(assistant_turns(2 if tools else 0))
        env = [{"role": "tool", "name": "calc", "content": draw(texts)} for _ in range(calls)]
        if not calls or draw(st.booleans()):
            env += [{"role": "user", "content": draw(texts)}] if draw(st.integers(0, 5)) else []
        truncate = draw(st.none() | st.floats(0.0, 1.0))
        turns.append(Turn(content, truncate, draw(st.booleans()), env))
    if draw(st.booleans()):
        turns[-1].env = None  # the episode ends after the last completion
    return reset, turns


def engine_output(
    tokenizer, turn: Turn, end_of_turn: Callable[[str], int]
) -> tuple[list[int], str]:
    """What a simulated engine emits for ``turn``, and the text of the assistant message."""
    ids = tokenizer.encode(turn.content, add_special_tokens=False)
    if turn.truncate is None:
        return [*ids, end_of_turn(turn.content)], turn.content
    keep = int(len(ids) * turn.truncate)
    while "\ufffd" in tokenizer.decode(ids[:keep]):  # do not stop inside a UTF-8 character
        keep -= 1
    return ids[:keep], tokenizer.decode(ids[:keep])
