"""Tool-call parsers: turn an assistant's text into tool calls, and tool calls back into text.

Two formats are supported:

* :class:`HermesParser` -- the Hermes/Qwen format, a JSON object inside tags::

      <tool_call>
      {"name": "search", "arguments": {"query": "capital of France"}}
      </tool_call>

* :class:`TagParser` -- one tag per tool whose content is the single argument::

      <python>
      print(1 + 1)
      </python>

Contract shared by both parsers:

* ``parse(text)`` never raises, for any ``str``. A malformed call becomes a :class:`ToolCallError`
  whose message says what is wrong and how a correct call looks; it is meant to be shown to the
  agent as an observation.
* Calls are found left to right and keep their order. ``raw`` is the exact substring of ``text``
  the call (or error) came from, tags included.
* The closing tag that ends a call is the *first* matching closing tag after the opening tag, so a
  call's content can never contain its own closing tag (``format`` refuses or escapes it).
* An opening tag without a closing tag is an "unterminated" error whose ``raw`` runs to the end of
  the text: nothing after it is parsed, so a truncated generation never yields a call it did not
  finish writing.
* ``format(call)`` is the inverse: ``parse(format(call))`` gives back ``call``'s name and arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call: the tool's name, its arguments, and the text it was parsed from."""

    name: str
    arguments: dict[str, Any]
    raw: str = ""


@dataclass(frozen=True)
class ToolCallError:
    """A malformed tool call, reported back to the agent; ``message`` says how to fix it."""

    message: str
    raw: str


@dataclass(frozen=True)
class ParseResult:
    """Everything found in one assistant message.

    ``text`` is the message with every call and error (their ``raw`` substrings) removed.
    """

    calls: list[ToolCall]
    errors: list[ToolCallError]
    text: str = ""


@runtime_checkable
class ToolCallParser(Protocol):
    """Reads tool calls out of model text (never raising) and writes them the way a model should."""

    def parse(self, text: str) -> ParseResult: ...

    def format(self, call: ToolCall) -> str: ...


@dataclass(frozen=True)
class _Span:
    """A tagged region of the text; ``body`` is None when the opening tag is never closed."""

    tag: str
    start: int
    end: int
    body: str | None

    def raw(self, text: str) -> str:
        return text[self.start : self.end]


def _find_spans(text: str, open_tag: re.Pattern[str]) -> Iterator[_Span]:
    """Yield the tagged regions of ``text`` in order; ``open_tag`` captures the tag name."""
    position = 0
    while (opening := open_tag.search(text, position)) is not None:
        tag = opening.group(1)
        close = f"</{tag}>"
        close_at = text.find(close, opening.end())
        if close_at < 0:
            yield _Span(tag, opening.start(), len(text), None)
            return
        position = close_at + len(close)
        yield _Span(tag, opening.start(), position, text[opening.end() : close_at])


def _parse_spans(
    text: str,
    open_tag: re.Pattern[str],
    interpret: Callable[[_Span, str], ToolCall | ToolCallError],
) -> ParseResult:
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    outside: list[str] = []
    position = 0
    for span in _find_spans(text, open_tag):
        outside.append(text[position : span.start])
        position = span.end
        found = interpret(span, text)
        if isinstance(found, ToolCall):
            calls.append(found)
        else:
            errors.append(found)
    outside.append(text[position:])
    return ParseResult(calls, errors, "".join(outside))


