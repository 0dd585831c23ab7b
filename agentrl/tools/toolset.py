"""A set of tools, run on parsed tool calls so that every call gets an answer and nothing raises.

``ToolSet.run`` is what an environment calls after parsing an assistant message: each call and
each parse error becomes one ``{"role": "tool", ...}`` chat message, in order. Unknown tools,
invalid arguments and exceptions inside a tool all become ``"Error: ..."`` messages for the agent to
read; the environment never sees an exception (cancellation still propagates, as it must).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

from agentrl.tools.parsers import ToolCall, ToolCallError
from agentrl.tools.tool import Tool, ToolArgumentError

ERROR_NAME = "error"
"""The ``name`` of a tool message that answers a parse error rather than a call."""


class ToolSet:
    """Tools by name: their schemas for the prompt, and :meth:`run` for the calls the model made."""

    def __init__(self, tools: Sequence[Tool], *, sequential: bool = False) -> None:
        """Index ``tools`` by name; raises ``ValueError`` if two share a name. ``sequential``:
        a message's calls run one after another, in order (tools that act on one sandbox, where
        a call may depend on the one before, as SWE-agent and OpenHands run them); otherwise
        they run concurrently."""
        self.sequential = sequential
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        """The tool names, in the order the tools were given."""
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's OpenAI/Hermes schema, as new dicts on every call."""
        return [tool.schema() for tool in self._tools.values()]

    async def run(
        self, calls: Sequence[ToolCall], errors: Sequence[ToolCallError] = ()
    ) -> list[dict[str, str]]:
        """Answer every call, then every parse error, with one tool message each; never raises.

        A call's message is ``{"role": "tool", "name": call.name, "content": result}``; when the
        tool is unknown, the arguments are invalid or the tool raises, ``content`` is
        ``"Error: ..."`` saying why (for an unknown tool, which tools exist). A parse error's
        message has ``name`` ``"error"``. Calls run concurrently, or in order when the set is
        ``sequential``; messages keep the call order.
        """
        if self.sequential:
            results = [await self._answer(call) for call in calls]
        else:
            results = await asyncio.gather(*(self._answer(call) for call in calls))
        messages = [
            _message(call.name, content) for call, content in zip(calls, results, strict=True)
        ]
        messages += [_message(ERROR_NAME, f"Error: {error.message}") for error in errors]
        return messages

    async def _answer(self, call: ToolCall) -> str:
        tool = self._tools.get(call.name)
        if tool is None:
            available = ", ".join(repr(name) for name in self._tools) or "none"
            return f"Error: unknown tool {call.name!r}. Available tools: {available}."
        try:
            return await tool.acall(call.arguments)
        except ToolArgumentError as exc:
            return f"Error: {exc}"
        except Exception as exc:
            return f"Error: tool {call.name!r} raised {type(exc).__name__}: {exc}"


def _message(name: str, content: str) -> dict[str, str]:
    return {"role": "tool", "name": name, "content": content}
