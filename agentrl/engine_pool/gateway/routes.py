"""The gateway's HTTP routes (aiohttp), added to ``agentrl serve``'s app or ``agentrl gateway``'s.

================================================  ===================================================
``GET /v1/models``                                 the model served
``POST /v1/chat/completions``                      chat completion (``stream`` for server-sent events)
``POST /v1/completions``                           text completion of one prompt (text or token ids)
``POST /sessions/{id}/v1/chat/completions``        the same, recorded in session ``id``
``POST /sessions/{id}/v1/completions``             a text completion, recorded in session ``id``
``GET /sessions/{id}/v1/models``                   the model (so a client's base URL can be the prefix)
``GET /sessions``                                  open sessions: calls, segments, splits, verdicts
``GET /sessions/{id}``                             one session's counts, without closing it
``GET /sessions/{id}/trajectories``                its segments (token ids, loss mask, log-probs,
                                                   messages, calls); closes it (``?close=false``
                                                   keeps it open)
================================================  ===================================================

A session can also be named by the ``X-Session-Id`` header on ``/v1/chat/completions`` and
``/v1/completions`` (a prefix and a different header is a 400).

Every failure answers an OpenAI error object ``{"error": {"message", "type", "param", "code"}}``:
400 malformed request, 404 unknown model or session, 413 body over ``max_body_bytes``, 429 too many
sessions, 503 engine unavailable, 500 for anything unexpected (logged); the server keeps serving.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agentrl.engine_pool.gateway.protocol import (
    GatewayError,
    bad_request,
    parse_chat_request,
    parse_completion_request,
)
from agentrl.engine_pool.gateway.responses import (
    chat_chunks,
    chat_completion,
    completion,
    completion_chunks,
)
from agentrl.engine_pool.gateway.service import Completed, Gateway

SESSION_HEADER = "X-Session-Id"
DEFAULT_MAX_BODY_BYTES = 32 << 20
_log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class GatewayRoutes:
    """The routes above for one :class:`Gateway`; :meth:`add_to` puts them on an app."""

    def __init__(self, gateway: Gateway, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.gateway = gateway
        self.max_body_bytes = max_body_bytes

    def add_to(self, app: web.Application) -> None:
        chat, text = _guard(self.chat), _guard(self.completions)
        app.add_routes(
            [
                web.get("/v1/models", _guard(self.models)),
                web.post("/v1/chat/completions", chat),
                web.post("/v1/completions", text),
                web.get("/sessions/{session_id}/v1/models", _guard(self.models)),
                web.post("/sessions/{session_id}/v1/chat/completions", chat),
                web.post("/sessions/{session_id}/v1/completions", text),
                web.get("/sessions", _guard(self.sessions)),
                web.get("/sessions/{session_id}", _guard(self.session)),
                web.get("/sessions/{session_id}/trajectories", _guard(self.trajectories)),
            ]
        )

    async def models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.gateway.models())

    async def chat(self, request: web.Request) -> web.StreamResponse:
        parsed = parse_chat_request(await self._body(request))
        done = await self.gateway.chat(parsed, _session_id(request))
        decode = self.gateway.decode
        logprobs, sampling = parsed.sampling.logprobs, parsed.sampling
        if sampling.stream:
            chunks = chat_chunks(
                done.header, done.prompt_ids, done.choices, logprobs, sampling.include_usage, decode
            )
            return await _stream(request, chunks)
        return web.json_response(
            chat_completion(done.header, done.prompt_ids, done.choices, logprobs, decode)
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        parsed = parse_completion_request(await self._body(request))
        done: Completed = await self.gateway.complete(parsed, _session_id(request))
        decode, sampling = self.gateway.decode, parsed.sampling
        if sampling.stream:
            chunks = completion_chunks(
                done.header,
                done.prompt_ids,
                done.choices,
                sampling.logprobs,
                sampling.include_usage,
                decode,
            )
            return await _stream(request, chunks)
        return web.json_response(
            completion(done.header, done.prompt_ids, done.choices, sampling.logprobs, decode)
        )

    async def sessions(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.gateway.sessions.summary())

    async def session(self, request: web.Request) -> web.StreamResponse:
        session = self.gateway.sessions.get(request.match_info["session_id"])
        return web.json_response(session.summary())

    async def trajectories(self, request: web.Request) -> web.StreamResponse:
        session_id = request.match_info["session_id"]
        keep = request.query.get("close", "true").lower() in ("0", "false", "no")
        if keep:
            record = self.gateway.sessions.get(session_id).record()
        else:
            record = await self.gateway.close_session(session_id)
        return web.json_response(record.to_dict())

    async def _body(self, request: web.Request) -> Any:
        """The JSON body, read up to ``max_body_bytes`` (413 past it, 400 if not JSON)."""
        limit = self.max_body_bytes
        too_large = GatewayError(
            413, f"the request body exceeds {limit} bytes", code="request_too_large"
        )
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        data = bytearray()
        async for chunk in request.content.iter_chunked(1 << 16):
            data += chunk
            if len(data) > limit:
                raise too_large
        try:
            return json.loads(data)
        except ValueError as exc:
            raise bad_request(f"the body is not valid JSON: {exc}") from None


def _session_id(request: web.Request) -> str | None:
    in_path = request.match_info.get("session_id")
    header = request.headers.get(SESSION_HEADER)
    if in_path is not None and header is not None and header != in_path:
        raise bad_request(
            f"the URL names session {in_path!r} and the {SESSION_HEADER} header {header!r}",
            SESSION_HEADER,
        )
    session = in_path if in_path is not None else header
    if session is not None and not 0 < len(session) <= 256:
        raise bad_request("a session id has 1 to 256 characters", "session_id")
    return session


async def _stream(request: web.Request, chunks: list[dict[str, Any]]) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for chunk in chunks:
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _guard(handler: Handler) -> Handler:
    """``handler`` with every failure answered as an OpenAI error object."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except GatewayError as exc:
            return web.json_response(exc.body(), status=exc.status)
        except web.HTTPException as exc:  # raised by aiohttp itself (a body over its own limit)
            error = GatewayError(exc.status, exc.reason or str(exc), code=str(exc.status))
            return web.json_response(error.body(), status=exc.status)
        except Exception as exc:
            _log.exception("gateway: %s %s failed", request.method, request.path)
            error = GatewayError(
                500, f"internal error: {type(exc).__name__}: {exc}", type="server_error"
            )
            return web.json_response(error.body(), status=500)

    return guarded
