"""What a real SGLang server does that its client must meet, one test per behaviour: against
`agentrl serve`, which behaves as SGLang 0.5.23 does there, and against stand-ins of SGLang where
the behaviour depends on how the server was started (docs/sglang_http_api.md)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from test_sglang_http import (  # noqa: F401  (fixtures)
    SAMPLED,
    fake_sglang,
    model_dir,
    server,
    server_url,
)

from agentrl.engine_pool.engine import SamplingParams
from agentrl.engine_pool.pool import EnginePool
from agentrl.engine_pool.sglang_api import encode_named_tensors, parse_generate_response
from agentrl.engine_pool.sglang_engine import SGLangEngine

pytestmark = pytest.mark.slow

LONG = SamplingParams(max_new_tokens=400, ignore_eos=True, seed=1)
NAME = "model.norm.weight"


@pytest.fixture
async def raw(server_url):  # noqa: F811
    """POST a JSON body to the server as it is: ``(status, parsed answer or text)``."""
    async with aiohttp.ClientSession() as session:

        async def post(route: str, body: object) -> tuple[int, object]:
            async with session.post(f"{server_url}{route}", json=body) as response:
                text = await response.text()
                is_json = response.content_type == "application/json"
                return response.status, (await response.json()) if is_json else text

        yield post


# -- 1. aborts go by exact rid ----------------------------------------------------------------


async def test_a_prefix_abort_reaches_nothing_and_the_client_aborts_each_rid(
    server,  # noqa: F811
    raw,
    chat_prompt,
):
    task = asyncio.create_task(server.generate(chat_prompt, LONG, session_id="p"))
    await asyncio.sleep(1.0)
    assert (await raw("/abort_request", {"rid": "p:"}))[0] == 200
    await asyncio.sleep(0.5)
    assert not task.done()  # the server knows no rid "p:" exactly, so nothing was aborted
    await server.abort("p")
    result = await task
    assert result.finish_reason == "abort" and 0 < len(result.token_ids) < 400


# -- 2. a request aborted before its first token ---------------------------------------------


def test_an_abort_before_the_first_token_has_one_empty_span():
    body = {  # what SGLang 0.5.23 answers (scheduler _make_abort_req, utils/weight_versions.py)
        "output_ids": [],
        "meta_info": {
            "id": "q:1",
            "finish_reason": {"type": "abort", "message": "Aborted", "status_code": 400},
            "completion_tokens": 0,
            "weight_version": "3",
            "weight_versions": [{"version": "3", "start": 0, "end": 0}],
        },
    }
    result = parse_generate_response(body, prompt_tokens=5)
    assert result.token_ids == [] and result.finish_reason == "abort"
    assert result.weight_version == 3 and result.prompt_tokens == 5


async def test_a_queued_request_aborted_returns_no_tokens(server, chat_prompt):  # noqa: F811
    await server.pause()
    try:
        task = asyncio.create_task(server.generate(chat_prompt, SAMPLED, session_id="q"))
        await asyncio.sleep(0.5)
        await server.abort("q")
        result = await task
    finally:
        await server.resume()
    assert result.token_ids == [] and result.finish_reason == "abort"


# -- 3. tensor and broadcast updates need a weight-update session -----------------------------


async def test_updates_run_in_one_weight_update_session_per_sync(server, raw, smollm2):  # noqa: F811
    weight = smollm2.state_dict()[NAME]
    body = {"serialized_named_tensors": [encode_named_tensors([(NAME, weight)])]}
    status, answer = await raw("/update_weights_from_tensor", body)
    assert status == 400 and "between begin_weight_update() and end_weight_update()" in str(answer)
    await server.pause()
    await server.update_weights([(NAME, weight)], 1)
    await server.update_weights([(NAME, weight)], 1)  # a second bucket in the same session
    status, answer = await raw("/begin_weight_update", {})
    assert status == 400 and "already open" in str(answer)
    await server.resume()  # closes it
    assert (await raw("/begin_weight_update", {}))[0] == 200  # a client that dies here ...
    await server.update_weights([(NAME, weight)], 2)  # ... leaves a session this client ends
    assert server.weight_version == 2
    assert (await raw("/begin_weight_update", {}))[0] == 200
    assert (await raw("/end_weight_update", {}))[0] == 200


# -- 4. the cache flush an update asks for ----------------------------------------------------


@pytest.mark.parametrize("pause_mode", ["retract", "in_place"])
async def test_an_update_while_requests_are_paused_succeeds(
    server_url,  # noqa: F811
    smollm2,
    chat_prompt,
    pause_mode,
):
    weight = smollm2.state_dict()[NAME]
    sampling = SamplingParams(max_new_tokens=48, ignore_eos=True, seed=2)
    async with SGLangEngine(server_url, pause_mode=pause_mode) as engine:
        version = engine.weight_version + 1
        task = asyncio.create_task(engine.generate(chat_prompt, sampling, session_id="f"))
        await asyncio.sleep(1.0)
        await engine.pause()
        await engine.update_weights([(NAME, weight)], version)
        await engine.resume()
        result = await task
        # retract: the queue is ignored by a paused flush; in place: the running request keeps
        # the old weights' KV, so the flush is refused (and counted)
        assert engine.unflushed_updates == (pause_mode == "in_place")
    assert result.finish_reason == "length" and len(result.token_ids) == 48
    assert result.token_weight_versions[0] == version - 1
    assert result.token_weight_versions[-1] == version


async def test_a_flush_is_refused_while_requests_run(server, chat_prompt):  # noqa: F811
    task = asyncio.create_task(server.generate(chat_prompt, LONG, session_id="r"))
    await asyncio.sleep(1.0)
    with pytest.raises(ValueError, match="not flushed"):
        await server.flush_cache()
    await server.abort("r")
    await task
    await server.flush_cache()


# -- 7. health while paused -------------------------------------------------------------------


async def test_a_paused_engine_stays_healthy_in_the_pool(server_url, raw):  # noqa: F811
    async with (
        SGLangEngine(server_url) as engine,
        EnginePool([engine], health_interval=0.2, health_timeout=1.0) as pool,
    ):
        await pool.pause()
        try:
            assert await engine.healthy(timeout=2.0)
            await asyncio.sleep(1.5)  # several probes, each shorter than a paused health check
            assert pool.members[0].status == "healthy"
        finally:
            await pool.resume()
    # as SGLang (by default): both health routes generate, so they wait while paused
    assert (await raw("/pause_generation", {"mode": "in_place"}))[0] == 200
    try:
        limit = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=limit) as session:
            for route in ("/health_generate", "/health"):
                with pytest.raises(TimeoutError):
                    await session.get(f"{server_url}{route}")
            async with session.get(f"{server_url}/model_info") as response:
                assert response.status == 200
    finally:
        await raw("/continue_generation", {})


# -- 8. the generation contract ---------------------------------------------------------------


async def test_seeds_stop_ids_and_the_context_limit_mean_the_same_on_sglang():
    bodies = []

    async def sglang(request):  # started without --enable-deterministic-inference
        if request.path == "/model_info":
            return web.json_response({"weight_version": "default"})
        if request.path == "/server_info":
            info = {"tp_size": 1, "enable_deterministic_inference": False, "context_length": 32}
            return web.json_response({**info, "version": "0.5.23"})
        body = await request.json()
        bodies.append(body)
        n = body["sampling_params"]["max_new_tokens"]
        meta = {
            "finish_reason": {"type": "length", "length": n},
            "output_token_logprobs": [[-0.5, 5, None]] * n,
            "weight_version": "default",
        }
        return web.json_response({"output_ids": [5] * n, "meta_info": meta})

    runner, url = await fake_sglang(sglang)
    try:
        async with SGLangEngine(url) as engine:
            with pytest.raises(ValueError, match="--enable-deterministic-inference"):
                await engine.generate([1, 2], SamplingParams(max_new_tokens=2, seed=1))
            both = SamplingParams(max_new_tokens=2, ignore_eos=True, stop_token_ids=(2,))
            with pytest.raises(ValueError, match="ignore_eos also turns off stop_token_ids"):
                await engine.generate([1], both)
            with pytest.raises(ValueError, match="the model's context holds 32"):
                await engine.generate(list(range(32)), SamplingParams(max_new_tokens=1))
            result = await engine.generate(list(range(20)), SamplingParams(max_new_tokens=50))
            assert len(result.token_ids) == 12  # cut to the room left, as the embedded engine
            assert bodies[-1]["sampling_params"]["max_new_tokens"] == 12
        async with SGLangEngine(url, ignore_seeds=True) as engine:
            await engine.generate([1, 2], SamplingParams(max_new_tokens=2, seed=1))
            assert "sampling_seed" not in bodies[-1]["sampling_params"]
        assert len(bodies) == 2  # the refused requests never reached the server
    finally:
        await runner.cleanup()
