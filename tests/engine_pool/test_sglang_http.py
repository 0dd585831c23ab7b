"""`agentrl serve` and `SGLangEngine` over real HTTP on loopback: token-exact against the in-process
engine, session aborts, pause/resume, weight updates by tensor and by disk, and clear errors."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import io
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import aiohttp
import pytest
import torch
from aiohttp import web
from float_tolerance import tolerance

from agentrl.engine_pool.engine import EngineError, SamplingParams
from agentrl.engine_pool.local_engine import LocalEngine
from agentrl.engine_pool.sglang_api import sglang_tensor_payloads
from agentrl.engine_pool.sglang_engine import SGLangEngine, free_port, serve_command
from agentrl.engine_pool.weight_group import WeightUpdateGroup
from agentrl.fp8_weights import quantize_named_tensors, round_trip
from agentrl.training.checkpoint import export_hf

pytestmark = pytest.mark.slow

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(smollm2, tokenizer, tmp_path_factory):
    """SmolLM2 saved as a Hugging Face directory: a server process loads it in a few seconds."""
    path = tmp_path_factory.mktemp("smollm2-hf")
    export_hf(smollm2, tokenizer, path)  # save_pretrained refuses a model loaded from the GGUF
    return path


@pytest.fixture(scope="module")
def server_url(model_dir, tmp_path_factory):
    """One `agentrl serve` process for the module; tests connect with their own SGLangEngine."""
    with running_server(model_dir, tmp_path_factory.mktemp("serve") / "serve.log") as url:
        yield url


@contextlib.contextmanager
def running_server(model_dir: Path, log: Path, *extra: str) -> Iterator[str]:
    """An `agentrl serve` process of ``model_dir`` (with ``extra`` arguments) until exit; its URL."""
    port = free_port()
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [*serve_command(str(model_dir), port), *extra],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while not _healthy(url):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "agentrl serve did not become healthy"
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health_generate", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture
async def server(server_url):
    async with SGLangEngine(server_url) as engine:
        yield engine


def logprob_atol(smollm2_rounding):
    """How far two float32 evaluations of SmolLM2's log-probs at T = 1 (``SAMPLED``) may differ
    (tests/float_tolerance.py)."""
    error, _, magnitude = smollm2_rounding
    return tolerance(error, magnitude)


async def test_tokens_and_logprobs_match_the_in_process_engine(
    server, engine, chat_prompt, smollm2_rounding
):
    remote = await server.generate(chat_prompt, SAMPLED, session_id="a")
    local = await engine.generate(chat_prompt, SAMPLED)
    assert remote.token_ids == local.token_ids
    assert remote.logprobs == pytest.approx(local.logprobs, abs=logprob_atol(smollm2_rounding))
    assert remote.finish_reason == "length" and remote.prompt_tokens == len(chat_prompt)
    assert remote.token_weight_versions == [0] * 12
    stop = remote.token_ids[3]
    until_stop = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7, stop_token_ids=(stop,))
    stopped = await server.generate(chat_prompt, until_stop)
    first = remote.token_ids.index(stop)
    assert stopped.finish_reason == "stop" and stopped.token_ids == remote.token_ids[: first + 1]


async def test_stop_strings_end_requests_as_in_the_in_process_engine(
    server, engine, tokenizer, chat_prompt
):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)
    text = tokenizer.decode((await engine.generate(chat_prompt, greedy)).token_ids)
    stop = (text.split()[len(text.split()) // 2], "no such text")
    sampling = SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True, stop=stop)
    local = await engine.generate(chat_prompt, sampling)
    remote = await server.generate(chat_prompt, sampling)
    assert remote.token_ids == local.token_ids and len(local.token_ids) < 40
    assert remote.finish_reason == local.finish_reason == "stop"
    assert remote.matched_stop == local.matched_stop == stop[0]


async def test_abort_reaches_one_session_and_returns_partial_tokens(server, chat_prompt):
    long = SamplingParams(max_new_tokens=400, ignore_eos=True, seed=1)
    doomed = asyncio.create_task(server.generate(chat_prompt, long, session_id="s:1"))
    # "s:1" must not match "s:10": session ids are quoted in the rid prefix
    spared = asyncio.create_task(server.generate(chat_prompt, SAMPLED, session_id="s:10"))
    await asyncio.sleep(1.5)
    await server.abort("s:1")
    aborted, finished = await asyncio.gather(doomed, spared)
    assert aborted.finish_reason == "abort" and 0 < len(aborted.token_ids) < 400
    assert len(aborted.logprobs) == len(aborted.token_ids)
    assert finished.finish_reason == "length" and len(finished.token_ids) == 12


async def test_pause_holds_requests_until_resume(server, chat_prompt):
    await server.pause()
    task = asyncio.create_task(server.generate(chat_prompt, SAMPLED))
    await asyncio.sleep(1.0)
    assert not task.done()
    assert (await server.server_info())["paused"] is True
    await server.resume()
    assert len((await task).token_ids) == 12


async def test_weight_updates_by_tensor_and_by_disk_set_versions(
    server, smollm2, model_dir, chat_prompt
):
    name = "model.norm.weight"
    before = await server.generate(chat_prompt, SAMPLED)
    original = smollm2.state_dict()[name].clone()
    await server.update_weights([(name, original * 0.5)], version=3)
    assert server.weight_version == 3
    held = await server.get_weights_by_name(name, truncate_size=len(original))  # all of it
    assert torch.equal(held, original * 0.5)
    changed = await server.generate(chat_prompt, SAMPLED)
    assert changed.weight_version == 3 and changed.token_weight_versions == [3] * 12
    assert changed.logprobs != before.logprobs  # the new weights are the ones decoding
    await server.update_weights_from_disk(model_dir, version=4)  # back to the saved weights
    restored = await server.generate(chat_prompt, SAMPLED)
    assert (await server.model_info())["weight_version"] == "4"
    assert restored.token_ids == before.token_ids and restored.token_weight_versions == [4] * 12
    assert torch.equal(await server.get_weights_by_name(name, truncate_size=576), original)
    embedding = await server.get_weights_by_name("model.embed_tokens.weight", truncate_size=3)
    assert torch.equal(embedding, smollm2.state_dict()["model.embed_tokens.weight"][:3])
    with pytest.raises(EngineError, match=r"no weight named 'no\.such\.weight'"):
        await server.get_weights_by_name("no.such.weight")
    with pytest.raises(EngineError, match=r"unknown name 'no\.such\.weight'"):
        await server.update_weights([("no.such.weight", torch.zeros(1))], version=5)
    with pytest.raises(EngineError, match=r"no \.safetensors weights"):
        await server.update_weights_from_disk(model_dir / "missing", version=5)
    assert server.weight_version == 4


async def test_weight_updates_by_broadcast_in_a_process_group(server, smollm2, chat_prompt):
    name = "model.norm.weight"
    original = smollm2.state_dict()[name].clone()
    before = await server.generate(chat_prompt, SAMPLED)
    group = await WeightUpdateGroup.create([server], "127.0.0.1", free_port(), backend="gloo")
    await group.push([(name, original * 0.5), ("lm_head.weight", smollm2.lm_head.weight)], 6)
    changed = await server.generate(chat_prompt, SAMPLED)
    assert server.weight_version == 6 and changed.token_weight_versions == [6] * 12
    assert changed.logprobs != before.logprobs
    await group.push([(name, original)], 7)
    restored = await server.generate(chat_prompt, SAMPLED)
    assert restored.token_ids == before.token_ids and restored.weight_version == 7
    with pytest.raises(EngineError, match="no weight-update group 'other'"):
        await server.update_weights_from_distributed(
            [name], ["float32"], [[576]], 8, group_name="other"
        )
    await group.close()  # both sides leave, so the name serves a new group
    again = await WeightUpdateGroup.create([server], "127.0.0.1", free_port(), backend="gloo")
    await again.push([(name, original)], 8)
    assert server.weight_version == 8
    await again.close()


async def test_bad_requests_get_400_with_sglang_error_bodies(server):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await server.generate([10**9], SAMPLED)
    async with aiohttp.ClientSession() as session:
        cases = [
            ("not json", "invalid JSON"),
            (json.dumps({"text": "hi"}), "send `input_ids`"),
            (json.dumps({"input_ids": [[1], [2]]}), "batched"),
            (json.dumps({"input_ids": [1], "sampling_params": {"top_p": 2}}), "top_p"),
        ]
        for body, message in cases:
            async with session.post(f"{server.url}/generate", data=body) as response:
                assert response.status == 400
                assert message in (await response.json())["error"]["message"]
        unknown = {"input_ids": [1], "sampling_params": {"seed": 1}}
        async with session.post(f"{server.url}/generate", json=unknown) as response:
            # SGLang's contract gate: the error is a string that names the key
            assert response.status == 400
            assert (await response.json())["error"].startswith("unknown field `seed`, expected")
        async with session.post(f"{server.url}/pause_generation", json={"mode": "nap"}) as r:
            assert r.status == 400
        async with session.post(f"{server.url}/flush_cache") as r:
            assert r.status == 200 and (await r.text()).startswith("Cache flushed.")


async def test_streaming_ends_with_done(server, chat_prompt):
    body = {"input_ids": chat_prompt, "sampling_params": {"max_new_tokens": 3}, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.url}/generate", json=body) as response,
    ):
        events = [line for line in (await response.text()).split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    final = json.loads(events[-2].removeprefix("data: "))
    assert len(final["output_ids"]) == 3 and final["meta_info"]["completion_tokens"] == 3


def sglang_info(request: web.Request, weight_version: str = "default") -> web.Response | None:
    """What SGLang 0.5.23 answers on ``/model_info`` and ``/server_info`` (flat server args and
    its version), for stand-ins of SGLang; ``None`` for any other route."""
    if request.path == "/model_info":
        return web.json_response({"model_path": "m", "weight_version": weight_version})
    if request.path == "/server_info":
        return web.json_response(
            {"tp_size": 1, "enable_deterministic_inference": True, "version": "0.5.23"}
        )
    return None


async def fake_sglang(handler) -> tuple[web.AppRunner, str]:
    """A stand-in for a misbehaving SGLang server (outside this project)."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (lambda: web.Response(text="<html>oops</html>"), "not JSON"),
        (lambda: web.json_response({"output_ids": [1, 2]}), "malformed /generate response"),
        (
            lambda: web.json_response(
                {
                    "output_ids": [5],
                    "meta_info": {
                        "finish_reason": {"type": "stop"},
                        "output_token_logprobs": [[-0.1, 6, None]],
                    },
                }
            ),
            "not for its output_ids",
        ),
        (lambda: web.json_response({"error": {"message": "boom"}}, status=500), "HTTP 500: boom"),
    ],
)
async def test_malformed_responses_and_http_errors_are_engine_errors(reply, message):
    async def handler(request):
        return sglang_info(request) or reply()

    runner, url = await fake_sglang(handler)
    try:
        async with SGLangEngine(url) as engine:
            with pytest.raises(EngineError, match=message):
                await engine.generate([1, 2], SAMPLED)
    finally:
        await runner.cleanup()


