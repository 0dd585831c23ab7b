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

import datetime
import enum
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentrl.tokenization.chat_format import (
    ASSISTANT_SENTINEL,
    SYSTEM_SENTINEL,
    ChatFormat,
    Message,
    TemplateError,
)
from agentrl.tokenization.token_trajectory import SeamEdit, SeamPolicy, UncheckedTrajectoryBuilder

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


_END = {"role": "user", "content": "AGENTRL-USER-END: bye."}
_SYSTEM_MESSAGE = {"role": "system", "content": f"{SYSTEM_SENTINEL}: be brief."}
_TURNS: list[Message] = [
    {"role": "user", "content": "AGENTRL-USER-1: what are 2+2 and 3*3?"},
    {"role": "assistant", "content": _thinking(1, f"{_call('2+2')}\n{_call('3*3')}")},
    {"role": "tool", "name": "calculator", "content": "4"},
    {"role": "tool", "name": "calculator", "content": "9"},
    {"role": "assistant", "content": _thinking(2, "4 and 9.")},
    {"role": "user", "content": "AGENTRL-USER-2: and 5-1?"},
    {"role": "assistant", "content": _thinking(3, _call("5-1"))},
    {"role": "tool", "name": "calculator", "content": "4"},
    {"role": "assistant", "content": _thinking(4, "Also 4.\n")},  # engines end with newlines
    {"role": "user", "content": "AGENTRL-USER-3: thanks!"},
    {"role": "assistant", "content": _thinking(5, "You're welcome.")},
    _END,
]
_PLAIN_TURNS: list[Message] = [
    {"role": "user", "content": "AGENTRL-USER-1: what is 2+2?"},
    {"role": "assistant", "content": _thinking(1, "4.")},
    {"role": "user", "content": "AGENTRL-USER-2: and 5-1?"},
    {"role": "assistant", "content": "Also 4.\n"},
    {"role": "user", "content": "AGENTRL-USER-3: thanks!"},
    {"role": "assistant", "content": _thinking(3, "You're welcome.")},
    _END,
]
_NO_REPLY_TURNS: list[Message] = [
    {"role": "user", "content": "AGENTRL-USER-1: count to two, one turn per number."},
    {"role": "assistant", "content": _thinking(1, "One.")},
    {"role": "assistant", "content": "Two.\n"},
    {"role": "user", "content": "AGENTRL-USER-2: thanks!"},
    {"role": "assistant", "content": "You're welcome."},
    _END,
]


@dataclass(frozen=True)
class _Use:
    description: str
    tools: list[dict] | None
    conversations: dict[str, list[Message]]


USES: dict[str, _Use] = {
    "tools": _Use(
        "with tool schemas, Hermes tool calls, two tool results in a row, reasoning, user turns",
        SAMPLE_TOOLS,
        {"with_system": [_SYSTEM_MESSAGE, *_TURNS], "without_system": _TURNS},
    ),
    "plain": _Use(
        "without tools: user and assistant turns, with and without reasoning",
        None,
        {"with_system": [_SYSTEM_MESSAGE, *_PLAIN_TURNS], "without_system": _PLAIN_TURNS},
    ),
    "no_reply": _Use(
        "an environment step that returns no messages (two assistant turns in a row)",
        None,
        {"no_reply": _NO_REPLY_TURNS},
    ),
}
"""The uses a template is checked for, and their sample conversations (each ends with a user
message, so every assistant turn is followed by a generation point)."""
SAMPLE_CONVERSATIONS: dict[str, list[Message]] = USES["tools"].conversations
CHECK_INSTANT = datetime.datetime(2025, 7, 14, 9, 26, 53)
"""The time the checker's renders see; time dependence is tested with a second, later instant."""
_OTHER_INSTANT = datetime.datetime(2031, 2, 3, 23, 59, 59)


