"""Is a chat template append-only? Render sample conversations turn by turn and say where not.

A template is *append-only* when, at every point where an engine would generate, the rendered
prompt followed by the generated text is a prefix of every later rendering. Then the ids a
:class:`~agentrl.tokenization.TrajectoryBuilder` accumulates equal a from-scratch render of the
conversation. Renderings between two generation points are not compared: the builder adds all
messages between two assistant turns in one delta (so grouping consecutive tool results in one
turn is fine).

:func:`check_template` renders two sample conversations (with and without a system message; with
tool schemas, tool calls in Hermes format, two tool results in a row, ``<think>`` reasoning in
every assistant turn, three user turns) and, at each generation point, checks:

1. the assistant turn renders as the generation prompt followed by the generated text;
2. the next prompt starts with the rendering through that turn;
3. the builder's delta (rendered after a fixed base, see :mod:`~agentrl.tokenization.chat_format`)
   is exactly the text a from-scratch render adds.

Each failure is a :class:`TemplateIssue` with the first differing snippets and its
:class:`IssueKind`. What this does not cover: behaviours the samples do not trigger (templates that
count beyond three user turns, on dates, or on keys other than role/content/name).
"""

from __future__ import annotations

import enum
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentrl.tokenization.chat_format import SYSTEM_SENTINEL, ChatFormat, Message, TemplateError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REASONING_SENTINEL = "AGENTRL-REASONING"
TOOL_SENTINEL = "AGENTRL-TOOL"

SAMPLE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": f"{TOOL_SENTINEL}: evaluate an arithmetic expression",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


def _call(expression: str) -> str:
    arguments = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>\n{json.dumps(arguments)}\n</tool_call>"


def _thinking(n: int, text: str) -> str:
    return f"<think>\n{REASONING_SENTINEL}-{n}\n</think>\n\n{text}"


_TURNS: list[Message] = [
    {"role": "user", "content": "AGENTRL-USER-1: what are 2+2 and 3*3?"},
    {"role": "assistant", "content": _thinking(1, f"{_call('2+2')}\n{_call('3*3')}")},
    {"role": "tool", "name": "calculator", "content": "4"},
    {"role": "tool", "name": "calculator", "content": "9"},
    {"role": "assistant", "content": _thinking(2, "4 and 9.")},
    {"role": "user", "content": "AGENTRL-USER-2: and 5-1?"},
    {"role": "assistant", "content": _thinking(3, _call("5-1"))},
    {"role": "tool", "name": "calculator", "content": "4"},
    {"role": "assistant", "content": _thinking(4, "Also 4.")},
    {"role": "user", "content": "AGENTRL-USER-3: thanks!"},
    {"role": "assistant", "content": _thinking(5, "You're welcome.")},
]
SAMPLE_CONVERSATIONS: dict[str, list[Message]] = {
    "with_system": [{"role": "system", "content": f"{SYSTEM_SENTINEL}: be brief."}, *_TURNS],
    "without_system": _TURNS,
}


class IssueKind(enum.StrEnum):
    """Why a rendering is not a prefix of the next one."""

    SYSTEM_MOVED = "system_moved"  # the system prompt moved into (or out of) a user turn
    REASONING_DROPPED = "reasoning_dropped"  # earlier <think> blocks are removed
    ASSISTANT_REWRITTEN = "assistant_rewritten"  # turn != generation prompt + generated text
    CONTEXT_DEPENDENT_DELTA = "context_dependent_delta"  # delta after a fixed base is different
    OTHER = "other"


@dataclass(frozen=True)
class TemplateIssue:
    """One failed check: at the generation point of ``message_index`` in ``conversation``."""

    kinds: tuple[IssueKind, ...]
    conversation: str
    message_index: int
    detail: str
    earlier: str  # snippet around the first difference, in the text that should be a prefix
    later: str  # the same place in the later text


@dataclass(frozen=True)
class TemplateReport:
    """The checker's verdict. ``ok``: append-only and token-exact deltas; builders accept it."""

    end_of_turn_tokens: tuple[str, ...] = ()
    generation_prompt: str = ""
    renders_tools: bool = False
    issues: tuple[TemplateIssue, ...] = ()
    error: str | None = None

    @property
    def append_only(self) -> bool:
        delta_only = (IssueKind.CONTEXT_DEPENDENT_DELTA,)
        return self.error is None and all(issue.kinds == delta_only for issue in self.issues)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.issues

    @property
    def kinds(self) -> set[IssueKind]:
        return {kind for issue in self.issues for kind in issue.kinds}

    def describe(self) -> str:
        """One line per problem (empty when ``ok``)."""
        lines = [f"error: {self.error}"] if self.error else []
        for issue in self.issues:
            kinds = ", ".join(kind.value for kind in issue.kinds)
            lines.append(
                f"[{kinds}] {issue.conversation}, message {issue.message_index}: {issue.detail}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "append_only": self.append_only,
            "end_of_turn_tokens": list(self.end_of_turn_tokens),
            "generation_prompt": self.generation_prompt,
            "renders_tools": self.renders_tools,
            "error": self.error,
            "issues": [
                {**issue.__dict__, "kinds": [kind.value for kind in issue.kinds]}
                for issue in self.issues
            ],
        }


