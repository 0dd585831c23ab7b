"""The gateway in-process over the embedded engine (and over an EnginePool of one ``agentrl serve``
app), with the async ``openai`` SDK: a dead engine answers 503 and loses no session, a template
that is not append-only is recorded (policy keep) or refused (strict), sessions named by header,
stop strings."""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from aiohttp import web

from agentrl.engine_pool.gateway import SESSION_HEADER, Gateway, GatewayRoutes
from agentrl.engine_pool.pool import EnginePool
from agentrl.engine_pool.server import EngineServer
from agentrl.engine_pool.sglang_engine import SGLangEngine, free_port
from agentrl.tokenization import builtin_template

pytestmark = pytest.mark.slow

SAY = [{"role": "user", "content": "Say hello."}]


@contextlib.asynccontextmanager
async def serving(gateway: Gateway) -> AsyncIterator[str]:
    """The gateway's routes on a loopback port of this event loop."""
    app = web.Application()
    GatewayRoutes(gateway).add_to(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def client(url: str, **options) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, **options)


async def get(url: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.json()


async def test_a_dead_engine_answers_503_and_loses_no_session(engine, tokenizer):
    gateway = Gateway(engine, tokenizer, model_name="smollm2", context_length=8192)
    session = f"dead-{uuid.uuid4().hex}"
    async with serving(gateway) as url:
        sdk = client(url, default_headers={SESSION_HEADER: session})
        first = await sdk.chat.completions.create(
            model="smollm2", messages=SAY, max_tokens=3, temperature=0
        )
        await engine.aclose()
        history = [*SAY, first.choices[0].message, {"role": "user", "content": "Again."}]
        with pytest.raises(openai.InternalServerError) as caught:
            await sdk.chat.completions.create(model="smollm2", messages=history, max_tokens=3)
        assert caught.value.status_code == 503
        assert caught.value.body["code"] == "engine_error"
        assert [m.id for m in (await sdk.models.list()).data] == ["smollm2"]
        status, summary = await get(f"{url}/sessions/{session}")
        assert (status, summary["calls"], summary["segments"], summary["splits"]) == (200, 1, 1, 0)
        other = client(f"{url}/sessions/{session}", default_headers={SESSION_HEADER: "other"})
        with pytest.raises(openai.BadRequestError) as caught:  # header and URL disagree
            await other.chat.completions.create(model="smollm2", messages=SAY, max_tokens=1)
        assert caught.value.body["param"] == SESSION_HEADER


async def test_a_template_that_is_not_append_only_is_recorded_or_refused(engine, tokenizer):
    template = builtin_template("reasoning_stripped")
    kept = Gateway(
        engine, tokenizer, model_name="smollm2", context_length=8192, chat_template=template
    )
    session = f"stripped-{uuid.uuid4().hex}"
    async with serving(kept) as url:
        sdk = client(f"{url}/sessions/{session}")
        first = await sdk.chat.completions.create(
            model="smollm2", messages=SAY, max_tokens=4, temperature=0
        )
        history = [*SAY, first.choices[0].message, {"role": "user", "content": "Again."}]
        second = await sdk.chat.completions.create(
            model="smollm2", messages=history, max_tokens=4, temperature=0
        )
        assert engine.prefix_cache.tokens > 0
        status, record = await get(f"{url}/sessions/{session}/trajectories")
    assert engine.prefix_cache.tokens == 0  # closing the session ended it on the engine
    assert (status, record["verdicts"], record["splits"]) == (200, {"not_append_only": 2}, 0)
    (segment,) = record["segments"]
    body = second.model_dump()
    assert (
        segment["trajectory"]["input_ids"]
        == body["prompt_token_ids"] + body["choices"][0]["token_ids"]
    )

    strict = Gateway(
        engine,
        tokenizer,
        model_name="smollm2",
        chat_template=template,
        template_policy="strict",
    )
    async with serving(strict) as url:
        with pytest.raises(openai.BadRequestError) as caught:
            await client(url).chat.completions.create(model="smollm2", messages=SAY, max_tokens=1)
    assert "append-only" in caught.value.body["message"]


async def test_a_stop_string_ends_the_reply_and_the_tokens_stay_as_sampled(engine, tokenizer):
    gateway = Gateway(engine, tokenizer, model_name="smollm2", context_length=8192)
    messages = [{"role": "user", "content": "Count from 1 to 9, separated by commas."}]
    async with serving(gateway) as url:
        sdk = client(url)
        free = await sdk.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=12, temperature=0
        )
        stopped = await sdk.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=12, temperature=0, stop=["3"]
        )
    text = free.choices[0].message.content
    assert "3" in text, text  # the stop string is in the unconstrained reply
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index("3")]
    sampled = stopped.model_dump()["choices"][0]["token_ids"]
    assert (
        "3" in tokenizer.decode(sampled)
        and sampled == free.model_dump()["choices"][0]["token_ids"][: len(sampled)]
    )


