"""The gateway's request validation, message rendering, reply parsing and session matching, without
an engine (SmolLM2's tokenizer and template are real; engine outputs are its encodings)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import ADD_TOOL

from agentrl.engine_pool.engine import GenerateResult
from agentrl.engine_pool.gateway.messages import parse_reply, renders_tool_calls, template_messages
from agentrl.engine_pool.gateway.protocol import (
    GatewayError,
    parse_chat_request,
    parse_completion_request,
)
from agentrl.engine_pool.gateway.sessions import CallRecord, Session, Start, fork
from agentrl.tokenization import ChatFormat, TrajectoryBuilder
from agentrl.tools import HermesParser

USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> Any:
    return parse_chat_request({"model": "m", "messages": USER, **fields})


def refused(param: str, **fields: Any) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        chat(**fields)
    assert (caught.value.status, caught.value.param) == (400, param), caught.value.message
    return caught.value


def test_chat_request_normalises_messages_and_sampling():
    request = chat(
        messages=[
            {
                "role": "developer",
                "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
            },
            {"role": "user", "content": "2+2?", "name": "ann"},
        ],
        max_completion_tokens=7,
        stop="\n",
        top_k=-1,
        min_p=0.05,
        frequency_penalty=0,
        user="someone",
        extra_body={"return_token_ids": True},  # as rllm-model-gateway's proxy sends it
    )
    assert request.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2?", "name": "ann"},
    ]
    assert (request.sampling.max_tokens, request.sampling.stop, request.sampling.top_k) == (
        7,
        ("\n",),
        0,
    )
    assert request.tool_choice == "auto" and request.tools is None
    assert request.sampling.min_p == 0.05


def test_chat_request_refusals_name_the_field():
    refused("messages", messages=[])
    refused("min_p", messages=[{"role": "user", "content": "x"}], min_p=1.5)
    refused("messages[0].role", messages=[{"role": "robot", "content": "x"}])
    refused(
        "messages[0].content[0]", messages=[{"role": "user", "content": [{"type": "image_url"}]}]
    )
    refused("messages[0].tool_call_id", messages=[{"role": "tool", "content": "4"}])
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{not json"}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    refused("messages[0].tool_calls[0].function.arguments", messages=[message])
    refused(
        "tools[0].function.parameters",
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
    )
    refused("tools[1].function.name", tools=[ADD_TOOL, ADD_TOOL])
    refused("tool_choice", tool_choice="required")  # and no tools
    refused(
        "tool_choice",
        tool_choice={"type": "function", "function": {"name": "sub"}},
        tools=[ADD_TOOL],
    )
    refused("tool_choice", tool_choice={"type": "function", "name": "add"}, tools=[ADD_TOOL])
    refused("presence_penalty", presence_penalty=1.0)
    refused("max_tokens", max_tokens=0)
    refused("max_tokens", max_tokens=5, max_completion_tokens=5)
    refused("temperature", temperature=-1)
    refused("seed", seed=-3)
    assert "unsupported field 'guided_json'" in refused("guided_json", guided_json={}).message
    assert (
        "'extra_body.guided_json'" in refused("extra_body", extra_body={"guided_json": {}}).message
    )
    refused("extra_body", extra_body=["return_token_ids"])


def test_tool_choice_required_or_named_is_read():
    assert chat(tool_choice="required", tools=[ADD_TOOL]).tool_choice == "required"
    named = chat(tool_choice={"type": "function", "function": {"name": "add"}}, tools=[ADD_TOOL])
    assert (named.tool_choice, named.forced_tool) == ("required", "add")
    assert (chat(tool_choice=None).tool_choice, chat(tool_choice="none").tool_choice) == (
        "auto",
        "none",
    )


def test_response_format_becomes_a_json_schema():
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    wrapped = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert json.loads(chat(response_format=wrapped).json_schema) == schema
    assert json.loads(chat(response_format={"type": "json_object"}).json_schema) == {
        "type": "object"
    }
    assert chat(response_format={"type": "text"}).json_schema is None
    refused(
        "response_format", response_format={"type": "json_schema", "json_schema": {"name": "x"}}
    )
    refused("response_format", response_format={"type": "xml"})
    refused(
        "response_format",
        response_format={"type": "json_object"},
        tool_choice="required",
        tools=[ADD_TOOL],
    )


def test_completion_request_takes_text_or_token_ids():
    assert parse_completion_request({"model": "m", "prompt": [[1, 2, 3]]}).prompt == [1, 2, 3]
    assert parse_completion_request({"model": "m", "prompt": ["hi"]}).prompt == "hi"
    for prompt in (["a", "b"], [], [1.5], None):
        with pytest.raises(GatewayError):
            parse_completion_request({"model": "m", "prompt": prompt})
    with pytest.raises(GatewayError) as caught:
        parse_completion_request({"model": "m", "prompt": "hi", "logprobs": 2})
    assert caught.value.param == "logprobs"


def test_replies_keep_malformed_calls_as_content():
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    reply = parse_reply(f"Let me add.\n{call}\n<tool_call>{{oops</tool_call>", HermesParser())
    assert reply.content == "Let me add.\n\n<tool_call>{oops</tool_call>"
    (made,) = reply.tool_calls
    assert made["function"]["name"] == "add"
    assert json.loads(made["function"]["arguments"]) == {"a": 1, "b": 2}
    assert reply.normalized()["tool_calls"][0]["arguments"] == {"a": 1, "b": 2}
    only_call = parse_reply(call, HermesParser())
    assert only_call.content is None and only_call.message()["content"] is None
    assert parse_reply(call, None).tool_calls == []


def test_template_messages_write_calls_the_template_ignores(tokenizer):
    fmt = ChatFormat.of(tokenizer)
    assert not renders_tool_calls(fmt)  # SmolLM2's ChatML ignores tool_calls
    request = chat(
        messages=[
            *USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 1}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "1"},
            {"role": "assistant", "content": "known"},
        ]
    )
    rendered = template_messages(
        request.messages, fmt, HermesParser(), lambda m: "RAW" if m["content"] == "known" else None
    )
    assert rendered[1] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
    }
    assert rendered[2] == {"role": "tool", "tool_call_id": "c1", "content": "1", "name": "add"}
    assert rendered[3] == {"role": "assistant", "content": "RAW"}


def _reply(session: Session, start: Start, messages: list, text: str, tools=None) -> dict:
    """Record ``text`` (its own encoding plus <|im_end|>) as the engine's reply to ``messages``."""
    fmt = start.builder.format
    ids = [*fmt.encode(text), *sorted(fmt.end_of_turn_ids)[:1]]
    result = GenerateResult(ids, [-0.5] * len(ids), "stop", 0)
    reply = parse_reply(text, HermesParser()).normalized()
    record = CallRecord(
        session.calls, 0, start.segment is not None, "append_only", 0, len(ids), "stop", 0
    )
    session.commit(start, messages, tools, [(reply, record, result)])
    return reply