_reports: weakref.WeakKeyDictionary[ChatFormat, TemplateReport] = weakref.WeakKeyDictionary()


def check_template(
    template: PreTrainedTokenizerBase | ChatFormat, chat_template: str | None = None
) -> TemplateReport:
    """Check a tokenizer's template (or ``chat_template`` on that tokenizer, or a :class:`ChatFormat`).

    Never raises for a bad template: a template the builder cannot use at all gets ``error``.
    Reports for a :class:`ChatFormat` are cached on it.
    """
    if isinstance(template, ChatFormat):
        fmt = template
    else:
        try:
            fmt = ChatFormat.of(template, chat_template)
        except Exception as error:  # any template failure is a verdict, not a crash
            return TemplateReport(error=f"{type(error).__name__}: {error}")
    if fmt not in _reports:
        try:
            _reports[fmt] = _check(fmt)
        except Exception as error:
            _reports[fmt] = TemplateReport(error=f"{type(error).__name__}: {error}")
    return _reports[fmt]


def _check(fmt: ChatFormat) -> TemplateReport:
    issues: list[TemplateIssue] = []
    for name, conversation in SAMPLE_CONVERSATIONS.items():
        issues.extend(_check_conversation(fmt, name, conversation))
    first_user = [_TURNS[0]]
    bare = fmt.render(first_user)
    prompt = fmt.render(first_user, add_generation_prompt=True)
    with_tools = fmt.render(SAMPLE_CONVERSATIONS["with_system"][:2], SAMPLE_TOOLS)
    return TemplateReport(
        end_of_turn_tokens=tuple(
            fmt.tokenizer.convert_ids_to_tokens(i) for i in sorted(fmt.end_of_turn_ids)
        ),
        generation_prompt=prompt[_first_difference(bare, prompt) :],
        renders_tools=TOOL_SENTINEL in with_tools,
        issues=tuple(issues),
    )


def _check_conversation(
    fmt: ChatFormat, name: str, conversation: Sequence[Message]
) -> list[TemplateIssue]:
    issues: list[TemplateIssue] = []
    tools = SAMPLE_TOOLS
    previous: tuple[int, str, int | None] | None = None  # (index, rendering through it, cut)
    for i, message in enumerate(conversation):
        if message["role"] != "assistant":
            continue
        prompt = fmt.render(conversation[:i], tools, add_generation_prompt=True)
        if previous is not None:
            j, turn_text, cut = previous
            if not prompt.startswith(turn_text):
                detail = (
                    f"the prompt for message {i} re-renders the conversation through message {j}"
                )
                issues.append(_issue(name, i, detail, turn_text, prompt, "prompt"))
            elif cut is not None:
                try:
                    built = turn_text[:cut] + fmt.delta_text(conversation[j + 1 : i], tools)
                except TemplateError as error:
                    built = turn_text[:cut] + f"<{error}>"
                if built != prompt:
                    detail = f"the delta for messages {j + 1}..{i - 1} differs from a full render"
                    issues.append(_issue(name, i, detail, built, prompt, "delta"))
        content = message["content"]
        turn_text = fmt.render(conversation[: i + 1], tools)
        cut = None
        if not turn_text.startswith(prompt + content):
            detail = f"message {i} is not rendered as its generation prompt + generated text"
            issues.append(_issue(name, i, detail, prompt + content, turn_text, "turn"))
        else:
            closing = fmt.closing_text(content, tools)
            cut = len(prompt) + len(content) + len(closing)
            if turn_text[len(prompt) + len(content) : cut] != closing:
                detail = f"message {i} is closed differently than after the fixed base"
                expected = prompt + content + closing
                issues.append(_issue(name, i, detail, expected, turn_text, "delta"))
                cut = None
        previous = (i, turn_text, cut)
    return issues


def _issue(
    conversation: str,
    index: int,
    detail: str,
    earlier: str,
    later: str,
    stage: Literal["turn", "prompt", "delta"],
) -> TemplateIssue:
    """Classify a failed check: ``earlier`` should have been a prefix of ``later``."""
    at = _first_difference(earlier, later)
    kinds: list[IssueKind] = []
    if stage == "delta":
        kinds.append(IssueKind.CONTEXT_DEPENDENT_DELTA)
    else:
        if earlier.count(REASONING_SENTINEL) > later.count(REASONING_SENTINEL):
            kinds.append(IssueKind.REASONING_DROPPED)
        if earlier.find(SYSTEM_SENTINEL) != later.find(SYSTEM_SENTINEL):
            kinds.append(IssueKind.SYSTEM_MOVED)
        if not kinds:
            kinds.append(IssueKind.ASSISTANT_REWRITTEN if stage == "turn" else IssueKind.OTHER)
    window = slice(max(0, at - 40), at + 80)
    return TemplateIssue(
        kinds=tuple(kinds),
        conversation=conversation,
        message_index=index,
        detail=f"{detail} (first difference at character {at})",
        earlier=earlier[window],
        later=later[window],
    )


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
