"""Between OpenAI's messages and the chat template: what the template renders, and what a reply is.

:func:`template_messages` turns normalised OpenAI messages (:mod:`.protocol`) into the messages a
:class:`~agentrl.tokenization.TrajectoryBuilder` renders, the form environments give the rollout
runner: an assistant turn is its text as the model wrote it. So

* an assistant message this session returned earlier is rendered as the text its tokens decode to
  (tool-call markup included), whatever the agent sends back;
* another assistant message with ``tool_calls`` goes to the template as ``tool_calls`` (arguments
  as objects, as transformers' templates expect) when the template renders them, else its calls
  are written into its content by the tool-call parser (:meth:`ToolCallParser.format`), as the model
  would have written them;
* a tool message without ``name`` gets the name of the call its ``tool_call_id`` answers.

:func:`parse_reply` reads a completion's text with the same parser environments use
(:class:`~agentrl.tools.HermesParser` by default): every call it parses becomes an OpenAI
``tool_calls`` entry and leaves the content; malformed calls stay in the content as written.
"""

from __future__ import annotations

import json
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.engine_pool.gateway.protocol import Message
from agentrl.tokenization import ChatFormat
from agentrl.tools.parsers import ToolCall, ToolCallParser

_PROBE_NAME = "agentrl_probe_function"
_renders_calls: weakref.WeakKeyDictionary[ChatFormat, bool] = weakref.WeakKeyDictionary()


def renders_tool_calls(fmt: ChatFormat) -> bool:
    """Whether the template writes an assistant message's ``tool_calls`` (cached per format)."""
    if fmt not in _renders_calls:
        function = {"name": _PROBE_NAME, "arguments": {}}
        call = {"id": "call_0", "type": "function", "function": function}
        probe: list[dict[str, Any]] = [
            {"role": "user", "content": "probe"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        try:
            _renders_calls[fmt] = _PROBE_NAME in fmt.render(probe)
        except Exception:  # a template that cannot render the probe does not render calls
            _renders_calls[fmt] = False
    return _renders_calls[fmt]


def template_messages(
    messages: Sequence[Message],
    fmt: ChatFormat,
    parser: ToolCallParser,
    known_reply: Callable[[Message], str | None] = lambda message: None,
) -> list[dict[str, Any]]:
    """The messages to render for ``messages`` (see the module docstring); ``known_reply`` gives
    the sampled text of an assistant message the session returned, else None."""
    names = {
        call["id"]: call["name"]
        for message in messages
        for call in message.get("tool_calls", ())
        if call["id"]
    }
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "assistant":
            out.append(_assistant(message, fmt, parser, known_reply))
            continue
        rendered = dict(message)
        if message["role"] == "tool" and "name" not in message:
            name = names.get(message.get("tool_call_id", ""))
            if name is not None:
                rendered["name"] = name
        out.append(rendered)
    return out


def _assistant(
    message: Message,
    fmt: ChatFormat,
    parser: ToolCallParser,
    known_reply: Callable[[Message], str | None],
) -> dict[str, Any]:
    raw = known_reply(message)
    if raw is not None:
        return {"role": "assistant", "content": raw}
    calls = message.get("tool_calls") or []
    if not calls:
        return {"role": "assistant", "content": message["content"]}
    if renders_tool_calls(fmt):
        return {
            "role": "assistant",
            "content": message["content"],
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in calls
            ],
        }
    written = "\n".join(parser.format(ToolCall(c["name"], c["arguments"])) for c in calls)
    content = f"{message['content']}\n{written}" if message["content"] else written
    return {"role": "assistant", "content": content}


@dataclass(frozen=True)
class Reply:
    """An assistant reply in OpenAI's terms: ``content`` (None when only calls were made) and
    ``tool_calls`` (OpenAI's objects, arguments as JSON text)."""

    content: str | None
    tool_calls: list[dict[str, Any]]

    def message(self) -> dict[str, Any]:
        """The response's ``message`` object."""
        body: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            body["tool_calls"] = self.tool_calls
        return body

    def normalized(self) -> Message:
        """The reply in the normalised form :mod:`.protocol` gives the agent's next request."""
        message: Message = {"role": "assistant", "content": self.content or ""}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": json.loads(call["function"]["arguments"]),
                }
                for call in self.tool_calls
            ]
        return message


def parse_reply(text: str, parser: ToolCallParser | None) -> Reply:
    """``text`` as content and tool calls (``parser`` None: all content)."""
    if parser is None:
        return Reply(text, [])
    parsed = parser.parse(text)
    if not parsed.calls:
        return Reply(text, [])
    kept, position = [], 0
    for call in parsed.calls:  # remove each parsed call's text; malformed ones stay
        start = text.find(call.raw, position)
        kept.append(text[position:start])
        position = start + len(call.raw)
    kept.append(text[position:])
    content = "".join(kept).strip()
    calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": json.dumps(call.arguments, ensure_ascii=False),
            },
        }
        for call in parsed.calls
    ]
    return Reply(content or None, calls)