class HermesParser:
    """The Hermes/Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    Any number of calls may appear in one text. ``arguments`` may be omitted (meaning ``{}``) or
    given as a JSON-encoded string of an object (a Qwen quirk), which is decoded. Errors: invalid
    JSON (with the decoder's message and position), a value that is not an object, a missing or
    non-string ``name``, ``arguments`` that is not an object, and an unterminated ``<tool_call>``.
    """

    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"
    EXAMPLE = (
        '<tool_call>\n{"name": "<tool name>", "arguments": {"<argument>": <value>}}\n</tool_call>'
    )

    _open_tag = re.compile(r"<(tool_call)>")

    def parse(self, text: str) -> ParseResult:
        """Find every ``<tool_call>`` block in ``text``; never raises."""
        return _parse_spans(text, self._open_tag, self._interpret)

    def format(self, call: ToolCall) -> str:
        """Write ``call`` as a model should (Qwen's layout: the JSON on its own line).

        Every ``</`` inside the JSON is written ``<\\/`` (a legal JSON escape), so argument strings
        that contain ``</tool_call>`` still round-trip. Raises ``TypeError``/``ValueError`` if the
        arguments are not JSON-serialisable (NaN and infinities included).
        """
        payload = json.dumps(
            {"name": call.name, "arguments": call.arguments}, ensure_ascii=False, allow_nan=False
        ).replace("</", "<\\/")
        return f"{self.OPEN}\n{payload}\n{self.CLOSE}"

    def structural_tag(self, tools: list[dict[str, Any]], name: str | None = None) -> str:
        """An xgrammar structural tag (JSON text) under which a model can only write calls in this
        format: one or more (``name`` None: OpenAI's ``tool_choice="required"``) or exactly one call
        of the tool ``name`` (a named ``tool_choice``), nothing before the first; each call's
        arguments are a JSON object, valid under the tool's ``parameters`` when the tool is
        ``"strict": true`` (OpenAI's rule: without ``strict`` the schema is not enforced). It is
        xgrammar's own tag for this layout (its ``qwen_3`` format, reasoning off), which
        :meth:`format` writes and :meth:`parse` reads. ``tools`` are OpenAI's tool objects."""
        import xgrammar as xgr

        shaped: list[Any] = []
        for tool in tools:
            function = dict(tool["function"])
            if not function.get("strict"):
                function["parameters"] = {"type": "object"}
            shaped.append({"type": "function", "function": function})
        choice: Any = (
            "required" if name is None else {"type": "function", "function": {"name": name}}
        )
        tag = xgr.get_builtin_structural_tag(
            "qwen_3", tools=shaped, tool_choice=choice, reasoning=False
        )
        return tag.model_dump_json()

    def _interpret(self, span: _Span, text: str) -> ToolCall | ToolCallError:
        raw = span.raw(text)
        if span.body is None:
            return self._error(f"unterminated {self.OPEN}: no {self.CLOSE} follows it", raw)
        try:
            payload = json.loads(span.body)
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno} column {exc.colno} (char {exc.pos})"
            return self._error(f"invalid JSON in {self.OPEN}: {exc.msg} at {where}", raw)
        except (ValueError, RecursionError) as exc:  # e.g. integers too long, nesting too deep
            return self._error(f"invalid JSON in {self.OPEN}: {exc}", raw)
        if not isinstance(payload, dict):
            kind = type(payload).__name__
            return self._error(f"the {self.OPEN} content must be a JSON object, got {kind}", raw)
        name = payload.get("name")
        if not isinstance(name, str):
            problem = "is missing" if name is None else f"must be a string, got {name!r}"
            return self._error(f'"name" {problem}', raw)
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):
            arguments = _decode_object(arguments)
        if not isinstance(arguments, dict):
            return self._error(f'"arguments" of {name!r} must be a JSON object', raw)
        return ToolCall(name, arguments, raw)

    def _error(self, problem: str, raw: str) -> ToolCallError:
        return ToolCallError(f"{problem}. A tool call looks like:\n{self.EXAMPLE}", raw)


def _decode_object(encoded: str) -> dict[str, Any] | None:
    """Decode a JSON-encoded object (Qwen sometimes double-encodes arguments); None otherwise."""
    try:
        decoded = json.loads(encoded)
    except (ValueError, RecursionError):
        return None
    return decoded if isinstance(decoded, dict) else None


_TAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class TagParser:
    """One tag per tool: ``<python>1</python>`` gives ``ToolCall("python", {"code": "1"})``.

    ``tags`` maps a tag name to the name of the single (string) argument its content fills, e.g.
    ``TagParser({"python": "code", "search": "query", "answer": "answer"})``. Tags are matched
    exactly (case-sensitive, no attributes); tags not in the mapping are plain text.

    Content is taken verbatim except that one leading and one trailing newline are stripped, so
    ``<python>\\ncode\\n</python>`` gives ``code``. A tag ends at the first closing tag of the same
    name: ``<a>x<a>y</a>z</a>`` is the call ``a(x<a>y)`` followed by the text ``z</a>``. Content may
    contain other tags, which are not parsed. The only error is an unterminated tag.
    """

    tags: Mapping[str, str]
    _open_tag: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tags:
            raise ValueError("TagParser needs at least one tag")
        for tag in self.tags:
            if not _TAG_NAME.fullmatch(tag):
                raise ValueError(f"tag name {tag!r} must match {_TAG_NAME.pattern}")
        object.__setattr__(self, "tags", dict(self.tags))
        alternatives = "|".join(re.escape(tag) for tag in self.tags)
        object.__setattr__(self, "_open_tag", re.compile(f"<({alternatives})>"))

    def parse(self, text: str) -> ParseResult:
        """Find every mapped tag in ``text``; never raises."""
        return _parse_spans(text, self._open_tag, self._interpret)

    def format(self, call: ToolCall) -> str:
        """Write ``call`` as a tag, on separate lines when the content has a newline.

        Raises ``ValueError`` if the tool is not mapped, the arguments are not exactly the mapped
        argument as a string, or the content contains the closing tag (it cannot be written).
        """
        argument = self.tags.get(call.name)
        if argument is None:
            raise ValueError(f"no tag for tool {call.name!r}; tags: {sorted(self.tags)}")
        content = call.arguments.get(argument)
        if set(call.arguments) != {argument} or not isinstance(content, str):
            raise ValueError(f"<{call.name}> takes exactly one string argument {argument!r}")
        close = f"</{call.name}>"
        if close in content:
            raise ValueError(f"the content of <{call.name}> cannot contain {close}")
        if "\n" in content:
            return f"<{call.name}>\n{content}\n{close}"
        return f"<{call.name}>{content}{close}"

    def _interpret(self, span: _Span, text: str) -> ToolCall | ToolCallError:
        raw = span.raw(text)
        if span.body is None:
            example = f"<{span.tag}>\n...\n</{span.tag}>"
            message = f"unterminated <{span.tag}>: no </{span.tag}> follows it. Write:\n{example}"
            return ToolCallError(message, raw)
        content = span.body.removeprefix("\n").removesuffix("\n")
        return ToolCall(span.tag, {self.tags[span.tag]: content}, raw)