async def test_hung_and_dead_servers_are_engine_errors():
    released = asyncio.Event()  # the hung handler returns once the test is done with it

    async def handler(request):
        if info := sglang_info(request, weight_version="7"):
            return info
        await asyncio.wait_for(released.wait(), timeout=60)
        return web.json_response({})

    runner, url = await fake_sglang(handler)
    try:
        async with SGLangEngine(url, request_timeout=1.0) as engine:
            assert engine.weight_version == 7
            with pytest.raises(EngineError, match="no answer within 1 s"):
                await engine.generate([1], SAMPLED)
    finally:
        released.set()  # else the server's cleanup waits out the handler (aiohttp's grace period)
        await runner.cleanup()
    with pytest.raises(EngineError, match=r"Cannot connect|ClientConnector"):
        await SGLangEngine(url).start()


def test_serve_cli_help():
    result = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "serve", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "--max-batch-size" in result.stdout


_READ_IN_ANOTHER_PROCESS = """
import base64, json, pickle, sys
import torch.multiprocessing  # noqa: F401  (torch's rebuild functions)
named = pickle.loads(base64.b64decode(sys.stdin.read()))
print(json.dumps([(name, str(tensor.dtype), tensor.float().tolist()) for name, tensor in named]))
"""


async def test_sglang_payloads_are_one_dump_per_rank_readable_by_an_unrelated_process():
    received = {}

    async def sglang(request):
        if info := sglang_info(request):
            return info
        received[request.path] = await request.json()
        return web.json_response({"success": True, "message": "ok"})

    runner, url = await fake_sglang(sglang)
    tensors = [("a.weight", torch.arange(6.0).reshape(2, 3).t()), ("b.bias", torch.ones(2))]
    try:
        async with SGLangEngine(url, tp_size=2) as engine:
            assert engine.tensor_format == "sglang"  # "auto" for an SGLang server
            await engine.update_weights(tensors, 3)
            assert engine.weight_version == 3
        body = received["/update_weights_from_tensor"]
        first, second = body["serialized_named_tensors"]
        assert body["weight_version"] == "3"
        # each rank's dump holds its own reference to the shared memory: both can be read
        assert {"/begin_weight_update", "/end_weight_update"} <= set(received)
        for entry in (first, second):  # a fresh interpreter, not a child: no shared authkey
            read = subprocess.run(
                [sys.executable, "-c", _READ_IN_ANOTHER_PROCESS],
                input=entry,
                capture_output=True,
                text=True,
                check=True,
            )
            assert json.loads(read.stdout) == [
                ["a.weight", "torch.float32", [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]],
                ["b.bias", "torch.float32", [1.0, 1.0]],
            ]
        assert not tensors[0][1].is_shared()  # the caller's tensors stay where they were
    finally:
        await runner.cleanup()
    with pytest.raises(ValueError, match="tensor_format"):
        SGLangEngine(url, tensor_format="pickle")


