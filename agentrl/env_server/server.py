"""``agentrl env serve``: an agentrl environment behind OpenEnv's HTTP and WebSocket routes.

Routes, as ``openenv`` 0.10.0's ``HTTPEnvServer`` serves them (``docs/env_serving.md`` has the
table and the payloads; :mod:`agentrl.envs.remote.protocol` the mapping):

- ``GET /ws`` (WebSocket): one session per connection, its own environment instance. Messages
  ``{"type": "reset"|"step"|"state"|"close"|"mcp", "data": ...}``; replies ``{"type":
  "observation"|"state"|"mcp"|"error", "data": ...}``. ``/ws?session_id=ID`` attaches to a
  session made over ``POST /mcp``. OpenEnv's ``EnvClient`` drives this route.
- ``POST /reset``, ``POST /step``, ``GET /state``: OpenEnv's stateless forms. ``/reset`` runs
  a fresh environment's reset and closes it; ``/step`` cannot step a fresh agentrl environment
  (an episode starts with a reset) and says so (409). With a ``session_id`` (a body field, or
  ``/state``'s query) they act on that session instead: stateful HTTP, an agentrl extension.
- ``POST /mcp``: JSON-RPC 2.0; OpenEnv's ``openenv/session/create`` and ``openenv/session/close``
  make and close sessions; ``tools/*`` answer that the environment does not speak MCP.
- ``GET /health``, ``/metadata``, ``/schema``, ``/openapi.json``.

Bad input never takes the server down: malformed JSON, an unknown message type, an invalid
action, an unknown session, a body over ``max_body_bytes``, a full server and an environment
that raises each get an error in OpenEnv's shape (WebSocket: ``{"type": "error", "data":
{"message", "code"}}``; HTTP: ``{"detail": ...}`` with a 4xx/5xx status), and the session (and
the connection, except for a refused or expired one) stays usable.

Two agentrl extensions ride on OpenEnv's own fields: a step action's ``metadata`` may carry
``{"final_turn": true}`` (the client's turn limit ends the episode after this step: the
environment's :attr:`~agentrl.envs.AgentEnv.final_turn`, which SWE-v0 grades on), and every
state holds ``num_tasks`` (the environment's, so a client can enumerate tasks for an evaluation).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import ValidationError

from agentrl.env_server.http_shapes import OPENENV_API_VERSION, StepRequest, openapi_document
from agentrl.env_server.mcp import PARSE_ERROR, answer_jsonrpc, jsonrpc_error
from agentrl.env_server.sessions import (
    EnvFactoryError,
    EnvMaker,
    Session,
    SessionCapacityError,
    SessionTable,
    UnknownSession,
)
from agentrl.envs import AgentWrapper
from agentrl.envs.remote import protocol as p
from agentrl.http_app import serve_app


class EnvServer:
    """The routes above around one environment id; ``app`` is the aiohttp application."""

    def __init__(
        self,
        env_id: str,
        make_env: EnvMaker,
        *,
        description: str = "",
        version: str | None = None,
        max_sessions: int = 64,
        session_timeout_s: float | None = 600.0,
        max_body_bytes: int = 4 << 20,
        num_tasks: int | None = None,
    ) -> None:
        self.env_id = env_id
        self.num_tasks = num_tasks
        """The environment's :attr:`~agentrl.envs.AgentEnv.num_tasks`, reported in every state."""
        self.description = description
        self.version = version
        self.max_body_bytes = max_body_bytes
        self.sessions = SessionTable(
            make_env, max_sessions=max_sessions, idle_timeout_s=session_timeout_s
        )
        self._sockets: set[web.WebSocketResponse] = set()
        self.app = web.Application(client_max_size=max_body_bytes)
        self.app.add_routes(
            [
                web.get("/ws", self.websocket),
                web.post("/reset", self.http_reset),
                web.post("/step", self.http_step),
                web.get("/state", self.http_state),
                web.post("/mcp", self.http_mcp),
                web.get("/health", self.health),
                web.get("/metadata", self.metadata),
                web.get("/schema", self.schema),
                web.get("/openapi.json", self.openapi),
            ]
        )
        self.app.on_startup.append(self._start)
        self.app.on_shutdown.append(self._stop)

    async def _start(self, app: web.Application) -> None:
        self.sessions.start_reaper()

    async def _stop(self, app: web.Application) -> None:
        # aiohttp waits for open handlers at shutdown: a WebSocket's is waiting for its client
        for ws in list(self._sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown")
        await self.sessions.stop()

    # -- the verbs, shared by both transports ------------------------------------------------

    async def reset(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        request = p.ResetData.model_validate(data)
        async with session.lock:
            session.touch()
            messages, info = await session.env.areset(
                seed=request.seed, options=request.env_options()
            )
            session.episode_id = request.episode_id or str(uuid.uuid4())
            session.step_count = 0
            session.done = False
            session.touch()
        return p.observation_payload(messages, info)

    async def step(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        action = p.AgentAction.model_validate(data)
        async with session.lock:
            session.touch()
            # the client's turn limit: the environment's final_turn, as in-process (a server-side
            # max_turns still sets it too)
            env = session.env
            base = env.agent_env if isinstance(env, AgentWrapper) else env
            base.final_turn = action.metadata.get(p.FINAL_TURN) is True
            messages, reward, terminated, truncated, info = await env.astep(action.text)
            session.step_count += 1
            session.done = bool(terminated or truncated)
            session.touch()
        return p.observation_payload(
            messages,
            info,
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
        )

    def state(self, session: Session | None) -> dict[str, Any]:
        tasks = {"num_tasks": self.num_tasks}
        if session is None:
            return {**p.AgentState().model_dump(), "env_id": self.env_id, **tasks}
        session.touch()
        return {**session.state(self.env_id), **tasks}

    async def mcp(self, body: Any, ws_session: Session | None = None) -> dict[str, Any]:
        return await answer_jsonrpc(body, self.sessions, self.env_id, ws_session)

    # -- WebSocket ---------------------------------------------------------------------------

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=self.max_body_bytes)
        await ws.prepare(request)
        self._sockets.add(ws)
        link = _Link()
        try:
            attach_to = request.query.get("session_id")
            if attach_to:
                session = self.sessions.get(attach_to)
                if session.attached:
                    raise RuntimeError(f"Session {attach_to} already has an attached WebSocket")
                link.hold(session, owned=False)
            else:
                link.hold(await self.sessions.open(), owned=True)
            await self._serve_socket(ws, link)
        except (SessionCapacityError, EnvFactoryError, UnknownSession, RuntimeError) as exc:
            await _send(ws, self._refusal(exc))
        finally:
            self._sockets.discard(ws)
            await self._release(link)
            await ws.close()
        return ws

    def _refusal(self, exc: Exception) -> dict[str, Any]:
        """The error frame for a session that could not be opened or attached to."""
        if isinstance(exc, SessionCapacityError):
            return p.ws_error(
                str(exc),
                p.CAPACITY_REACHED,
                active_sessions=exc.active,
                max_sessions=exc.max_sessions,
            )
        if isinstance(exc, EnvFactoryError):
            return p.ws_error(str(exc), p.FACTORY_ERROR, factory_name=self.env_id)
        return p.ws_error(str(exc), p.SESSION_ERROR)

    async def _release(self, link: _Link) -> None:
        session = link.session
        if session is not None:
            link.session = None
            session.attached = False
            if link.owned or session.close_requested:
                await self.sessions.close(session.id)

    async def _serve_socket(self, ws: web.WebSocketResponse, link: _Link) -> None:
        """Answer messages until the client closes. A session idle for ``idle_timeout_s`` is
        closed (its slot freed) but the connection stays: later messages are told it expired,
        and a reset opens a new session on it; a second idle period closes the connection."""
        timeout = self.sessions.idle_timeout_s
        expired: str | None = None
        idle_since = time.monotonic()
        while True:
            last = link.session.last_active if link.session is not None else idle_since
            wait = None if timeout is None else max(timeout - (time.monotonic() - last), 0.0)
            try:
                message = await ws.receive(timeout=wait)
            except TimeoutError:
                if link.session is None:
                    return
                expired = (
                    f"session {link.session.id} expired: idle for more than {timeout:g} s "
                    "(the server's --session-timeout-s); send a reset to start a new session"
                )
                link.owned = True  # an expired session is closed, attached or not
                await self._release(link)
                self.sessions.expired += 1
                idle_since = time.monotonic()
                continue
            if message.type == WSMsgType.BINARY:
                text = "binary frames are not part of the protocol: send JSON text"
                await _send(ws, p.ws_error(text, p.INVALID_JSON))
                continue
            if message.type != WSMsgType.TEXT:  # CLOSE, CLOSING, CLOSED, ERROR (too big)
                return
            if link.session is None:
                kind = _message_type(message.data)
                if kind == "close":
                    return
                if kind != "reset":
                    await _send(ws, p.ws_error(expired or "no session", p.SESSION_ERROR))
                    continue
                try:
                    link.hold(await self.sessions.open(), owned=True)
                except (SessionCapacityError, EnvFactoryError) as exc:
                    await _send(ws, self._refusal(exc))
                    continue
            assert link.session is not None
            reply = await self._ws_message(link.session, message.data)
            if reply is None:
                return
            await _send(ws, reply)

    async def _ws_message(self, session: Session, raw: str) -> dict[str, Any] | None:
        """The reply to one message; None for ``close``."""
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return p.ws_error(f"Invalid JSON: {exc}", p.INVALID_JSON)
        if not isinstance(message, dict):
            return p.ws_error("Invalid JSON: a message is a JSON object", p.INVALID_JSON)
        kind = message.get("type", "")
        try:
            envelope = p.envelope(message)
            if envelope is None:
                return p.ws_error(f"Unknown message type: {kind}", p.UNKNOWN_TYPE)
            match kind:
                case "reset":
                    return {"type": "observation", "data": await self.reset(session, envelope)}
                case "step":
                    return {"type": "observation", "data": await self.step(session, envelope)}
                case "state":
                    return {"type": "state", "data": self.state(session)}
                case "mcp":
                    return {"type": "mcp", "data": await self.mcp(envelope, session)}
                case _:  # close
                    return None
        except ValidationError as exc:
            errors = p.validation_errors(exc)
            return p.ws_error("Invalid message", p.VALIDATION_ERROR, errors=errors)
        except Exception as exc:
            return p.ws_error(f"{type(exc).__name__}: {exc}", p.EXECUTION_ERROR)

    # -- HTTP --------------------------------------------------------------------------------

    async def http_reset(self, request: web.Request) -> web.Response:
        body = await _json_body(request, empty={})
        if isinstance(body, web.Response):
            return body
        if not isinstance(body, dict):
            return _detail(422, "the request body must be a JSON object")
        return await self._on_session(body.pop("session_id", None), self.reset, body)

    async def http_step(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        try:
            step = StepRequest.model_validate(body)
            p.AgentAction.model_validate(step.action)
        except ValidationError as exc:
            return web.json_response({"detail": p.validation_errors(exc)}, status=422)
        session_id = (step.model_extra or {}).get("session_id")
        if session_id is None:
            return _detail(
                409,
                "an agentrl environment steps only after a reset of the same episode: use the "
                "WebSocket session route /ws (OpenEnv's EnvClient), or pass the session_id of "
                "a session made by POST /mcp openenv/session/create",
            )
        return await self._on_session(session_id, self.step, step.action)

    async def http_state(self, request: web.Request) -> web.Response:
        session_id = request.query.get("session_id")
        if session_id is None:
            return web.json_response(self.state(None))
        try:
            return web.json_response(self.state(self.sessions.get(session_id)))
        except UnknownSession as exc:
            return _detail(404, str(exc))

    async def _on_session(self, session_id: Any, verb: Any, data: Any) -> web.Response:
        """``verb(session, data)`` on the named session, or on a fresh one closed after."""
        try:
            if session_id is not None:
                if not isinstance(session_id, str):
                    return _detail(422, "session_id must be a string")
                return web.json_response(await verb(self.sessions.get(session_id), data))
            session = await self.sessions.open()
            try:
                return web.json_response(await verb(session, data))
            finally:
                await self.sessions.close(session.id)
        except ValidationError as exc:
            return web.json_response({"detail": p.validation_errors(exc)}, status=422)
        except UnknownSession as exc:
            return _detail(404, str(exc))
        except SessionCapacityError as exc:
            return _detail(503, str(exc))
        except Exception as exc:
            return _detail(500, f"{type(exc).__name__}: {exc}")

    async def http_mcp(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except web.HTTPRequestEntityTooLarge as exc:
            return _detail(413, f"the request body is too large: {exc.text}")
        except (ValueError, RecursionError):
            return web.json_response(jsonrpc_error(None, PARSE_ERROR, "Parse error"))
        return web.json_response(await self.mcp(body))

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    async def metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "name": self.env_id,
                "description": self.description,
                "readme_content": None,
                "version": self.version,
                "author": None,
                "documentation_url": None,
            }
        )

    async def schema(self, request: web.Request) -> web.Response:
        return web.json_response(p.schemas())

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document(OPENENV_API_VERSION))


class _Link:
    """The session a WebSocket connection drives, and whether the connection made it."""

    def __init__(self) -> None:
        self.session: Session | None = None
        self.owned = False

    def hold(self, session: Session, *, owned: bool) -> None:
        session.attached = True
        session.touch()
        self.session, self.owned = session, owned


def _message_type(raw: str) -> Any:
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return message.get("type") if isinstance(message, dict) else None


async def _send(ws: web.WebSocketResponse, payload: dict[str, Any]) -> None:
    """Send unless the connection is already gone (a client that left gets no reply)."""
    if not ws.closed:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_str(json.dumps(payload))


async def _json_body(request: web.Request, empty: Any = None) -> Any:
    """The parsed body, or the error response for an oversized or malformed one."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        return _detail(413, f"the request body is too large: {exc.text}")
    if not raw and empty is not None:
        return empty
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return _detail(422, f"the request body is not valid JSON: {exc}")


def _detail(status: int, message: str) -> web.Response:
    """An error in FastAPI's shape, which OpenEnv's HTTP routes answer with."""
    return web.json_response({"detail": message}, status=status)


async def serve(
    server: EnvServer, *, host: str, port: int, ready: asyncio.Event | None = None
) -> None:
    """Serve until cancelled; every session's environment is closed on the way out."""
    banner = (
        f"agentrl env serve: {server.env_id} on http://{host}:{port} (OpenEnv protocol; "
        f"WebSocket sessions at ws://{host}:{port}/ws)"
    )
    await serve_app(server.app, host, port, banner, ready)
