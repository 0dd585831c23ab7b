"""The SGLang client against SGLang 0.5.23's own code: request bodies, tensor payloads, process group.

SGLang cannot serve on these CPU machines, but the parts of it that judge a client run on the CPU:
its HTTP app and tokenizer manager, its tensor deserializer, ``init_custom_process_group``. They
run in a side virtualenv (``scripts/setup-sglang-env``, ``.venv-sglang``) through the harness
``sglang_conformance/sglang_side.py``; ``docs/sglang_conformance.md`` has the details.

a. Every request the real ``SGLangEngine`` sends (captured by a recording double of an SGLang
   server on loopback) is accepted by SGLang's HTTP app and tokenizer manager.
b. Every ``serialized_named_tensors`` entry it sends decodes, in the SGLang process, with SGLang's
   deserializer and ``SafeUnpickler`` to the tensors that were sent; agentrl's own format does not.
c. ``WeightUpdateGroup`` (the trainer) and SGLang's ``init_custom_process_group`` (test doubles of
   two servers, TP sizes 2 and 1, whose ranks are SGLang processes) form one group, and a pushed
   bucket arrives intact at every rank.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web
from sglang_conformance.sglang_side import describe_tensor  # the checksum both sides compute
from test_sglang_http import free_port

from agentrl.engine_pool.engine import SamplingParams
from agentrl.engine_pool.sglang_api import encode_named_tensors, generate_request
from agentrl.engine_pool.sglang_engine import SGLangEngine
from agentrl.fp8_weights import dequantize_blockwise, quantize_named_tensors
from agentrl.models import SMOLLM2, resolve_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SIDE_VENV = ROOT / ".venv-sglang"
SIDE_PYTHON = SIDE_VENV / "bin" / "python"
HARNESS = Path(__file__).parent / "sglang_conformance" / "sglang_side.py"
TRAINER_SIDE = Path(__file__).parent / "sglang_conformance" / "trainer_side.py"

# What the recording double's /server_info reports, and how the harness's SGLang is configured.
SERVER_FACTS = {
    "version": "0.5.23",
    "tp_size": 1,
    "enable_deterministic_inference": True,  # so that seeded requests are sent, not refused
    "allow_auto_truncate": False,
    "skip_tokenizer_init": False,  # as agentrl launches SGLang: stop strings need the tokenizer
    "context_length": 2048,
}
VOCAB_SIZE = 49152  # SmolLM2's; the harness's model config uses it


@pytest.fixture(scope="module")
def side_python() -> Path:
    """The SGLang venv's interpreter; missing, the tests fail (CI must not skip them)."""
    if not SIDE_PYTHON.exists() or not (SIDE_VENV / ".sglang-conformance-installed").exists():
        pytest.fail(
            f"the SGLang conformance venv is missing or incomplete ({SIDE_VENV}): run "
            "scripts/setup-sglang-env (make test does)",
            pytrace=False,
        )
    return SIDE_PYTHON