class Verdict(enum.StrEnum):
    """What the builder's ids are, compared with a full render, for one use (by severity).

    * ``APPEND_ONLY``: at every generation point of every sample conversation the ids the builder
      holds equal ``encode(render(conversation so far, add_generation_prompt=True))``, with an
      engine that emits the tokenizer's own encoding of its text.
    * ``TOKEN_SEAMS``: the builder's ids decode to exactly the rendered text, but the tokenizer
      splits some stretch differently in a full encode (a generation prompt that merges with the
      generated text). Training is consistent (the trainer scores the ids the engine saw); a
      re-render finds other ids at the seams. ``seams="reencode"`` re-encodes them.
    * ``NOT_APPEND_ONLY``: a full render writes other text (earlier reasoning dropped, the system
      prompt moved...). The builder keeps what the engine saw (policy ``keep``) or refuses.
    * ``UNUSABLE``: the template raises for the roles the use needs, or cannot give deltas at all.
    """

    APPEND_ONLY = "append_only"
    TOKEN_SEAMS = "token_seams"
    NOT_APPEND_ONLY = "not_append_only"
    UNUSABLE = "unusable"

    @property
    def severity(self) -> int:
        return list(Verdict).index(self)


class IssueKind(enum.StrEnum):
    """Why a rendering is not a prefix of the next one."""

    SYSTEM_MOVED = "system_moved"  # the system prompt moved into (or out of) a user turn
    TOOLS_MOVED = "tools_moved"  # the tool schemas moved (e.g. written before the last user turn)
    WHITESPACE_CHANGED = "whitespace_changed"  # only whitespace differs (a template that trims)
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
class TokenSeam:
    """Where the builder's ids and a full encode differ although the text is equal.

    At the generation point of ``message_index`` in ``conversation``: the builder holds
    ``built`` (token strings) at ``position`` where a full render has ``rendered``.
    ``engine_tokens``: how many of the built ids there are the engine's (sampled, in the loss).
    """

    conversation: str
    message_index: int
    position: int
    built: tuple[str, ...]
    rendered: tuple[str, ...]
    text: str
    engine_tokens: int

    def describe(self, also: int = 0) -> str:
        """One line; ``also``: how many more generation points have the same seam."""
        where = f"{self.conversation}, message {self.message_index}, token {self.position}"
        more = f" and {also} more generation points" if also else ""
        return (
            f"{self.text!r} is {list(self.built)} in the trajectory, {list(self.rendered)} in a "
            f"full encode ({self.engine_tokens} of them sampled by the engine); at {where}{more}"
        )


def group_seams(seams: Sequence[TokenSeam]) -> list[tuple[TokenSeam, int]]:
    """Seams with the same ids on both sides, as (first occurrence, number of others)."""
    groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[TokenSeam]] = {}
    for seam in seams:
        groups.setdefault((seam.built, seam.rendered), []).append(seam)
    return [(group[0], len(group) - 1) for group in groups.values()]


@dataclass(frozen=True)
class UseReport:
    """The verdict for one use (see :data:`USES`), with what it rests on."""

    name: str
    verdict: Verdict
    issues: tuple[TemplateIssue, ...] = ()
    seams: tuple[TokenSeam, ...] = ()
    reencode_exact: bool = True  # with seams="reencode" the builder's ids equal the renders
    error: str | None = None
    conversations: tuple[tuple[str, Verdict], ...] = ()  # the verdict of each sample conversation

    def verdict_for(self, system: bool | None = None) -> Verdict:
        """The verdict for episodes that start with a system message (``system=True``) or
        without one; ``None``: the use's verdict (the most severe)."""
        if system is None:
            return self.verdict
        name = "with_system" if system else "without_system"
        return next((v for c, v in self.conversations if c == name), self.verdict)

    def describe(self) -> str:
        lines = [f"{self.name}: {self.verdict.value}"]
        if self.error:
            lines.append(f"  error: {self.error}")
        for issue in self.issues:
            kinds = ", ".join(kind.value for kind in issue.kinds)
            lines.append(
                f"  [{kinds}] {issue.conversation}, message {issue.message_index}: {issue.detail}"
            )
        for seam, also in group_seams(self.seams):
            lines.append(f"  [token_seam] {seam.describe(also)}")
        if self.seams and not self.reencode_exact:
            lines.append("  seams='reencode' does not make every id equal a full render")
        return "\n".join(lines)


