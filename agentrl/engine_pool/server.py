"""``agentrl serve``: the embedded engine behind an aiohttp server speaking SGLang's native HTTP API.

Same routes and shapes as SGLang (see :mod:`agentrl.engine_pool.sglang_api` and
``docs/sglang_http_api.md``), so :class:`~agentrl.engine_pool.sglang_engine.SGLangEngine` talks to
either, and CPU users can run engines in separate processes. Routes:

========================================  ========================================================
``POST /generate``                         one prompt of ``input_ids``; ``stream`` sends the final
                                           chunk as one SSE event, then ``data: [DONE]``
``GET /health``, ``GET /health_generate``  200 when serving (``health_generate`` decodes a token)
``GET /model_info`` (``/get_model_info``)  model path, ``weight_version``, context length
``GET /server_info`` (``/get_server_info``) engine counters (prefix-cache hits, tokens) and state
``GET|POST /flush_cache``                  empties the prefix cache (plain text, as SGLang)
``POST /pause_generation``                 ``{"mode": "abort"|"retract"|"in_place"}``
``POST /continue_generation``              resumes
``POST /abort_request``                    ``{"rid": rid, "abort_all": bool}``; 200, empty body
``POST /update_weights_from_disk``         ``{"model_path", "weight_version"}``: a safetensors dir
``POST /update_weights_from_tensor``       ``{"serialized_named_tensors": [b64], "weight_version"}``
``POST /update_weight_version``            ``{"new_version"}``
``POST /begin_weight_update``              open the weight-update session (``/end_weight_update``
                                           closes it); tensor and broadcast updates need one
``POST /init_weights_update_group``        join a gloo (CPU) or nccl group as ``rank_offset``
``POST /update_weights_from_distributed``  ``{"names", "dtypes", "shapes"}``: receive broadcasts
``POST /destroy_weights_update_group``     ``{"group_name"}``: leave the group
``GET|POST /get_weights_by_name``         ``{"name", "truncate_size"}``: the first rows of a
                                           weight as the engine holds it (float values)
========================================  ========================================================

:func:`serve` also mounts the OpenAI-compatible routes (``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``, ``/sessions/...``) of :mod:`agentrl.engine_pool.gateway`.

Where the client depends on it, it behaves as SGLang 0.5.23 does (``docs/sglang_http_api.md``):

* ``/abort_request`` looks the ``rid`` up exactly and does nothing for an unknown one; a known one
  aborts every request whose rid starts with it (SGLang's scheduler matches by prefix).
* ``/update_weights_from_tensor`` and ``/update_weights_from_distributed`` refuse outside a
  weight-update session (the distributed one then receives nothing, so the sender's broadcast
  waits, as on SGLang).
* A cache flush (``/flush_cache``, or an update's ``flush_cache``, true by default) is refused
  while requests run: paused ``in_place`` or not paused at all. Requests paused by ``retract`` are
  waiting, not running, so it goes ahead. A refused flush fails the update (``success: false``)
  although the weights were loaded (SGLang 0.5.22+).
* ``/health_generate`` and ``/health`` (SGLang's default makes both generate) wait while
  generation is paused and answer 503 after 20 s.
* A request aborted before its first token answers one weight-version span ``start == end == 0``.

Differences from SGLang, by design: prompts are token ids only (no ``text``, no batches, ``n`` = 1);
responses carry no ``text``; ``sampling_seed`` always applies; a streamed request gets only its final
chunk. ``/update_weights_from_tensor`` takes agentrl's portable encoding (base64 of ``torch.save``
of a list of ``(name, tensor)``; loaded with ``weights_only=True``) as well as SGLang's
by-reference dumps (:mod:`agentrl.engine_pool.tensor_refs`: CPU tensors in shared memory named
by file, CUDA-IPC handles, flattened buckets; the sender must be on this machine). Weight versions are
integers written as strings. Bad requests get 400 ``{"error": {"message": ...}}``; a request to an
engine that can no longer serve gets 503.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from agentrl.engine_pool.engine import EngineError, SamplingParams
from agentrl.engine_pool.gateway import Gateway, GatewayRoutes
from agentrl.engine_pool.local_engine import LocalEngine
from agentrl.engine_pool.sglang_api import (
    ContractError,
    ProtocolError,
    decode_named_tensors,
    error_body,
    generate_response,
    loads_body,
    parse_generate_request,
    parse_version,
)
from agentrl.engine_pool.sglang_sampling import response_text, text_options
from agentrl.engine_pool.weight_group import DEFAULT_GROUP, join_group, leave_group, receive
from agentrl.http_app import serve_app
from agentrl.models import load_tokenizer

_HEALTH_TIMEOUT_S = 20.0


class EngineServer:
    """The routes above around one started :class:`LocalEngine`; ``app`` is the aiohttp app."""

    def __init__(self, engine: LocalEngine, *, model_path: str, tokenizer: Any = None) -> None:
        self.engine = engine
        self.model_path = model_path
        self.tokenizer = tokenizer  # None: responses carry no `text` (SGLang's skip_tokenizer_init)
        self._inflight: set[str] = set()
        self._paused = False
        self._pause_mode = "in_place"
        self._update_session = False  # /begin_weight_update ... /end_weight_update
        self._groups: dict[str, Any] = {}  # weight-update process groups by name
        self.app = web.Application(client_max_size=1 << 31)
        get, post = web.get, web.post
        self.app.add_routes(
            [
                post("/generate", self.generate),
                get("/v1/loads", self.loads),
                get("/get_weight_version", self.get_weight_version),
                web.put("/generate", self.generate),
                get("/health", self.health_generate),
                get("/health_generate", self.health_generate),
                get("/model_info", self.model_info),
                get("/get_model_info", self.model_info),
                get("/server_info", self.server_info),
                get("/get_server_info", self.server_info),
                get("/flush_cache", self.flush_cache),
                post("/flush_cache", self.flush_cache),
                post("/pause_generation", self.pause_generation),
                post("/continue_generation", self.continue_generation),
                post("/abort_request", self.abort_request),
                post("/update_weights_from_disk", self.update_weights_from_disk),
                post("/update_weights_from_tensor", self.update_weights_from_tensor),
                post("/update_weight_version", self.update_weight_version),
                post("/begin_weight_update", self.begin_weight_update),
                post("/end_weight_update", self.end_weight_update),
                post("/init_weights_update_group", self.init_weights_update_group),
                post("/update_weights_from_distributed", self.update_weights_from_distributed),
                post("/destroy_weights_update_group", self.destroy_weights_update_group),
                get("/get_weights_by_name", self.get_weights_by_name),
                post("/get_weights_by_name", self.get_weights_by_name),
            ]
        )

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            request_body = await _json(request)
            input_ids, sampling, rid, stream = parse_generate_request(request_body)
        except ContractError as exc:  # SGLang's contract gate answers the message as a string
            return web.json_response({"error": str(exc)}, status=400)
        except ProtocolError as exc:
            return web.json_response(error_body(str(exc)), status=400)
        rid = rid or uuid.uuid4().hex
        if rid in self._inflight:
            return web.json_response(error_body(f"duplicate request id {rid!r}"), status=400)
        self._inflight.add(rid)
        try:
            result = await self.engine.generate(input_ids, sampling, session_id=rid)
        except (ValueError, TypeError) as exc:
            return web.json_response(error_body(str(exc)), status=400)
        except EngineError as exc:
            return web.json_response(error_body(str(exc)), status=503)
        finally:
            self._inflight.discard(rid)
        body = generate_response(result, rid)
        if self.tokenizer is not None:  # SGLang decodes unless skip_tokenizer_init
            finish = body["meta_info"]["finish_reason"]
            body = {
                "text": response_text(
                    self.tokenizer,
                    result.token_ids,
                    finish.get("matched") if finish["type"] == "stop" else None,
                    **text_options(request_body.get("sampling_params") or {}),
                ),
                **body,
            }
        if not stream:
            return web.json_response(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(body)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def loads(self, request: web.Request) -> web.Response:
        """SGLang 0.5.23's ``GET /v1/loads`` (see :func:`~agentrl.engine_pool.sglang_api.loads_body`)."""
        query = request.query
        if query.get("format") == "prometheus":
            return _http_error("format=prometheus is not served by agentrl serve", 400)
        try:
            body = loads_body(
                running=len(self._inflight),
                max_running=self.engine.max_batch_size,
                cache_hit_rate=self.engine.stats.prefix_hit_rate,
                include=query.get("include"),
                dp_rank=query.get("dp_rank"),
            )
        except ProtocolError as exc:
            return _http_error(str(exc), 400)
        return web.json_response(body)

    async def get_weight_version(self, request: web.Request) -> web.Response:
        """``GET /get_weight_version``: ``{"weight_version": str}``, as SGLang before 0.5.23 had
        it (0.5.23 reads the version from ``/model_info`` only, which is served too)."""
        return web.json_response({"weight_version": str(self.engine.weight_version)})

    async def health_generate(self, request: web.Request) -> web.Response:
        if not self.engine.serving:
            return web.Response(status=503)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _HEALTH_TIMEOUT_S
        while self._paused:  # as SGLang: the probe's generation waits for continue_generation
            if loop.time() >= deadline:
                return web.Response(status=503)
            await asyncio.sleep(0.05)
        if self._inflight:  # as SGLang: any token produced within the timeout proves liveness
            start = self.engine.stats.tokens_generated
            deadline = asyncio.get_running_loop().time() + _HEALTH_TIMEOUT_S
            while asyncio.get_running_loop().time() < deadline:
                if self.engine.stats.tokens_generated > start or not self._inflight:
                    return web.Response(status=200)
                await asyncio.sleep(0.02)
            return web.Response(status=503)
        probe = SamplingParams(temperature=0.0, max_new_tokens=1)
        try:
            await asyncio.wait_for(
                self.engine.generate([0], probe, session_id=f"HEALTH_CHECK_{uuid.uuid4().hex}"),
                _HEALTH_TIMEOUT_S,
            )
        except (EngineError, TimeoutError):
            return web.Response(status=503)
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        config = self.engine.model.config
        return web.json_response(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "served_model_name": self.model_path,
                "is_generation": True,
                "weight_version": str(self.engine.weight_version),
                "architectures": getattr(config, "architectures", None),
                "context_length": getattr(config, "max_position_embeddings", None),
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        stats = asdict(self.engine.stats)
        stats["prefix_hit_rate"] = self.engine.stats.prefix_hit_rate
        return web.json_response(
            {
                "engine": "agentrl.LocalEngine",
                "model_path": self.model_path,
                "max_batch_size": self.engine.max_batch_size,
                "weight_version": str(self.engine.weight_version),
                "paused": self._paused,
                "running_requests": len(self._inflight),
                "stats": stats,
                # the server arguments SGLang reports that the client reads
                "tp_size": 1,
                "enable_deterministic_inference": True,  # sampling_seed always applies here
                "allow_auto_truncate": False,
                "context_length": getattr(
                    self.engine.model.config, "max_position_embeddings", None
                ),
            }
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        if not await self._flush():
            return web.Response(text=_FLUSH_REFUSED, status=400)
        return web.Response(text="Cache flushed.\n")

    async def _flush(self) -> bool:
        """Empty the prefix cache unless requests run (as SGLang's scheduler decides)."""
        if self._inflight and not (self._paused and self._pause_mode == "retract"):
            return False
        await self.engine.flush_cache()
        return True

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await _json(request, default={})
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in ("abort", "retract", "in_place"):
            return web.json_response(error_body(f"unknown pause mode {mode!r}"), status=400)
        self._paused, self._pause_mode = True, mode
        await self.engine.pause()
        if mode == "abort":  # in-flight requests return now, with their partial tokens
            await self.engine.abort()
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        self._paused = False
        await self.engine.resume()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await _json(request, default={})
        if not isinstance(body, dict):
            return web.json_response(error_body("the body must be a JSON object"), status=400)
        if body.get("abort_all"):
            await self.engine.abort()
        elif (rid := str(body.get("rid") or "")) in self._inflight:
            # as SGLang: the HTTP layer knows the rid exactly, then the scheduler aborts by prefix
            for running in [other for other in self._inflight if other.startswith(rid)]:
                await self.engine.abort(running)
        return web.Response(status=200)

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await _json(request, default={})
        try:
            version = self._next_version(body)
            path = Path(str(body["model_path"]))
            tensors = await asyncio.to_thread(_read_safetensors, path)
            await self.engine.update_weights(tensors, version)
        except (KeyError, ValueError, OSError, ProtocolError) as exc:
            return _update_failed(exc)
        return await self._updated(body, version, num_paused_requests=0)

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        body = await _json(request, default={})
        if not self._update_session:
            return _no_session("update_weights_from_tensor")
        try:
            version = self._next_version(body)
            (payload,) = body["serialized_named_tensors"]  # one entry per TP rank: we have one
            load_format = body.get("load_format")
            tensors = await asyncio.to_thread(decode_named_tensors, payload, load_format)
            await self.engine.update_weights(tensors, version)
        except (KeyError, ValueError, TypeError, ProtocolError) as exc:
            return _update_failed(exc)
        except Exception as exc:  # an undecodable payload (pickle / torch errors)
            return _update_failed(exc)
        return await self._updated(body, version)

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await _json(request, default={})
        try:
            version = parse_version(body["new_version"])
            await self.engine.update_weights([], version)
        except (KeyError, ValueError, ProtocolError) as exc:
            return _update_failed(exc)
        return _answer(True, f"Weight version updated to {version}", new_version=str(version))

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        body = await _json(request, default={})
        try:
            name = str(body.get("group_name", DEFAULT_GROUP))
            group = await asyncio.to_thread(
                join_group,
                str(body["master_address"]),
                int(body["master_port"]),
                int(body["rank_offset"]),  # one rank per server: no tensor parallelism here
                int(body["world_size"]),
                group_name=name,
                backend=str(body.get("backend", "gloo")),
            )
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            return _update_failed(exc)
        self._groups[name] = group
        return _answer(True, "Succeeded to initialize custom process group.")

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        body = await _json(request, default={})
        if not self._update_session:  # nothing is received, so the sender's broadcast waits
            return _no_session("update_weights_from_distributed")
        try:
            version = self._next_version(body)
            name = str(body.get("group_name", DEFAULT_GROUP))
            if name not in self._groups:
                raise ValueError(
                    f"no weight-update group {name!r}: call /init_weights_update_group"
                )
            tensors = await asyncio.to_thread(
                receive, self._groups[name], body["names"], body["dtypes"], body["shapes"]
            )
            await self.engine.update_weights(tensors, version)
        except (KeyError, TypeError, ValueError, RuntimeError, ProtocolError) as exc:
            return _update_failed(exc)
        return await self._updated(body, version)

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        body = await _json(request, default={})
        name = str(body.get("group_name", DEFAULT_GROUP)) if isinstance(body, dict) else ""
        group = self._groups.pop(name, None)
        if group is None:
            return _answer(False, "The group to be destroyed does not exist.")
        await asyncio.to_thread(leave_group, group)
        return _answer(True, "Succeeded to destroy custom process group.")

    async def get_weights_by_name(self, request: web.Request) -> web.Response:
        """SGLang's route for checking a weight sync: ``{"name", "truncate_size": 100}`` answers
        the weight's first ``truncate_size`` rows as (nested) lists of floats, or 400."""
        body = await _json(request, default=dict(request.query))
        try:
            if not isinstance(body, dict):
                raise TypeError("the body must be a JSON object")
            name = str(body["name"])
            rows = await self.engine.get_weights_by_name(name, int(body.get("truncate_size", 100)))
        except (KeyError, TypeError, ValueError) as exc:
            return web.json_response(error_body(f"get_weights_by_name: {exc}"), status=400)
        except EngineError as exc:
            return web.json_response(error_body(str(exc)), status=503)
        return web.json_response(rows.tolist())

    async def begin_weight_update(self, request: web.Request) -> web.Response:
        await _json(request, default={})
        if self._update_session:
            return _answer(
                False, "a weight-update session is already open; call end_weight_update() first"
            )
        self._update_session = True
        return _answer(True, "Success")

    async def end_weight_update(self, request: web.Request) -> web.Response:
        await _json(request, default={})
        if not self._update_session:
            return _answer(
                False, "no weight-update session is open; call begin_weight_update() first"
            )
        self._update_session = False
        return _answer(True, "Success")

    async def _updated(self, body: dict[str, Any], version: int, **extra: Any) -> web.Response:
        """The answer to a weight update that loaded: the flush it asked for may still fail."""
        if body.get("flush_cache", True) and not await self._flush():
            return _answer(False, _UPDATED_NOT_FLUSHED, **extra)
        message = f"Succeeded to update model weights. Weight version updated to {version}."
        return _answer(True, message, **extra)

    def _next_version(self, body: Any) -> int:
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        given = body.get("weight_version")
        return parse_version(given) if given is not None else self.engine.weight_version


def _read_safetensors(path: Path) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not all(file.is_file() for file in files):
        raise FileNotFoundError(f"no .safetensors weights at {path}")
    return [item for file in files for item in load_file(file).items()]


def _http_error(message: str, status: int) -> web.Response:
    """SGLang's answer to an ``HTTPException``: ``{"object": "error", "message", "type", ...}``."""
    body = {"object": "error", "message": message, "type": str(status), "param": None}
    return web.json_response({**body, "code": status}, status=status)


def _update_failed(exc: BaseException) -> web.Response:
    return _answer(False, f"Failed to update weights: {type(exc).__name__}: {exc}")


def _no_session(route: str) -> web.Response:
    return _answer(False, f"{route} must run between begin_weight_update() and end_weight_update()")


def _answer(success: bool, message: str, **extra: Any) -> web.Response:
    """SGLang's ``{"success", "message"}`` answer: 200 on success, else 400."""
    body = {"success": success, "message": message, **extra}
    return web.json_response(body, status=200 if success else 400)


_FLUSH_REFUSED = (
    "Cache not flushed because there are pending requests. Retract or finish them first.\n"
)
_UPDATED_NOT_FLUSHED = (
    "Weights were updated, but the cache was not flushed because requests are still running or "
    "queued. Retract or finish them, then call /flush_cache."
)


async def _json(request: web.Request, default: Any = None) -> Any:
    """The request's JSON body (``default`` when empty); a 400 response for invalid JSON."""
    text = await request.text()
    if not text.strip():
        if default is None:
            raise web.HTTPBadRequest(
                text=json.dumps(error_body("empty body")), content_type="application/json"
            )
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise web.HTTPBadRequest(
            text=json.dumps(error_body(f"invalid JSON: {exc}")), content_type="application/json"
        ) from None


async def serve(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    max_batch_size: int = 32,
    dtype: str = "float32",
    fp8_weights: bool = False,
    device: str = "cpu",
    served_model_name: str | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Load ``model`` into a :class:`LocalEngine` on ``device`` and serve it until cancelled,
    with the OpenAI-compatible routes of :mod:`agentrl.engine_pool.gateway` (model id
    ``served_model_name``, default ``model`` as given) beside SGLang's."""
    async with LocalEngine(
        model, max_batch_size=max_batch_size, dtype=dtype, fp8_weights=fp8_weights, device=device
    ) as engine:
        tokenizer = load_tokenizer(model)
        server = EngineServer(engine, model_path=str(model), tokenizer=tokenizer)
        gateway = Gateway(
            engine,
            tokenizer,
            model_name=served_model_name or str(model),
            context_length=getattr(engine.model.config, "max_position_embeddings", None),
        )
        GatewayRoutes(gateway).add_to(server.app)
        banner = f"agentrl serve: {model} on http://{host}:{port}"
        await serve_app(server.app, host, port, banner, ready)