def run_process(
    argv: list[str], payload: str | None, hang_guard_s: float, env: dict[str, str] | None = None
) -> str:
    """Run ``argv`` in a process group of its own, killed (with anything it started) on every
    exit path; ``hang_guard_s`` only bounds a hang. Returns stdout; fails with stderr's tail."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        out, err = process.communicate(payload, timeout=hang_guard_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(argv[:3])} did not finish within {hang_guard_s:g} s", pytrace=False)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    if process.returncode != 0:
        pytest.fail(f"{' '.join(argv[:3])} exited {process.returncode}:\n{err[-4000:]}")
    return out


def side(python: Path, command: str, spec: Any, hang_guard_s: float = 300) -> Any:
    """One harness subcommand in the SGLang venv: JSON in, JSON out."""
    return json.loads(
        run_process([str(python), str(HARNESS), command], json.dumps(spec), hang_guard_s)
    )


# -- the recording double of an SGLang server ------------------------------------------------


class RecordingServer:
    """Records every request (method, route, body) and answers as SGLang 0.5.23's http_server.py
    does. A POST route it does not know answers ``{"success": true, "message": "ok"}``, so the
    client may add routes. ``/generate`` requests of session ``held`` are held until an
    ``/abort_request`` names their rid (exactly or by prefix) or ``abort_all``."""

    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = dict(facts)
        self.requests: list[dict[str, Any]] = []
        self.weight_version = "0"
        self.held: dict[str, asyncio.Future[None]] = {}
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> RecordingServer:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def close(self) -> None:
        for waiter in self.held.values():
            if not waiter.done():
                waiter.set_result(None)
        if self._runner is not None:
            await self._runner.cleanup()

    def since(self, start: int, route: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.requests[start:] if route is None or r["route"] == route]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.text()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        route = request.path
        self.requests.append(
            {"method": request.method, "route": route, "raw_body": raw, "body": body}
        )
        if request.method == "GET":
            return self._get(route)
        body = body if isinstance(body, dict) else {}
        if route == "/generate":
            return web.json_response(await self._generate(body))
        if route == "/abort_request":
            self._abort(body)
            return web.Response(status=200)
        if route == "/flush_cache":
            return web.Response(text="Cache flushed.\nPlease check backend logs for more details.")
        if route in ("/pause_generation", "/continue_generation"):
            verb = "paused" if route == "/pause_generation" else "continued"
            return web.json_response(
                {"message": f"Generation {verb} successfully.", "status": "ok"}
            )
        if route == "/update_weight_version" and "new_version" in body:
            self.weight_version = str(body["new_version"])
        elif "weight_version" in body and body["weight_version"] is not None:
            self.weight_version = str(body["weight_version"])
        answer: dict[str, Any] = {"success": True, "message": "ok"}
        if route == "/update_weights_from_disk":
            answer["num_paused_requests"] = 0
        return web.json_response(answer)

    def _get(self, route: str) -> web.StreamResponse:
        if route in ("/model_info", "/get_model_info"):
            return web.json_response(
                {
                    "model_path": "recording-double",
                    "tokenizer_path": None,
                    "is_generation": True,
                    "weight_version": self.weight_version,
                    "context_length": self.facts["context_length"],
                }
            )
        if route in ("/server_info", "/get_server_info"):
            return web.json_response({**self.facts, "internal_states": [{}], "frontend": "python"})
        if route in ("/health", "/health_generate"):
            return web.Response(status=200)
        return web.json_response({"detail": "Not Found"}, status=404)

    async def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        rid = str(body.get("rid"))
        params = body.get("sampling_params") or {}
        version = self.weight_version
        meta: dict[str, Any] = {"id": rid, "cached_tokens": 0, "weight_version": version}
        if rid.startswith("held:"):
            waiter = self.held[rid] = asyncio.get_running_loop().create_future()
            await waiter
            meta.update(
                finish_reason={"type": "abort", "message": "Abort in waiting queue"},
                completion_tokens=0,
                weight_versions=[{"version": version, "start": 0, "end": 0}],
                output_token_logprobs=[],
            )
            return {"output_ids": [], "meta_info": meta}
        count = max(1, min(int(params.get("max_new_tokens") or 3), 3))
        tokens = [100 + i for i in range(count)]
        stops = params.get("stop_token_ids") or []
        if stops:
            tokens = [*tokens[: count - 1], int(stops[0])]
            finish: dict[str, Any] = {"type": "stop", "matched": int(stops[0])}
        else:
            finish = {"type": "length", "length": count}
        meta.update(
            finish_reason=finish,
            prompt_tokens=len(body.get("input_ids") or []),
            completion_tokens=len(tokens),
            weight_versions=[{"version": version, "start": 0, "end": len(tokens)}],
            output_token_logprobs=[[-0.5, token, None] for token in tokens],
        )
        return {"output_ids": tokens, "meta_info": meta}

    def _abort(self, body: dict[str, Any]) -> None:
        rid = str(body.get("rid") or "")
        for held_rid, waiter in self.held.items():
            if not waiter.done() and (body.get("abort_all") or (rid and held_rid.startswith(rid))):
                waiter.set_result(None)


@pytest.fixture
async def recording_server():
    server = await RecordingServer(SERVER_FACTS).start()
    try:
        yield server
    finally:
        await server.close()


def harness_server_options() -> dict[str, Any]:
    """The harness's SGLang configured as the double says the server is. Not
    ``enable_deterministic_inference``: SGLang refuses it on a CPU (no deterministic attention
    backend), and neither its HTTP layer nor its tokenizer manager reads it."""
    return {
        "vocab_size": VOCAB_SIZE,
        "context_length": SERVER_FACTS["context_length"],
        "server_args": {
            "allow_auto_truncate": SERVER_FACTS["allow_auto_truncate"],
            "skip_tokenizer_init": SERVER_FACTS["skip_tokenizer_init"],
            "tokenizer_path": str(resolve_model(SMOLLM2).directory),  # SmolLM2's tokenizer
        },
    }


def small_tensors() -> list[tuple[str, torch.Tensor]]:
    """float32 and bfloat16 tensors, a non-contiguous view, a one-element and an empty tensor."""
    generator = torch.Generator().manual_seed(7)
    base = torch.randn(5, 6, generator=generator)
    return [
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(4, 6, generator=generator)),
        ("model.norm.weight", torch.randn(6, generator=generator).to(torch.bfloat16)),
        ("lm_head.weight", base.t()[1:4]),  # a view with strides (1, 6)
        ("model.layers.0.scale", torch.tensor([0.25])),
        ("model.layers.0.empty", torch.zeros(0, 3)),
    ]


# -- a. request bodies -----------------------------------------------------------------------


async def drive_every_call(server: RecordingServer) -> list[str]:
    """Every public call of SGLangEngine, as a trainer and rollout workers make them. A call that
    raises is noted and the rest still run (their requests are checked too); returns the notes."""
    failures: list[str] = []

    async def call(label: str, awaitable: Any) -> Any:
        try:
            return await awaitable
        except Exception as exc:
            failures.append(f"{label}: {type(exc).__name__}: {exc}")
            return None

    tensors = small_tensors()
    names = [name for name, _ in tensors]
    dtypes = [str(t.dtype).removeprefix("torch.") for _, t in tensors]
    shapes = [list(t.shape) for _, t in tensors]
    prompt = [1, 17, 42, 99]
    samplings = [
        SamplingParams(max_new_tokens=3),
        SamplingParams(temperature=0.0, max_new_tokens=2),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=3, seed=11),
        SamplingParams(temperature=1.0, top_k=0, max_new_tokens=3, stop_token_ids=(2, 7)),
        SamplingParams(max_new_tokens=3, ignore_eos=True, seed=0),
        SamplingParams(max_new_tokens=3, stop=("</search>", "\n\n")),
        SamplingParams(
            max_new_tokens=3,
            frequency_penalty=0.5,
            presence_penalty=-0.5,
            repetition_penalty=1.2,
            min_new_tokens=2,
        ),
    ]
    async with SGLangEngine(server.url) as engine:
        for i, sampling in enumerate(samplings):
            await call(f"generate({sampling})", engine.generate(prompt, sampling, f"s:{i}"))
        await call("generate(no session)", engine.generate(prompt, samplings[1]))
        await call("healthy()", engine.healthy())
        await call("model_info()", engine.model_info())
        await call("server_info()", engine.server_info())

        # a request in flight, aborted by its session; then all requests aborted
        held = asyncio.create_task(
            call("generate(held)", engine.generate(prompt, samplings[0], "held"))
        )
        while not server.held and not held.done():  # until it is in flight at the server
            await asyncio.sleep(0.01)
        await call("abort('held')", engine.abort("held"))
        await call("the aborted request", asyncio.wait_for(held, 60))  # a hang guard
        await call("abort(None)", engine.abort(None))
        await call("abort(unknown)", engine.abort("no-such-session"))
        await call("flush_cache()", engine.flush_cache())

        # weight updates: by tensor, from disk, by broadcast; unpaused, then inside a pause
        await call("update_weights", engine.update_weights(tensors, version=1))
        await call(
            "update_weights_from_disk",
            engine.update_weights_from_disk("/tmp/agentrl-conformance-weights", version=2),
        )
        await call(
            "init_weights_update_group",
            engine.init_weights_update_group(
                "127.0.0.1", 29555, 1, 2, group_name="conformance_group", backend="gloo"
            ),
        )
        await call(
            "update_weights_from_distributed",
            engine.update_weights_from_distributed(
                names, dtypes, shapes, 3, group_name="conformance_group"
            ),
        )
        await call("pause()", engine.pause())
        await call("healthy() while paused", engine.healthy())
        await call("update_weights while paused", engine.update_weights(tensors, version=4))
        await call(
            "update_weights_from_distributed while paused",
            engine.update_weights_from_distributed(
                names, dtypes, shapes, 5, group_name="conformance_group"
            ),
        )
        await call("resume()", engine.resume())
        await call("generate after resume", engine.generate(prompt, samplings[1], "after"))
    return failures


async def test_every_request_the_client_sends_is_accepted_by_sglang(recording_server, side_python):
    failures = await drive_every_call(recording_server)
    sent = list(recording_server.requests)
    routes = {r["route"] for r in sent}
    assert "/generate" in routes
    assert {"/update_weights_from_tensor", "/update_weights_from_distributed"} <= routes
    assert {"/update_weights_from_disk", "/init_weights_update_group"} <= routes

    requests = [
        {"route": r["route"], "method": r["method"], "raw_body": r["raw_body"]} for r in sent
    ]
    verdicts = await asyncio.to_thread(
        side, side_python, "check-requests", {"requests": requests, **harness_server_options()}
    )
    assert len(verdicts) == len(sent)
    refused = [
        f"#{i} {v['method']} {v['route']} {r['raw_body'][:300]}\n    -> {v.get('error')}"
        f"\n    (after: {' '.join(p['route'] for p in sent[max(0, i - 3) : i])})"
        for i, (v, r) in enumerate(zip(verdicts, sent, strict=True))
        if not v["accepted"]
    ]
    assert not refused and not failures, (
        "SGLang 0.5.23 refuses requests the client sends:\n"
        + "\n".join(refused or ["(none)"])
        + "\nclient calls that failed against the recording double (it answers as SGLang):\n"
        + "\n".join(failures or ["(none)"])
    )
    # every /generate reached SGLang's scheduler as a tokenized request
    for verdict in verdicts:
        if verdict["route"] == "/generate":
            kinds = [m["type"] for m in verdict["scheduler_received"]]
            assert kinds == ["TokenizedGenerateReqInput"], verdict


# -- b. tensor payloads ----------------------------------------------------------------------


async def test_stop_strings_need_a_server_with_its_tokenizer_and_the_client_says_so(side_python):
    """SGLang refuses stop strings under ``--skip-tokenizer-init``; the client refuses them before
    sending to a server that reports the flag, with a message that names it."""
    no_tokenizer = {**SERVER_FACTS, "skip_tokenizer_init": True}
    server = await RecordingServer(no_tokenizer).start()
    try:
        async with SGLangEngine(server.url) as engine:
            with pytest.raises(ValueError, match="--skip-tokenizer-init and so cannot match stop"):
                await engine.generate([1, 2], SamplingParams(max_new_tokens=2, stop=("</s>",)))
            await engine.generate([1, 2], SamplingParams(max_new_tokens=2))  # still serves
    finally:
        await server.close()
    body = generate_request([1, 17, 42], SamplingParams(max_new_tokens=3, stop=("</search>",)), "r")
    request = {"route": "/generate", "method": "POST", "body": body}
    options = harness_server_options()
    options["server_args"] = {**options["server_args"], "skip_tokenizer_init": True}
    (refused,) = await asyncio.to_thread(
        side, side_python, "check-requests", {"requests": [request], **options}
    )
    assert not refused["accepted"] and "skip_tokenizer_init" in refused["error"]


async def test_tensor_payloads_decode_in_sglang_to_the_tensors_sent(recording_server, side_python):
    recording_server.facts["tp_size"] = 2  # the default client sends one entry per TP rank
    tensors = small_tensors()  # alive until the SGLang process has read them
    expected = [describe_tensor(name, tensor) for name, tensor in tensors]
    problems = []
    for options in ({"tensor_format": "sglang", "tp_size": 2}, {}):
        start = len(recording_server.requests)
        async with SGLangEngine(recording_server.url, **options) as engine:
            await engine.update_weights(tensors, version=1)
            label = f"SGLangEngine(url, {options}) (tensor_format={engine.tensor_format!r})"
        bodies = [r["body"] for r in recording_server.since(start, "/update_weights_from_tensor")]
        assert bodies, f"{label} sent no /update_weights_from_tensor"
        for body in bodies:
            entries = body["serialized_named_tensors"]
            if len(entries) != 2:
                problems.append(f"{label}: {len(entries)} entries for TP size 2, not one per rank")
            decoded = await asyncio.to_thread(side, side_python, "decode-payloads", {"body": body})
            if any("error" in entry for entry in decoded):  # for the message: is it the unpickler?
                plain = await asyncio.to_thread(
                    side, side_python, "decode-payloads", {"body": body, "loader": "pickle"}
                )
                plain_errors = [entry.get("error", "decoded") for entry in plain]
            for entry in decoded:
                if "error" in entry:
                    problems.append(
                        f"{label}: rank {entry['rank']}: SGLang's deserializer failed: "
                        f"{entry['error']} (the plain pickle loader, same bytes, after: "
                        f"{plain_errors})"
                    )
                elif entry["tensors"] != expected:
                    problems.append(
                        f"{label}: rank {entry['rank']} decoded {entry['tensors']}, sent {expected}"
                    )
    assert not problems, "\n".join(problems)
    del tensors  # kept alive until here, after the SGLang process read them


async def test_agentrl_tensor_format_is_refused_by_sglangs_unpickler(side_python):
    body = {"serialized_named_tensors": [encode_named_tensors(small_tensors())]}
    decoded = await asyncio.to_thread(side, side_python, "decode-payloads", {"body": body})
    assert [("error" in entry) for entry in decoded] == [True], decoded
    assert "UnpicklingError" in decoded[0]["error"] or "Blocked" in decoded[0]["error"], decoded


async def test_fp8_weights_fit_sglangs_fp8_layers_and_dequantise_to_ours(
    recording_server, side_python
):
    """Blockwise-FP8 weight sync: the pairs agentrl sends, through SGLang's unpickler, into the
    parameters SGLang's FP8 linear layer registers, and back through SGLang's own dequantisation,
    give bit for bit the weights `agentrl.fp8_weights` dequantises (what LocalEngine runs)."""
    generator = torch.Generator().manual_seed(3)
    shapes = {  # prefix -> (out, in); partial blocks on both sides in the first
        "model.layers.0.mlp.down_proj": (300, 200),
        "model.layers.0.self_attn.o_proj": (256, 128),
        "model.layers.1.mlp.up_proj": (128, 576),
    }
    weights = [(f"{p}.weight", torch.randn(s, generator=generator)) for p, s in shapes.items()]
    bucket = list(quantize_named_tensors(weights, frozenset(n for n, _ in weights)))
    recording_server.facts["tp_size"] = 1
    start = len(recording_server.requests)
    async with SGLangEngine(recording_server.url, tensor_format="sglang") as engine:
        await engine.update_weights(bucket, version=1)
    (body,) = [r["body"] for r in recording_server.since(start, "/update_weights_from_tensor")]
    layers = {p: {"output_partition_sizes": [s[0]], "input_size": s[1]} for p, s in shapes.items()}
    # SmolLM2's fused q/k/v projection (576 + 192 + 192 outputs): SGLang refuses 128x128 blocks
    layers["model.layers.0.self_attn.qkv_proj"] = {
        "output_partition_sizes": [576, 192, 192],
        "input_size": 576,
    }
    result = await asyncio.to_thread(
        side, side_python, "fp8-layers", {"body": body, "layers": layers}
    )
    sent = dict(bucket)
    for prefix, (rows, cols) in shapes.items():
        scales = [-(-rows // 128), -(-cols // 128)]
        layout = {"weight": ["torch.float8_e4m3fn", [rows, cols]]}
        layout["weight_scale_inv"] = ["torch.float32", scales]
        assert result[prefix]["params"] == layout, result[prefix]
        assert result[prefix]["sent"] == layout, result[prefix]
        ours = dequantize_blockwise(sent[f"{prefix}.weight"], sent[f"{prefix}.weight_scale_inv"])
        assert result[prefix]["dequantized"] == describe_tensor(f"{prefix}.weight", ours)
    refusal = result["model.layers.0.self_attn.qkv_proj"]["error"]
    assert "576 is not divisible by weight quantization block_n = 128" in refusal


# -- c. the weight-update process group ------------------------------------------------------


def test_trainer_and_sglang_ranks_form_one_group_and_a_bucket_arrives(side_python, tmp_path):
    tp_sizes = [2, 1]  # engine 1's offset (3) tells "1 + TP sizes before it" from "1 + index"
    spec = {
        "side_python": str(side_python),
        "harness": str(HARNESS),
        "tp_sizes": tp_sizes,
        "master_port": free_port(),
        "timeout_s": 60,  # the rendezvous; a mismatch blocks both sides until it
        "log_dir": str(tmp_path),
    }
    # this checkout's agentrl, whichever one the interpreter's editable install points at
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    out = run_process([sys.executable, str(TRAINER_SIDE), json.dumps(spec)], None, 300, env)
    result = json.loads(out)
    assert Path(result["agentrl"]).is_relative_to(ROOT), result["agentrl"]
    world_size = 1 + sum(tp_sizes)
    told = [engine["told"] for engine in result.get("engines", [])]
    assert "error" not in result, (
        f"{result['error']}\nwhat the engines were told: {told} (expected rank_offset 1 and 3, "
        f"world_size {world_size})"
    )
    assert [(t["rank_offset"], t["world_size"]) for t in told] == [(1, world_size), (3, world_size)]
    for index, engine in enumerate(result["engines"]):
        assert len(engine["received"]) == engine["tp_size"]
        for tp_rank, received in enumerate(engine["received"]):
            assert received == result["sent"], f"engine {index} TP rank {tp_rank}"