@dataclass(frozen=True)
class TemplateReport:
    """The checker's verdicts, one per use, and facts about the template.

    ``time_dependent``: renders change with the clock (``clock_formats``: the ``strftime_now``
    formats it calls); builders render each episode at its start, so this is not a problem.
    """

    end_of_turn_tokens: tuple[str, ...] = ()
    generation_prompt: str = ""
    renders_tools: bool = False
    time_dependent: bool = False
    clock_formats: tuple[str, ...] = ()
    uses: tuple[UseReport, ...] = ()
    error: str | None = None

    def use(self, name: str) -> UseReport | None:
        return next((u for u in self.uses if u.name == name), None)

    def verdict(self, uses: Sequence[str] | None = None, system: bool | None = None) -> Verdict:
        """The most severe verdict over ``uses`` (default: all), for episodes with or without a
        system message (``system``; default: both); ``UNUSABLE`` on an error."""
        if self.error is not None:
            return Verdict.UNUSABLE
        chosen = [u.verdict_for(system) for u in self.uses if uses is None or u.name in uses]
        return max(chosen, key=lambda v: v.severity, default=Verdict.UNUSABLE)

    @property
    def ok(self) -> bool:
        """Append-only for every use: builders accept it silently."""
        return self.verdict() is Verdict.APPEND_ONLY

    @property
    def issues(self) -> tuple[TemplateIssue, ...]:
        return tuple(issue for u in self.uses for issue in u.issues)

    @property
    def seams(self) -> tuple[TokenSeam, ...]:
        return tuple(seam for u in self.uses for seam in u.seams)

    @property
    def kinds(self) -> set[IssueKind]:
        return {kind for issue in self.issues for kind in issue.kinds}

    def describe(self, use: str | None = None) -> str:
        """One line per problem, for ``use`` or all (empty when append-only)."""
        lines = [f"error: {self.error}"] if self.error else []
        for u in self.uses:
            if (use is None or u.name == use) and u.verdict is not Verdict.APPEND_ONLY:
                lines.append(u.describe())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict().value,
            "end_of_turn_tokens": list(self.end_of_turn_tokens),
            "generation_prompt": self.generation_prompt,
            "renders_tools": self.renders_tools,
            "time_dependent": self.time_dependent,
            "clock_formats": list(self.clock_formats),
            "error": self.error,
            "uses": {
                u.name: {
                    "verdict": u.verdict.value,
                    "conversations": {c: v.value for c, v in u.conversations},
                    "error": u.error,
                    "reencode_exact": u.reencode_exact,
                    "issues": [
                        {**issue.__dict__, "kinds": [kind.value for kind in issue.kinds]}
                        for issue in u.issues
                    ],
                    "seams": [
                        {
                            **seam.__dict__,
                            "built": list(seam.built),
                            "rendered": list(seam.rendered),
                        }
                        for seam in u.seams
                    ],
                }
                for u in self.uses
            },
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
    uses = tuple(_check_use(fmt, name, use) for name, use in USES.items())
    now = CHECK_INSTANT
    first_user = [_TURNS[0]]
    tools = None if _try_render(fmt, first_user, None, now) is not None else SAMPLE_TOOLS
    bare = fmt.render(first_user, tools, now=now)
    prompt = fmt.render(first_user, tools, add_generation_prompt=True, now=now)
    with_tools = _try_render(fmt, SAMPLE_CONVERSATIONS["with_system"][:2], SAMPLE_TOOLS, now)
    time_dependent = fmt.reads_clock and any(
        _try_render(fmt, sample, use.tools, now)
        != _try_render(fmt, sample, use.tools, _OTHER_INSTANT)
        for use in USES.values()
        for sample in use.conversations.values()
    )
    return TemplateReport(
        end_of_turn_tokens=tuple(
            str(fmt.tokenizer.convert_ids_to_tokens(i)) for i in sorted(fmt.end_of_turn_ids)
        ),
        generation_prompt=prompt[_first_difference(bare, prompt) :],
        renders_tools=with_tools is not None and TOOL_SENTINEL in with_tools,
        time_dependent=time_dependent,
        clock_formats=fmt.clock_formats,
        uses=uses,
    )


def _try_render(
    fmt: ChatFormat, messages: Sequence[Message], tools: Any, now: datetime.datetime
) -> str | None:
    try:
        return fmt.render(messages, tools, add_generation_prompt=True, now=now)
    except Exception:
        return None


