"""The OpenAI-compatible routes driven by the real ``openai`` SDK, on ``agentrl serve`` (the
embedded engine) and on ``agentrl gateway`` in front of an ``agentrl serve`` server: tool calls
and tool results, streaming, ``n > 1``, text completions, every error kind, and sessions whose
trajectories are the engine's sampled ids plus the template's (checked against the server's own
``/generate``), split into segments when the agent rewrites its history."""

from __future__ import annotations

import json
import uuid
from typing import Any

import openai
import pytest
from gateway_helpers import ADD_TOOL, SYSTEM, agentrl_process, few_shot, get_json, post_json

pytestmark = pytest.mark.slow

GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 40}
MAX_BODY = 200_000


@pytest.fixture(scope="module")
def serve_url(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with agentrl_process(["serve", "smollm2", "--max-batch-size", "8"], log) as url:
        yield url


@pytest.fixture(scope="module")
def gateway_url(serve_url, tmp_path_factory):
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    args = ["gateway", "--engine-url", serve_url, "--model", "smollm2"]
    with agentrl_process([*args, "--max-body-bytes", str(MAX_BODY)], log) as url:
        yield url


@pytest.fixture(params=["serve", "gateway"])
def url(request) -> str:
    """The endpoint under test: the embedded engine's server, or the gateway in front of it."""
    return request.getfixturevalue(f"{request.param}_url")


def client(base: str, session: str | None = None) -> openai.OpenAI:
    prefix = f"/sessions/{session}" if session else ""
    return openai.OpenAI(base_url=f"{base}{prefix}/v1", api_key="unused", max_retries=0)


def tool_turn(sdk: openai.OpenAI, messages: list[dict[str, Any]], **extra: Any) -> Any:
    return sdk.chat.completions.create(
        model="smollm2", messages=messages, tools=[ADD_TOOL], **GREEDY, **extra
    )


def ids(response: Any, choice: int = 0) -> tuple[list[int], list[int]]:
    """(prompt_token_ids, token_ids of ``choice``) of a response, read from its extra fields."""
    body = response.model_dump()
    return body["prompt_token_ids"], body["choices"][choice]["token_ids"]


def test_models_lists_the_served_model(url):
    assert [model.id for model in client(url).models.list()] == ["smollm2"]
    with pytest.raises(openai.NotFoundError) as caught:
        client(url).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert caught.value.body["code"] == "model_not_found"


def test_tool_call_session_is_token_exact(url, serve_url):
    session = f"tools-{uuid.uuid4().hex}"
    sdk = client(url, session)
    messages = few_shot("What is 2 plus 3?")
    first = tool_turn(sdk, messages, logprobs=True)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    result = {"role": "tool", "tool_call_id": call.id, "content": "5"}
    second = tool_turn(sdk, [*messages, choice.message, result], logprobs=True)
    assert second.choices[0].finish_reason == "stop"
    assert "5" in second.choices[0].message.content

    prompt1, sampled1 = ids(first)
    prompt2, sampled2 = ids(second)
    assert prompt2[: len(prompt1) + len(sampled1)] == prompt1 + sampled1  # sampled ids kept
    status, record = get_json(f"{url}/sessions/{session}/trajectories")
    assert status == 200
    assert (record["calls"], record["splits"], len(record["segments"])) == (2, 0, 1)
    (segment,) = record["segments"]
    trajectory = segment["trajectory"]
    assert trajectory["input_ids"] == prompt2 + sampled2
    mask = trajectory["loss_mask"]
    sampled_at = [i for i, m in enumerate(mask) if m]
    start1, start2 = len(prompt1), len(prompt2)
    assert sampled_at == [*range(start1, start1 + len(sampled1)), *range(start2, len(mask))]
    logprobs = [
        e["logprob"]
        for r in (first, second)
        for e in r.model_dump()["choices"][0]["logprobs"]["content"]
    ]
    assert [trajectory["logprobs"][i] for i in sampled_at] == logprobs
    assert [c["extended"] for c in segment["calls"]] == [False, True]
    assert {c["verdict"] for c in segment["calls"]} == {"append_only"}
    # the engine's own /generate, from the recorded prompt, samples the recorded ids
    native = post_json(
        f"{serve_url}/generate",
        {"input_ids": prompt2, "sampling_params": {"temperature": 0, "max_new_tokens": 40}},
    )
    assert native["output_ids"] == sampled2
    # closed: the session is gone
    assert get_json(f"{url}/sessions/{session}/trajectories")[0] == 404


def test_tool_choice_required_and_named_make_the_model_call_a_tool(url, serve_url):
    """Constrained decoding: asked for a joke, SmolLM2 answers in text; with ``tool_choice``
    ``"required"`` or naming ``add``, it calls ``add``, arguments under its schema (``strict``),
    in the parser's own format. The engine's own ``/generate``, given the recorded prompt and the
    parser's structural tag, samples the recorded ids."""
    from agentrl.tools import HermesParser

    sdk = client(url, f"required-{uuid.uuid4().hex}")
    messages = [{"role": "user", "content": "Tell me a joke."}]
    strict = {"type": "function", "function": {**ADD_TOOL["function"], "strict": True}}
    free = sdk.chat.completions.create(model="smollm2", messages=messages, tools=[strict], **GREEDY)
    assert not free.choices[0].message.tool_calls
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        response = sdk.chat.completions.create(
            model="smollm2",
            messages=messages,
            tools=[strict],
            tool_choice=choice,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=80,
        )
        (call,) = response.choices[0].message.tool_calls
        assert response.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "add"
        arguments = json.loads(call.function.arguments)
        assert set(arguments) == {"a", "b"} and all(type(v) is int for v in arguments.values())
    prompt, sampled = ids(response)
    tag = HermesParser().structural_tag([strict], "add")
    params = {"temperature": 0, "max_new_tokens": 80, "structural_tag": tag}
    native = post_json(f"{serve_url}/generate", {"input_ids": prompt, "sampling_params": params})
    assert native["output_ids"] == sampled


def test_response_format_constrains_the_reply_to_json(url):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    cases: list[tuple[str, Any]] = [
        (
            "Name a big city.",
            {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        ),
        ('Give the capital of France as JSON: {"capital": ...}', {"type": "json_object"}),
    ]
    for question, response_format in cases:
        response = client(url).chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": question}],
            response_format=response_format,
            temperature=0,
            max_tokens=60,
        )
        assert response.choices[0].finish_reason == "stop"
        reply = json.loads(response.choices[0].message.content or "")
        assert isinstance(reply, dict)
        if response_format["type"] == "json_schema":
            assert set(reply) == {"city", "population"} and type(reply["population"]) is int


def test_rewritten_history_starts_a_new_segment(url):
    session = f"rewrite-{uuid.uuid4().hex}"
    sdk = client(url, session)
    messages = few_shot("What is 6 plus 8?")
    first = tool_turn(sdk, messages)
    (call,) = first.choices[0].message.tool_calls
    # the agent drops its examples (a summarising agent would): not an extension any more
    shortened = [SYSTEM, messages[-1], first.choices[0].message]
    second = tool_turn(
        sdk, [*shortened, {"role": "tool", "tool_call_id": call.id, "content": "14"}]
    )
    status, record = get_json(f"{url}/sessions/{session}/trajectories")
    assert status == 200
    assert (record["calls"], record["splits"], len(record["segments"])) == (2, 1, 2)
    for segment, response in zip(record["segments"], (first, second), strict=True):
        prompt, sampled = ids(response)
        assert segment["trajectory"]["input_ids"] == prompt + sampled
        assert segment["trajectory"]["loss_mask"] == [0] * len(prompt) + [1] * len(sampled)
        assert [c["extended"] for c in segment["calls"]] == [False]
    # the new segment renders the earlier reply as the model wrote it (its sampled text)
    reply_text = record["segments"][1]["messages"][2]["content"]
    assert reply_text.startswith("<tool_call>") and '"a": 6' in reply_text


def test_streaming_gives_the_same_reply_in_chunks(url):
    messages = few_shot("What is 4 plus 4?")
    plain = tool_turn(client(url), messages)
    stream = tool_turn(client(url), messages, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert content == (plain.choices[0].message.content or "")
    assert [(t.function.name, t.function.arguments) for t in calls] == [
        (t.function.name, t.function.arguments) for t in plain.choices[0].message.tool_calls
    ]
    assert finish == ["tool_calls"]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    token_ids = [
        t for c in chunks if c.choices for t in c.model_dump()["choices"][0].get("token_ids") or ()
    ]
    assert token_ids == ids(plain)[1]


def test_n_choices_each_become_a_segment(url):
    session = f"n-{uuid.uuid4().hex}"
    response = client(url, session).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Name a colour."}],
        n=3,
        temperature=1.0,
        top_p=0.9,
        seed=11,
        max_completion_tokens=6,
    )
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert response.usage.completion_tokens == sum(len(ids(response, i)[1]) for i in range(3))
    status, record = get_json(f"{url}/sessions/{session}/trajectories")
    assert (status, record["splits"], len(record["segments"])) == (200, 0, 3)
    for i, segment in enumerate(record["segments"]):
        prompt, sampled = ids(response, i)
        assert segment["trajectory"]["input_ids"] == prompt + sampled


def test_text_completions(url):
    sdk = client(url)
    text = sdk.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=0
    )
    prompt, sampled = ids(text)
    assert len(sampled) == text.usage.completion_tokens <= 4
    assert len(text.choices[0].logprobs.token_logprobs) == len(sampled)
    by_ids = sdk.completions.create(model="smollm2", prompt=prompt, max_tokens=4, temperature=0)
    assert ids(by_ids)[1] == sampled and by_ids.choices[0].text == text.choices[0].text
    streamed = list(
        sdk.completions.create(
            model="smollm2", prompt=prompt, max_tokens=4, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in streamed) == text.choices[0].text


def test_errors_are_openai_error_objects_and_the_server_keeps_serving(url, gateway_url):
    sdk = client(url)
    user = [{"role": "user", "content": "hi"}]
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        (
            {"messages": user, "tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
        ),
        ({"messages": user, "tool_choice": "required"}, "tool_choice"),  # and no tools
        (
            {
                "messages": user,
                "tool_choice": {"type": "function", "function": {"name": "sub"}},
                "tools": [ADD_TOOL],
            },
            "tool_choice",
        ),
        ({"messages": user, "logprobs": True, "top_logprobs": 3}, "top_logprobs"),
        ({"messages": user, "frequency_penalty": 0.5}, "frequency_penalty"),
        ({"messages": user, "response_format": {"type": "yaml"}}, "response_format"),
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.chat.completions.create(model="smollm2", max_tokens=1, **fields)
        assert caught.value.body["param"] == param, caught.value.body
    with pytest.raises(openai.BadRequestError) as caught:  # 9000 words: over the 8192 context
        sdk.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "hi " * 9000}], max_tokens=1
        )
    assert caught.value.body["code"] == "context_length_exceeded"
    assert get_json(f"{url}/sessions/never-opened/trajectories")[0] == 404
    if url == gateway_url:  # a body over --max-body-bytes
        with pytest.raises(openai.APIStatusError) as caught:
            sdk.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": "x" * MAX_BODY}],
                max_tokens=1,
            )
        assert caught.value.status_code == 413
    again = sdk.chat.completions.create(model="smollm2", messages=user, max_tokens=2)
    assert again.choices[0].finish_reason in ("stop", "length")