async def test_the_gateway_over_a_pool_answers_503_when_no_engine_is_left(engine, tokenizer):
    server = web.AppRunner(EngineServer(engine, model_path="smollm2").app, access_log=None)
    await server.setup()
    port = free_port()
    await web.TCPSite(server, "127.0.0.1", port).start()
    try:
        async with EnginePool([SGLangEngine(f"http://127.0.0.1:{port}")]) as pool:
            gateway = Gateway(pool, tokenizer, model_name="smollm2", context_length=8192)
            async with serving(gateway) as url:
                sdk = client(url)
                answer = await sdk.chat.completions.create(
                    model="smollm2", messages=SAY, max_tokens=2
                )
                assert answer.choices[0].finish_reason in ("stop", "length")
                await engine.aclose()  # the server stays up and answers 503
                with pytest.raises(openai.InternalServerError) as caught:
                    await sdk.chat.completions.create(model="smollm2", messages=SAY, max_tokens=2)
                assert caught.value.status_code == 503
                assert [m.id for m in (await sdk.models.list()).data] == ["smollm2"]
    finally:
        await server.cleanup()


async def test_a_tokenizer_without_chat_template_serves_text_completions_only(engine, tokenizer):
    base = copy.deepcopy(tokenizer)
    base.chat_template = None  # a base model's tokenizer
    gateway = Gateway(engine, base, model_name="base", context_length=8192)
    async with serving(gateway) as url:
        sdk = client(url)
        text = await sdk.completions.create(model="base", prompt="One, two,", max_tokens=2)
        assert text.usage.completion_tokens == len(text.model_dump()["choices"][0]["token_ids"])
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.chat.completions.create(model="base", messages=SAY, max_tokens=1)
    assert "chat template" in caught.value.body["message"]


async def test_text_completions_in_a_session_become_token_exact_segments(engine, tokenizer):
    gateway = Gateway(engine, tokenizer, model_name="smollm2", context_length=8192)
    greedy = {"model": "smollm2", "max_tokens": 6, "temperature": 0}
    async with serving(gateway) as url:
        sdk = openai.AsyncOpenAI(base_url=f"{url}/sessions/txt/v1", api_key="x", max_retries=0)
        prompt = "Question: what is 2 plus 2?\nAnswer:"
        first = (await sdk.completions.create(prompt=prompt, **greedy)).model_dump()
        sampled = first["choices"][0]["token_ids"]
        # the agent goes on from what it got: the same segment, the sampled ids never re-encoded
        go_on = prompt + gateway.decode(sampled) + "\nQuestion: and 3 plus 3?\nAnswer:"
        second = (await sdk.completions.create(prompt=go_on, **greedy)).model_dump()
        # by ids, the same rule: a prefix of the segment's ids extends it
        by_ids = second["prompt_token_ids"] + second["choices"][0]["token_ids"]
        third = (await sdk.completions.create(prompt=[*by_ids, 198], **greedy)).model_dump()
        # a prompt that rewrote the history: a new segment (a split)
        other = (await sdk.completions.create(prompt="Answer: 4", **greedy)).model_dump()
        status, record = await get(f"{url}/sessions/txt/trajectories")
    assert status == 200 and record["splits"] == 1 and record["verdicts"] == {"text": 4}
    kept, rewritten = (segment["trajectory"] for segment in record["segments"])
    p1, p2, p3 = (call["prompt_token_ids"] for call in (first, second, third))
    s1, s2, s3 = (call["choices"][0]["token_ids"] for call in (first, second, third))
    assert p2[: len(p1) + len(s1)] == p1 + s1 and p3 == [*p2, *s2, 198]
    assert kept["input_ids"] == p3 + s3
    sampled_at = {*range(len(p1), len(p1) + len(s1)), *range(len(p2), len(p2) + len(s2))}
    sampled_at |= set(range(len(p3), len(p3) + len(s3)))
    assert [i for i, m in enumerate(kept["loss_mask"]) if m] == sorted(sampled_at)
    assert [c["extended"] for c in record["segments"][0]["calls"]] == [False, True, True]
    assert rewritten["input_ids"] == other["prompt_token_ids"] + other["choices"][0]["token_ids"]
    assert record["segments"][1]["text"].startswith("Answer: 4")
