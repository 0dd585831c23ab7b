"""Tag-format tool calls with several arguments: one tag per tool, one inner tag per argument.

:class:`~agentrl.tools.parsers.TagParser` fills a tool's single argument with the tag's content.
:class:`ArgTagParser` extends that to tools with several arguments, built from their
:class:`~agentrl.tools.Tool` schemas::

    <bash>ls -la</bash>                                     (one argument: the content)
    <str_replace>
    <path>pkg/mod.py</path>
    <old>return a < b</old>
    <new>return a <= b</new>
    </str_replace>
    <submit></submit>                                        (no arguments)

Inside a multi-argument tool's tag, each argument is ``<name>value</name>``; a value ends at the
first closing tag of its name, and one leading and one trailing newline are stripped, as for
TagParser. Integer and number arguments are converted from their text; text that is not inside an
argument tag must be blank. The same contract as the other parsers: ``parse`` never raises (a
malformed call becomes a :class:`~agentrl.tools.parsers.ToolCallError` that shows the right
form), and ``parse(format(call))`` gives ``call`` back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentrl.tools.parsers import ParseResult, TagParser, ToolCall, ToolCallError
from agentrl.tools.tool import Tool

_BODY = "body"


class ArgTagParser:
    """Tag-format calls of ``tools``; see the module docstring."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self._params: dict[str, list[str]] = {}
        self._types: dict[str, dict[str, str]] = {}
        self._required: dict[str, set[str]] = {}
        for tool in tools:
            properties = tool.parameters.get("properties", {})
            self._params[tool.name] = list(properties)
            self._types[tool.name] = {
                name: str(schema.get("type", "string")) for name, schema in properties.items()
            }
            self._required[tool.name] = set(tool.parameters.get("required", []))
        self._outer = TagParser(dict.fromkeys(self._params, _BODY))

    def parse(self, text: str) -> ParseResult:
        """Every call in ``text``, in order; never raises."""
        outer = self._outer.parse(text)
        calls: list[ToolCall] = []
        errors = list(outer.errors)
        for call in outer.calls:
            parsed = self._arguments(call)
            if isinstance(parsed, ToolCall):
                calls.append(parsed)
            else:
                errors.append(parsed)
        return ParseResult(calls, errors, outer.text)

    def format(self, call: ToolCall) -> str:
        """``call`` in tag form; ``ValueError`` for an unknown tool or unknown arguments."""
        params = self._params.get(call.name)
        if params is None:
            raise ValueError(f"no tag for tool {call.name!r}; tools: {sorted(self._params)}")
        unknown = set(call.arguments) - set(params)
        if unknown:
            raise ValueError(f"tool {call.name!r} has no arguments {sorted(unknown)}")
        if self._single(call.name):
            return self._outer.format(ToolCall(call.name, {_BODY: str(call.arguments[params[0]])}))
        inner = "".join(
            f"\n<{name}>{_text(call.arguments[name])}</{name}>"
            for name in params
            if name in call.arguments
        )
        return f"<{call.name}>{inner}\n</{call.name}>" if inner else f"<{call.name}></{call.name}>"

    def _single(self, tool: str) -> bool:
        """A tool of one argument: the tag's whole content is its value."""
        return len(self._params[tool]) == 1

    def _arguments(self, call: ToolCall) -> ToolCall | ToolCallError:
        body: str = call.arguments[_BODY]
        params = self._params[call.name]
        if self._single(call.name):
            return ToolCall(call.name, {params[0]: body}, call.raw)
        arguments: dict[str, Any] = {}
        rest = body
        for name in params:
            match = re.search(f"<{re.escape(name)}>(.*?)</{re.escape(name)}>", rest, re.DOTALL)
            if match is None:
                continue
            value = match.group(1).removeprefix("\n").removesuffix("\n")
            converted = _convert(value, self._types[call.name][name])
            if converted is None:
                return self._error(call, f"<{name}> must hold a {self._types[call.name][name]}")
            arguments[name] = converted
            rest = rest[: match.start()] + rest[match.end() :]
        if rest.strip():
            return self._error(call, f"unexpected text {rest.strip()[:60]!r}")
        missing = self._required[call.name] - set(arguments)
        if missing:
            return self._error(call, f"missing {', '.join(f'<{m}>' for m in sorted(missing))}")
        return ToolCall(call.name, arguments, call.raw)

    def _error(self, call: ToolCall, problem: str) -> ToolCallError:
        example = "".join(f"\n<{name}>...</{name}>" for name in self._params[call.name])
        form = f"<{call.name}>{example}\n</{call.name}>"
        return ToolCallError(f"<{call.name}>: {problem}. Write:\n{form}", call.raw)


def _convert(value: str, kind: str) -> Any:
    if kind == "integer":
        return int(value.strip()) if re.fullmatch(r"\s*-?\d+\s*", value) else None
    if kind == "number":
        try:
            return float(value)
        except ValueError:
            return None
    return value


def _text(value: Any) -> str:
    text = str(value)
    return f"\n{text}\n" if "\n" in text else text