class _Shell:
    """Unpickling calls os.system: what a payload of foreign globals would do if read."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


async def test_agentrl_serve_reads_sglang_by_reference_payloads_and_refuses_the_rest(
    server_url, smollm2, tmp_path
):
    """SGLang's own payload format (tensors in shared memory named by file, agentrl's sender
    here; SGLang's and verl's senders in test_verl_client) loads into `agentrl serve`; payloads
    it cannot or must not read are refused with a reason, and the weights stay as they were."""
    name = "model.norm.weight"
    original = smollm2.state_dict()[name].clone()

    async def held(engine: SGLangEngine) -> torch.Tensor:
        return await engine.get_weights_by_name(name, truncate_size=len(original))

    async with SGLangEngine(server_url, tensor_format="sglang") as engine:
        version = engine.weight_version + 1
        await engine.update_weights([(name, original * 0.25)], version)
        assert torch.equal(await held(engine), original * 0.25)
        assert engine.weight_version == version
        await engine.update_weights([(name, original)], version)
        assert torch.equal(await held(engine), original)

        def dump(obj: object) -> str:
            buffer = io.BytesIO()
            ForkingPickler(buffer).dump(obj)  # torch's default strategy: a file descriptor
            return base64.b64encode(buffer.getvalue()).decode()

        marker = tmp_path / "ran"
        refused = {
            "file descriptor": ({}, dump([(name, original * 2)])),
            "refused to unpickle posix.system": ({}, dump([(name, _Shell(marker))])),
            "not a list of \\(name, tensor\\) pairs": ({}, dump({"a": 1})),
            "load_format 'my.loader.Load' is not served": (
                {"load_format": "my.loader.Load"},
                sglang_tensor_payloads([(name, original * 2)])[0],
            ),
            "not base64": ({}, "%%%"),
        }
        async with aiohttp.ClientSession() as session:

            async def post(route: str, body: dict) -> tuple[int, dict]:
                async with session.post(f"{server_url}{route}", json=body) as response:
                    return response.status, await response.json()

            for message, (extra, payload) in refused.items():
                assert (await post("/begin_weight_update", {}))[0] == 200
                body = {"serialized_named_tensors": [payload], "weight_version": "99", **extra}
                status, answer = await post("/update_weights_from_tensor", body)
                assert (await post("/end_weight_update", {}))[0] == 200
                assert status == 400 and answer["success"] is False, answer
                assert re.search(message, answer["message"]), answer["message"]
        assert not marker.exists()
        assert torch.equal(await held(engine), original)
        assert (await engine.model_info())["weight_version"] == str(version)


async def test_auto_tensor_format_is_agentrl_for_agentrl_serve(server):
    assert server.tensor_format == "agentrl" and server.server.kind == "agentrl"


async def test_serve_with_fp8_weights_takes_fp8_pairs_and_runs_as_the_embedded_engine(
    model_dir, smollm2, tokenizer, chat_prompt, tmp_path, smollm2_rounding
):
    """`agentrl serve --fp8-weights` computes with blockwise-FP8 weights and loads FP8 pairs
    sent over HTTP: its tokens and log-probs are the in-process FP8 engine's."""
    name = "model.layers.3.mlp.down_proj.weight"
    new = smollm2.state_dict()[name] * 1.5
    bucket = list(quantize_named_tensors([(name, new)], frozenset([name])))
    with running_server(model_dir, tmp_path / "serve.log", "--fp8-weights") as url:
        async with SGLangEngine(url) as remote:
            await remote.update_weights(bucket, version=1)
            served = await remote.generate(chat_prompt, SAMPLED)
    model = copy.deepcopy(smollm2)
    async with LocalEngine(model, tokenizer=tokenizer, fp8_weights=True) as local:
        assert torch.equal(model.state_dict()[name], round_trip(smollm2.state_dict()[name]))
        await local.update_weights(bucket, version=1)
        assert torch.equal(model.state_dict()[name], round_trip(new))
        expected = await local.generate(chat_prompt, SAMPLED)
    assert served.token_ids == expected.token_ids  # float rounding: measured up to 1.2e-5
    # FP8-rounded weights move by at most 2^-4 of their size: the same model's float32 rounding
    assert served.logprobs == pytest.approx(expected.logprobs, abs=logprob_atol(smollm2_rounding))
    assert served.token_weight_versions == [1] * len(served.token_ids)
