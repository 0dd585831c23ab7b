"""ToolSet.run answers every call and every parse error with a message, in order, and never raises."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl.tools import HermesParser, TagParser, Tool, ToolCall, ToolCallError, ToolSet


async def wait(seconds: float, label: str) -> str:
    """Sleep, then return the label."""
    await asyncio.sleep(seconds)
    return label


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def explode(reason: str) -> str:
    raise RuntimeError(reason)


TOOLS = ToolSet([Tool.from_function(f) for f in (wait, add, explode)])


def tool_message(name: str, content: str) -> dict[str, str]:
    return {"role": "tool", "name": name, "content": content}


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="'add'"):
        ToolSet([Tool.from_function(add), Tool.from_function(wait, name="add")])


def test_lookup_and_fresh_schemas() -> None:
    assert "add" in TOOLS and "nope" not in TOOLS
    assert TOOLS["add"].name == "add"
    assert TOOLS.names == ["wait", "add", "explode"]
    assert len(TOOLS) == 3 and [tool.name for tool in TOOLS] == TOOLS.names
    schemas = TOOLS.schemas()
    assert [schema["function"]["name"] for schema in schemas] == TOOLS.names
    schemas[1]["function"]["parameters"]["required"].append("c")
    assert TOOLS.schemas()[1]["function"]["parameters"]["required"] == ["a", "b"]
    with pytest.raises(KeyError):
        TOOLS["nope"]


async def test_every_failure_becomes_an_error_message_in_call_order() -> None:
    calls = [
        ToolCall("add", {"a": 1, "b": 2}),
        ToolCall("search", {"q": "x"}),
        ToolCall("add", {"a": "one", "b": 2}),
        ToolCall("explode", {"reason": "kaput"}),
        ToolCall("wait", {"seconds": 0, "label": "done"}),
    ]
    errors = [ToolCallError("unterminated <tool_call>", "<tool_call>{")]
    messages = await TOOLS.run(calls, errors)
    assert messages[0] == tool_message("add", "3")
    assert messages[1] == tool_message(
        "search", "Error: unknown tool 'search'. Available tools: 'wait', 'add', 'explode'."
    )
    assert messages[2]["content"].startswith(
        "Error: invalid arguments for tool 'add': argument 'a'"
    )
    assert messages[3] == tool_message(
        "explode", "Error: tool 'explode' raised RuntimeError: kaput"
    )
    assert messages[4] == tool_message("wait", "done")
    assert messages[5] == tool_message("error", "Error: unterminated <tool_call>")
    assert len(messages) == 6
    assert all("Traceback" not in message["content"] for message in messages)


def traced(log: list[tuple[str, str]], sequential: bool) -> ToolSet:
    """A set whose one tool logs when each call starts and ends (an event, not a clock)."""

    async def step(label: str) -> str:
        """Log the start, yield to the loop a few times, log the end."""
        log.append(("start", label))
        for _ in range(3):
            await asyncio.sleep(0)
        log.append(("end", label))
        return label

    return ToolSet([Tool.from_function(step)], sequential=sequential)


@pytest.mark.parametrize("sequential", [False, True])
async def test_calls_run_concurrently_or_in_order_and_keep_call_order(sequential) -> None:
    log: list[tuple[str, str]] = []
    calls = [ToolCall("step", {"label": str(i)}) for i in range(3)]
    tools = traced(log, sequential)
    messages = await tools.run(calls)
    assert [message["content"] for message in messages] == ["0", "1", "2"]
    if sequential:  # each call ends before the next starts
        assert log == [(event, str(i)) for i in range(3) for event in ("start", "end")]
    else:  # every call has started before the first one ends
        assert log[:3] == [("start", "0"), ("start", "1"), ("start", "2")]


async def test_no_calls_and_no_errors_give_no_messages() -> None:
    assert await TOOLS.run([]) == []


async def test_parsed_hermes_text_end_to_end() -> None:
    parser = HermesParser()
    text = (
        parser.format(ToolCall("add", {"a": 2, "b": 3}))
        + parser.format(ToolCall("add", {"a": 2}))
        + '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>'
    )
    parsed = parser.parse(text)
    messages = await TOOLS.run(parsed.calls, parsed.errors)
    assert [message["name"] for message in messages] == ["add", "add", "error"]
    assert messages[0]["content"] == "5"
    assert "missing required argument 'b'" in messages[1]["content"]
    assert "invalid JSON" in messages[2]["content"]


FRAGMENTS = ["<python>", "</python>", "<answer>", "<add>", "</add>", "1", "x", "\n"]


@given(text=st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=12).map("".join))
def test_run_never_raises_on_whatever_the_parser_returns(text: str) -> None:
    parser = TagParser({"python": "code", "answer": "answer", "add": "a"})
    for attempt in (text, f"<add>{text}</add><answer>{text}"):
        parsed = parser.parse(attempt)
        messages = asyncio.run(TOOLS.run(parsed.calls, parsed.errors))
        assert len(messages) == len(parsed.calls) + len(parsed.errors)
        assert all(message["role"] == "tool" for message in messages)