def test_sessions_extend_only_unchanged_histories(tokenizer):
    fmt = ChatFormat.of(tokenizer)
    session = Session("s")
    first = [{"role": "user", "content": "What is 1 plus 2?"}]
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    reply = _reply(
        session,
        Start(TrajectoryBuilder(fmt, first, [ADD_TOOL]), use="tools"),
        first,
        call,
        [ADD_TOOL],
    )
    # the agent sends the reply back with its own call id: still the same turn
    echoed = {**reply, "tool_calls": [{**reply["tool_calls"][0], "id": "call_other"}]}
    result = {"role": "tool", "tool_call_id": "call_other", "content": "3"}
    found = session.extension([*first, echoed, result], [ADD_TOOL])
    assert found is not None and found[1] == [result]
    assert session.extension([*first, echoed, result], None) is None  # other tools
    assert (
        session.extension([{"role": "user", "content": "edited"}, echoed, result], [ADD_TOOL])
        is None
    )
    assert (
        session.extension([*first, echoed, {"role": "assistant", "content": "x"}], [ADD_TOOL])
        is None
    )
    assert session.known_reply(echoed) == call
    segment, new = found
    extended = fork(segment.builder)
    extended.add_messages(new)
    start = Start(extended, segment, segment.version, "tools")
    _reply(session, start, [*first, echoed, result], "3.", [ADD_TOOL])
    assert (session.calls, session.splits, len(session.segments)) == (2, 0, 1)
    # a call from a state the segment has moved past starts a new segment, counted as a split
    _reply(session, Start(TrajectoryBuilder(fmt, first, [ADD_TOOL])), first, "again", [ADD_TOOL])
    record = session.record()
    assert (record.calls, record.splits, len(record.segments)) == (3, 1, 2)
    assert (
        record.segments[0].trajectory.input_ids[: len(extended.prompt_ids())]
        == extended.prompt_ids()
    )