def _check_use(fmt: ChatFormat, name: str, use: _Use) -> UseReport:
    issues: list[TemplateIssue] = []
    seams: list[TokenSeam] = []
    verdicts: list[tuple[str, Verdict]] = []
    errors: list[str] = []
    exact = True
    try:
        fmt.closing_text(ASSISTANT_SENTINEL, use.tools, now=CHECK_INSTANT)
    except TemplateError as error:  # no fixed base conversation: no delta can be rendered
        unusable = tuple((c, Verdict.UNUSABLE) for c in use.conversations)
        return UseReport(
            name,
            Verdict.UNUSABLE,
            error=f"no delta can be rendered: {error}",
            conversations=unusable,
        )
    for conversation_name, conversation in use.conversations.items():
        # the renders an episode needs: every generation point, and the whole conversation
        points = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
        try:
            for end in [*points, len(conversation)]:
                fmt.render(
                    conversation[:end], use.tools, add_generation_prompt=True, now=CHECK_INSTANT
                )
        except Exception as error:
            detail = f"{conversation_name}, messages 0..{end - 1}: {type(error).__name__}: {error}"
            errors.append(f"the template raises for {detail}")
            verdicts.append((conversation_name, Verdict.UNUSABLE))
            continue
        text_issues = _check_conversation(fmt, conversation_name, conversation, use.tools)
        found, new_seams, reencode_exact = _simulate(
            fmt, conversation_name, conversation, use.tools
        )
        issues.extend(text_issues or found)
        seams.extend(new_seams)
        exact = exact and reencode_exact
        if text_issues or found:
            verdicts.append((conversation_name, Verdict.NOT_APPEND_ONLY))
        elif new_seams or not reencode_exact:
            verdicts.append((conversation_name, Verdict.TOKEN_SEAMS))
        else:
            verdicts.append((conversation_name, Verdict.APPEND_ONLY))
    verdict = max((v for _, v in verdicts), key=lambda v: v.severity)
    return UseReport(
        name,
        verdict,
        tuple(issues),
        tuple(seams),
        exact,
        "; ".join(errors) or None,
        tuple(verdicts),
    )


def _simulate(
    fmt: ChatFormat, name: str, conversation: Sequence[Message], tools: Any
) -> tuple[list[TemplateIssue], list[TokenSeam], bool]:
    """Build the conversation with two unchecked builders (``seams`` keep and reencode; a
    :class:`~agentrl.tokenization.TrajectoryBuilder` would ask this checker), an engine that
    emits the tokenizer's encoding of each assistant turn, and compare their ids with a full
    encode at every generation point. Returns text issues, seams, and whether reencode is exact."""
    now = CHECK_INSTANT
    points = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    points.append(len(conversation))
    first = conversation[: points[0]]
    keep = UncheckedTrajectoryBuilder(fmt, first, tools, now=now, seams=SeamPolicy.KEEP)
    fixed = UncheckedTrajectoryBuilder(fmt, first, tools, now=now, seams=SeamPolicy.REENCODE)
    seams: list[TokenSeam] = []
    exact = True
    reported = 0
    previous = None
    for point in points:
        if previous is not None:
            new = conversation[previous + 1 : point]
            try:
                keep.add_messages(new)
                fixed.add_messages(new)
            except TemplateError as error:
                detail = f"the builder cannot add messages {previous + 1}..{point - 1}: {error}"
                return [_issue(name, point, detail, "", str(error), "delta")], seams, exact
        rendered = fmt.render(conversation[:point], tools, add_generation_prompt=True, now=now)
        expected = fmt.encode(rendered)
        built = keep.prompt_ids()
        if built != expected:
            text = fmt.decode(built)
            if text != rendered:
                detail = "the builder's text differs from a full render"
                return [_issue(name, point, detail, text, rendered, "prompt")], seams, exact
            edits = fixed.trajectory.seams[reported:]
            reported += len(edits)
            repaired = fixed.prompt_ids()
            for edit in edits:
                seams.append(_seam(fmt, name, point, edit, repaired, expected))
            if repaired != expected:
                exact = False
                if not edits:
                    at = _first_difference(built, expected)
                    seams.append(_unexplained_seam(fmt, name, point, at, built, expected))
        if point == len(conversation):
            break
        content = conversation[point]["content"]
        try:
            ids = fmt.encode(content + fmt.closing_text(content, tools, now=now))
        except TemplateError as error:
            detail = f"message {point} has no fixed closing: {error}"
            return [_issue(name, point, detail, "", str(error), "delta")], seams, exact
        for builder in (keep, fixed):
            builder.add_completion(ids, [0.0] * len(ids), 0, text=content)
        previous = point
    return [], seams, exact


