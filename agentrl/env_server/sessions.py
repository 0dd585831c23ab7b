"""Sessions of an environment server: one environment instance each, a limit, idle expiry.

A session owns one environment made by the server's factory (so one sandbox, one verifier
pool, ... as that environment holds them); requests on a session run one at a time under its
lock, in the server's event loop. :class:`SessionTable` counts every session towards
``max_sessions``, reserving the slot before the environment is made so that a burst of
connections never holds more, and closes sessions idle for longer than ``idle_timeout_s``
(those a WebSocket drives are expired by their connection, which says why before closing).

Guaranteed: a session's environment is closed exactly once, whichever way the session ends
(closed by the client, expired, its connection lost, the server stopping); an environment
whose constructor or ``aclose`` raises never takes a slot with it. Not guaranteed: fairness
between sessions (one environment that blocks the event loop stalls them all; the
:class:`~agentrl.envs.AgentEnv` contract says blocking work is awaited off the loop).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.envs import AgentEnv, AgentWrapper

log = logging.getLogger(__name__)

EnvMaker = Callable[[], AgentEnv | AgentWrapper]


class SessionCapacityError(RuntimeError):
    """Every slot is taken (OpenEnv's SessionCapacityError)."""

    def __init__(self, active: int, max_sessions: int) -> None:
        super().__init__(
            f"Server at capacity: {active}/{max_sessions} sessions active. "
            "Cannot accept new connections."
        )
        self.active = active
        self.max_sessions = max_sessions


class EnvFactoryError(RuntimeError):
    """The environment could not be made (OpenEnv's EnvironmentFactoryError)."""


class UnknownSession(KeyError):
    """No open session has this id."""

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id)
        self.session_id = session_id

    def __str__(self) -> str:
        return f"Unknown session_id: {self.session_id}"


@dataclass
class Session:
    """One environment instance and what the protocol reports about its episode."""

    id: str
    env: AgentEnv | AgentWrapper
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_active: float = field(default_factory=time.monotonic)
    episode_id: str | None = None
    step_count: int = 0
    done: bool = False
    attached: bool = False
    """A WebSocket drives the session; it ends the session when it closes."""
    close_requested: bool = False
    """Closed over ``/mcp`` while attached: closed when its WebSocket detaches."""

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def idle_for(self) -> float:
        return time.monotonic() - self.last_active

    def state(self, env_id: str) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "step_count": self.step_count,
            "session_id": self.id,
            "env_id": env_id,
            "done": self.done,
        }


class SessionTable:
    """The open sessions of one server (see the module docstring)."""

    def __init__(
        self, make_env: EnvMaker, *, max_sessions: int, idle_timeout_s: float | None
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        if idle_timeout_s is not None and idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be positive, got {idle_timeout_s}")
        self.make_env = make_env
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.sessions: dict[str, Session] = {}
        self._reserved = 0
        self.opened = 0
        self.expired = 0
        self._reaper: asyncio.Task[None] | None = None

    @property
    def active(self) -> int:
        return len(self.sessions) + self._reserved

    async def open(self) -> Session:
        """A new session with a fresh environment; SessionCapacityError or EnvFactoryError."""
        if self.active >= self.max_sessions:
            raise SessionCapacityError(self.active, self.max_sessions)
        self._reserved += 1
        try:
            env = self.make_env()
        except Exception as exc:
            raise EnvFactoryError(
                f"the environment could not be made: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            self._reserved -= 1
        session = Session(id=str(uuid.uuid4()), env=env)
        self.sessions[session.id] = session
        self.opened += 1
        return session

    def get(self, session_id: str) -> Session:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise UnknownSession(session_id) from None

    async def close(self, session_id: str) -> None:
        """Close the session's environment and free its slot (a no-op for an unknown id)."""
        session = self.sessions.pop(session_id, None)
        if session is not None:
            await close_env(session.env)

    async def close_all(self) -> None:
        for session_id in list(self.sessions):
            await self.close(session_id)

    def start_reaper(self) -> None:
        if self.idle_timeout_s is not None and self._reaper is None:
            self._reaper = asyncio.create_task(self._reap())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        await self.close_all()

    async def _reap(self) -> None:
        assert self.idle_timeout_s is not None
        interval = min(max(self.idle_timeout_s / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(interval)
            for session in list(self.sessions.values()):
                if session.attached or session.lock.locked():
                    continue  # its connection expires it; a request in flight is activity
                if session.idle_for() > self.idle_timeout_s:
                    self.expired += 1
                    await self.close(session.id)


async def close_env(env: AgentEnv | AgentWrapper) -> None:
    """``await env.aclose()``, logging (never raising) what it raises."""
    try:
        await env.aclose()
    except Exception:
        log.exception("closing an environment failed")