def test_a_fork_grows_apart_from_its_builder(tokenizer):
    fmt = ChatFormat.of(tokenizer)
    builder = TrajectoryBuilder(fmt, USER)
    reply = [*fmt.encode("hello"), *sorted(fmt.end_of_turn_ids)[:1]]
    builder.add_completion(reply, [-1.0] * len(reply), 0)
    before = (builder.prompt_ids(), builder.messages, builder.trajectory)
    forked = fork(builder)
    forked.add_messages([{"role": "user", "content": "more"}])
    forked.add_completion(reply, [-2.0] * len(reply), 1)
    assert (builder.prompt_ids(), builder.messages, builder.trajectory) == before
    assert forked.prompt_ids()[: len(before[0])] == before[0]
    assert len(forked.messages) == len(before[1]) + 2
    builder.add_messages([{"role": "user", "content": "other"}])  # the original goes on alone
    assert forked.messages[2]["content"] == "more"


def test_template_messages_give_calls_to_templates_that_render_them(tokenizer):
    """Qwen3's published template (tests/tokenization/real_templates) writes tool_calls itself."""
    template = Path(__file__).parents[2] / "tokenization" / "real_templates" / "qwen3.jinja"
    fmt = ChatFormat(tokenizer, template.read_text())
    assert renders_tool_calls(fmt)
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    request = chat(
        messages=[
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "1"},
        ]
    )
    rendered = template_messages(request.messages, fmt, HermesParser())
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    text = fmt.render(rendered, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>' in text
    assert "<tool_response>\n1\n</tool_response>" in text


def test_two_calls_extending_one_segment_at_once_branch(tokenizer):
    """Both calls forked the segment at the same version: the first to finish extends it, the
    other becomes a new segment (a split); both stay token-exact."""
    fmt = ChatFormat.of(tokenizer)
    session = Session("s")
    first = [{"role": "user", "content": "Hi"}]
    reply = _reply(session, Start(TrajectoryBuilder(fmt, first)), first, "Hello.")
    (segment,) = session.segments
    starts = []
    for text in ("a", "b"):
        messages = [*first, reply, {"role": "user", "content": text}]
        segment_now, new = session.extension(messages, None)
        assert segment_now is segment
        builder = fork(segment.builder)
        builder.add_messages(new)
        start = Start(builder, segment, segment.version, "plain")
        starts.append((start, messages, builder.prompt_ids()))
    for (start, messages, _), text in zip(starts, ("A.", "B."), strict=True):
        _reply(session, start, messages, text)
    record = session.record()
    assert (record.calls, record.splits, len(record.segments)) == (3, 1, 2)
    for segment_record, (_, _, prompt), (asked, answer) in zip(
        record.segments, starts, [("a", "A."), ("b", "B.")], strict=True
    ):
        assert segment_record.trajectory.input_ids[: len(prompt)] == prompt
        assert [m["content"] for m in segment_record.messages[-2:]] == [asked, answer]