def _seam(
    fmt: ChatFormat, name: str, point: int, edit: SeamEdit, built: list[int], expected: list[int]
) -> TokenSeam:
    tokens = fmt.tokenizer.convert_ids_to_tokens
    return TokenSeam(
        conversation=name,
        message_index=point,
        position=edit.start,
        built=tuple(tokens(list(edit.replaced))),
        rendered=tuple(tokens(built[edit.start : edit.end])),
        text=fmt.decode(built[edit.start : edit.end]),
        engine_tokens=edit.engine_tokens,
    )


def _unexplained_seam(
    fmt: ChatFormat, name: str, point: int, at: int, built: list[int], expected: list[int]
) -> TokenSeam:
    tokens = fmt.tokenizer.convert_ids_to_tokens
    return TokenSeam(
        conversation=name,
        message_index=point,
        position=at,
        built=tuple(tokens(built[at : at + 3])),
        rendered=tuple(tokens(expected[at : at + 3])),
        text=fmt.decode(built[at : at + 3]),
        engine_tokens=0,
    )


def _check_conversation(
    fmt: ChatFormat, name: str, conversation: Sequence[Message], tools: Any
) -> list[TemplateIssue]:
    """The text checks of the module docstring, which name why a template re-renders."""
    issues: list[TemplateIssue] = []
    now = CHECK_INSTANT
    previous: tuple[int, str, int | None] | None = None  # (index, text through its closing, cut)
    for i in range(len(conversation) + 1):  # the last generation point follows the last message
        if i < len(conversation) and conversation[i]["role"] != "assistant":
            continue
        prompt = fmt.render(conversation[:i], tools, add_generation_prompt=True, now=now)
        if previous is not None:
            j, turn_text, cut = previous
            if not prompt.startswith(turn_text):
                detail = (
                    f"the prompt for message {i} re-renders the conversation through message {j}"
                )
                issues.append(_issue(name, i, detail, turn_text, prompt, "prompt"))
            elif cut is not None:
                try:
                    delta = fmt.delta_text(conversation[j + 1 : i], tools, now=now)
                    built = turn_text[:cut] + delta
                except TemplateError as error:
                    built = turn_text[:cut] + f"<{error}>"
                if built != prompt:
                    detail = f"the delta for messages {j + 1}..{i - 1} differs from a full render"
                    issues.append(_issue(name, i, detail, built, prompt, "delta"))
        if i == len(conversation):
            break
        content = conversation[i]["content"]
        # the turn as rendered when the next message follows it (some templates close a turn
        # only then, some append a generation header to every render)
        following = conversation[i + 1 : i + 2] or [_END]
        turn_text = fmt.render(
            [*conversation[: i + 1], *following], tools, add_generation_prompt=True, now=now
        )
        cut = None
        if not turn_text.startswith(prompt + content):
            detail = f"message {i} is not rendered as its generation prompt + generated text"
            issues.append(_issue(name, i, detail, prompt + content, turn_text, "turn"))
            turn_text = prompt + content
        else:
            try:
                closing = fmt.closing_text(content, tools, now=now)
            except TemplateError as error:  # no base conversation stays a prefix
                detail = f"message {i} has no fixed closing: {error}"
                issues.append(_issue(name, i, detail, prompt + content, turn_text, "delta"))
                turn_text = prompt + content
                previous = (i, turn_text, None)
                continue
            cut = len(prompt) + len(content) + len(closing)
            if turn_text[len(prompt) + len(content) : cut] != closing:
                detail = f"message {i} is closed differently than after the fixed base"
                expected = prompt + content + closing
                issues.append(_issue(name, i, detail, expected, turn_text, "delta"))
                cut = None
            turn_text = turn_text[:cut] if cut is not None else prompt + content
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
        if earlier.find(TOOL_SENTINEL) != later.find(TOOL_SENTINEL):
            kinds.append(IssueKind.TOOLS_MOVED)
        if not kinds and _without_space(later).startswith(_without_space(earlier)):
            kinds.append(IssueKind.WHITESPACE_CHANGED)
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


def _without_space(text: str) -> str:
    return "".join(text.split())


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
