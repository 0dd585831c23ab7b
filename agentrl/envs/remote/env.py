"""``agentrl/Remote-v0``: an :class:`~agentrl.envs.AgentEnv` whose episodes run on an environment
server (``agentrl env serve``, or any server of OpenEnv's protocol whose actions are ``{"text"}``
and observations :mod:`agentrl.envs.remote.protocol`'s).

::

    env = gymnasium.make("agentrl/Remote-v0", url="http://envs-1:8000")
    messages, info = await env.areset(seed=3)       # a session of its own on the server
    messages, reward, terminated, truncated, info = await env.astep(text)

Each instance holds one session, over OpenEnv's ``/ws`` route, opened at the first reset and
kept for the next resets on the same event loop (a reset on another loop, or after the
connection dropped, opens a new one). With several URLs a new session goes to the server this
process holds the fewest sessions on; a server that refuses (full, unreachable, its environment
cannot be made) is skipped for the next, and the reset fails only when all refuse.

Guaranteed: a server that goes away mid-episode (the connection closes or fails, the server's
session expired, no reply within ``step_timeout_s``) ends the episode with
``info["infra_error"]`` naming the server and the cause, reward 0 and ``terminated=True``: the
rollout runner and trainer treat it as an infrastructure failure, never as the agent's score.
The remote environment's own exceptions (a step after the episode ended, ...) are raised here as
:class:`RemoteEnvError`, as the environment would raise them in-process.

A turn limit on this side (``gymnasium.make("agentrl/Remote-v0", url=..., max_turns=N)``) reaches
the remote environment: the last step's action carries ``metadata: {"final_turn": true}``, and
``agentrl env serve`` sets the environment's :attr:`~agentrl.envs.AgentEnv.final_turn` from it
(SWE-v0 grades that turn as if submitted). :meth:`anum_tasks` asks the server (``GET /state``'s
``num_tasks``), so ``agentrl eval`` enumerates a remote environment's tasks; the synchronous
:attr:`num_tasks` stays None (it cannot ask over the network).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, ClassVar

import aiohttp
from pydantic import Field

from agentrl.config import Config
from agentrl.envs.core import INFRA_ERROR, AgentEnv, ResetResult, StepResult
from agentrl.envs.remote import protocol as p


class RemoteConfig(Config):
    """Keyword arguments of ``gymnasium.make("agentrl/Remote-v0", ...)``."""

    url: str | list[str]
    """The environment server (`http://host:port`, as `agentrl env serve` prints it), or several
    serving the same environment: each new session goes to the least loaded of them (by this
    process's sessions)."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """Seconds to open a session's connection before trying the next server."""
    step_timeout_s: float = Field(600.0, gt=0)
    """Seconds to wait for a reset's or a step's reply; a step without one in time ends the
    episode with an infra_error."""


class RemoteEnvError(RuntimeError):
    """The server answered a request with an error (the remote environment raised, a bad
    request, no room); ``code`` is OpenEnv's error code."""

    def __init__(self, message: str, code: str | None) -> None:
        super().__init__(f"{message} (code: {code})")
        self.code = code


REFUSALS = frozenset({p.CAPACITY_REACHED, p.FACTORY_ERROR})
"""Error codes with which a server refuses a new session: the next server is tried."""


class ServerGone(ConnectionError):
    """The connection to the server closed, failed or timed out."""


class _Link:
    """One session's connection: the HTTP client, the WebSocket, its server and event loop."""

    def __init__(self, url: str, http: aiohttp.ClientSession, ws: Any) -> None:
        self.url, self.http, self.ws = url, http, ws
        self.loop = asyncio.get_running_loop()

    async def close(self) -> None:
        try:
            if not self.ws.closed:
                await self.ws.send_str(json.dumps({"type": "close"}))
                await self.ws.close()
        except (aiohttp.ClientError, ConnectionError, RuntimeError):
            pass
        finally:
            await self.http.close()


class RemoteEnv(AgentEnv):
    """An environment on an environment server (see the module docstring)."""

    sessions_by_url: ClassVar[dict[str, int]] = {}
    """Sessions this process holds on each server, which spreads new sessions across them."""
    env_id: ClassVar[str] = "agentrl/Remote-v0"
    config_class: ClassVar[type[RemoteConfig]] = RemoteConfig

    def __init__(self, **kwargs: Any) -> None:
        self.config = self.config_class.build(self.env_id, kwargs)
        urls = [self.config.url] if isinstance(self.config.url, str) else self.config.url
        if not urls:
            raise ValueError(f"{self.env_id}: url names no server")
        self.urls = [url.rstrip("/") for url in urls]
        self._link: _Link | None = None

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        await super().areset(seed=seed, options=options)
        data: dict[str, Any] = {} if seed is None else {"seed": seed}
        if options:
            data["options"] = options
        link = self._link
        if link is None or link.ws.closed or link.loop is not asyncio.get_running_loop():
            await self._drop()
            return await self._reset_on_a_server(data)
        try:
            reply = await self._exchange({"type": "reset", "data": data})
        except ServerGone:
            await self._drop()
            return await self._reset_on_a_server(data)
        return self.reset_result(reply["data"])

    async def astep(self, action: str) -> StepResult:
        if self._link is None:
            raise RemoteEnvError(f"{self.env_id}: step before reset (no session)", None)
        url = self._link.url
        try:
            reply = await self._exchange({"type": "step", "data": self.action_data(action)})
        except ServerGone as exc:
            await self._drop()
            message = f"the environment server {url} went away mid-episode: {exc}"
            return [], 0.0, True, False, {INFRA_ERROR: message}
        return self.step_result(reply["data"])

    async def aclose(self) -> None:
        await self._drop()

    async def anum_tasks(self) -> int | None:
        """The server's ``num_tasks`` (``GET /state``; the first server that answers), None when
        it reports none (a server other than ``agentrl env serve``, or an environment that cannot
        enumerate its tasks); :class:`ServerGone` when no server answers."""
        timeout = aiohttp.ClientTimeout(total=self.config.step_timeout_s)
        failures = []
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for url in self.urls:
                try:
                    async with http.get(f"{url}/state") as response:
                        response.raise_for_status()
                        state = await response.json()
                except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                    failures.append(f"{url}: {type(exc).__name__}: {exc}")
                    continue
                count = state.get("num_tasks") if isinstance(state, dict) else None
                return count if isinstance(count, int) and not isinstance(count, bool) else None
        raise ServerGone("no environment server answered GET /state: " + "; ".join(failures))

    # The mapping between AgentEnv's verbs and the wire's action and observation; a subclass
    # for a server whose Action and Observation are not agentrl's overrides these three.
    def action_data(self, action: str) -> dict[str, Any]:
        """The step message's ``data`` (the Action's fields) for the assistant's text; its
        ``metadata`` says when this is the final turn (see the module docstring)."""
        if self.final_turn:
            return {"text": action, "metadata": {p.FINAL_TURN: True}}
        return {"text": action}

    def reset_result(self, payload: dict[str, Any]) -> ResetResult:
        """A reset's messages and info from its reply's ``data``."""
        observation = payload["observation"]
        return observation["messages"], observation["info"]

    def step_result(self, payload: dict[str, Any]) -> StepResult:
        """A step's result from its reply's ``data`` (``{"observation", "reward", "done"}``)."""
        observation = payload["observation"]
        return (
            observation["messages"],
            float(payload["reward"] or 0.0),
            bool(observation["terminated"]),
            bool(observation["truncated"]),
            observation["info"],
        )

    async def _reset_on_a_server(self, data: dict[str, Any]) -> ResetResult:
        """Open a session on the least loaded server that takes one, and reset it there."""
        refusals = []
        for url in sorted(self.urls, key=lambda url: self.sessions_by_url.get(url, 0)):
            try:
                self._link = await self._connect(url)
                reply = await self._exchange({"type": "reset", "data": data})
            except (ServerGone, RemoteEnvError) as exc:
                await self._drop()
                if isinstance(exc, RemoteEnvError) and exc.code not in REFUSALS:
                    raise  # the reset itself failed (a bad seed or option): not the server's
                refusals.append(f"{url}: {exc}")
                continue
            return self.reset_result(reply["data"])
        raise ServerGone("no environment server took the session: " + "; ".join(refusals))

    async def _connect(self, url: str) -> _Link:
        timeout = aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout_s)
        http = aiohttp.ClientSession(timeout=timeout)
        try:
            ws_url = url.replace("https://", "wss://").replace("http://", "ws://") + "/ws"
            ws = await http.ws_connect(ws_url, max_msg_size=0, autoping=True)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            await http.close()
            raise ServerGone(f"cannot connect: {type(exc).__name__}: {exc}") from exc
        self.sessions_by_url[url] = self.sessions_by_url.get(url, 0) + 1
        return _Link(url, http, ws)

    async def _drop(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            self.sessions_by_url[link.url] = max(self.sessions_by_url.get(link.url, 1) - 1, 0)
            await link.close()

    async def _exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one message, return its reply; ServerGone when the connection fails or the
        server ended the session, RemoteEnvError for any other error reply."""
        assert self._link is not None
        ws = self._link.ws
        try:
            # a refused session's error frame may be waiting while the send fails: read it
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_str(json.dumps(message))
            received = await ws.receive(timeout=self.config.step_timeout_s)
        except TimeoutError:
            raise ServerGone(f"no reply within {self.config.step_timeout_s:g} s") from None
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise ServerGone(f"{type(exc).__name__}: {exc}") from exc
        if received.type != aiohttp.WSMsgType.TEXT:
            code = ws.close_code
            raise ServerGone(f"the connection closed ({received.type.name}, code {code})")
        reply: dict[str, Any] = json.loads(received.data)
        if reply.get("type") == "error":
            data = reply.get("data", {})
            text, code = str(data.get("message", "unknown error")), data.get("code")
            if code == p.SESSION_ERROR:
                raise ServerGone(f"the server ended the session: {text}")
            raise RemoteEnvError(text, code)
        return reply
