"""A user's agent as a rollout source: its chat calls, recorded by the gateway, become trajectories.

An *agent* is an ``async`` function named by ``agent.entry`` (``"module:function"`` or
``"path/to/file.py:function"``)::

    async def solve(task: AgentTask, client: openai.AsyncOpenAI) -> float | str: ...

Per episode, :class:`AgentRunner` resets the environment (``env.id``: the task and the grader)
and calls the agent with the task and an ``openai.AsyncOpenAI`` client bound to a session of its
own (``/sessions/{id}/v1``) on a :class:`~agentrl.engine_pool.gateway.Gateway` served on loopback
over the rollout engine, which templates, samples and records its calls token-exactly. Sampling is
the trainer's, whatever the agent asks: ``rollout.temperature`` and ``top_p``, at most
``rollout.max_new_tokens`` a call and ``rollout.max_total_tokens`` a conversation (``n``,
``stop`` and ``seed`` are the agent's). A number returned is the reward; a string is the final
answer, graded by the environment (``env.astep(answer)``).

The trajectory is the session's segment holding the agent's last call (choice 0): ids, loss mask,
engine log-probs and per-token weight versions as the gateway recorded them. The segments a
rewritten history split off before it (each holds a first choice and ends before the last segment
begins) are trained too, as sequences of their own with the episode's reward
(``Trajectory.earlier``); one :class:`Turn` per call of all of them. Other segments (``n > 1``
siblings, a branch the agent left) are not trained on (:meth:`AgentRunner.metrics`). Under ``stream.partial_rollouts="abort"`` the gateway continues
aborted generations itself, so the agent gets one reply with per-token versions.

Whose fault. The reward judges the policy only when the episode ran as intended; otherwise the
trajectory is left out of training, as environments' failures are (``Trajectory.judged``):

* ``infra_error``: the endpoint could not serve one of the episode's calls (a dead engine: 5xx;
  too many sessions: 429), whatever the agent did with the error, or the agent raised the SDK's
  ``APIConnectionError`` / ``APITimeoutError`` / ``InternalServerError`` / ``RateLimitError``; or
  the environment's grader reported ``info["infra_error"]``;
* ``error`` (``"agent: ..."``): the agent raised anything else (a bug in the agent cannot be told
  from the policy's doing, so it is never a reward), returned something that is neither a number
  nor a string, made no chat call, or ran past ``agent.timeout_s``; ``"env: ..."``: the
  environment's reset or grading raised;
* the policy's fault, a judged episode: whatever the agent returns (an agent that wants bad
  output punished catches its own exceptions and returns a low reward), and a conversation that
  outgrew ``rollout.max_total_tokens`` (the SDK's ``BadRequestError`` with code
  ``context_length_exceeded``): reward 0, ``truncated``, ``stop_reason="context_length"``.

Not guaranteed: reproducible sampling (calls carry no per-turn seed unless the agent sets one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
from aiohttp import web
from pydantic import Field, field_validator

from agentrl.config import Config, ConfigError
from agentrl.engine_pool import Engine
from agentrl.engine_pool.gateway import (
    SESSION_HEADER,
    Gateway,
    GatewayError,
    GatewayRoutes,
    SessionRecord,
)
from agentrl.engine_pool.gateway.protocol import Sampling
from agentrl.envs import INFRA_ERROR, make_env
from agentrl.rollout.mixture import EnvSpec
from agentrl.rollout.runner import EnvMaker, RolloutConfig, RolloutTask, env_tags
from agentrl.rollout.trajectory import Trajectory, Turn
from agentrl.tokenization import SegmentKind, TokenTrajectory

# the SDK's errors for calls the endpoint could not serve (APITimeoutError is a connection error)
INFRA_EXCEPTIONS = (openai.APIConnectionError, openai.InternalServerError, openai.RateLimitError)


class AgentConfig(Config):
    """Your own agent as the rollout source (``agent``); ``env`` then gives its tasks and grades."""

    entry: str | None = None
    """The agent, an async function ``(task, client) -> reward or answer``: ``"module:function"``
    or ``"path/to/file.py:function"`` (a module is looked up from the working directory too).
    None: episodes are the environment's own turns (the default). See docs/training.md."""
    timeout_s: float = Field(600.0, gt=0)
    """Wall-clock limit of one episode of the agent; past it the episode is an error, left out."""

    @field_validator("entry")
    @classmethod
    def _entry_shape(cls, entry: str | None) -> str | None:
        if entry is not None and not all(entry.rpartition(":")[::2]):
            raise ValueError(f"give the agent as 'module:function', got {entry!r}")
        return entry


@dataclass(frozen=True)
class AgentTask:
    """What the agent is given: the environment's task and where it runs."""

    messages: list[dict[str, Any]]
    """The environment's opening messages (its system prompt and the question)."""
    tools: list[dict[str, Any]]
    """The environment's tool schemas (OpenAI format; empty when it has none)."""
    info: dict[str, Any]
    """The environment's reset info."""
    model: str
    """The model name to send (``model=``)."""
    group: int
    sample: int
    seed: int


Agent = Callable[[AgentTask, openai.AsyncOpenAI], Awaitable[Any]]


def load_agent(entry: str) -> Agent:
    """The async function ``entry`` names (:attr:`AgentConfig.entry`); ConfigError naming
    ``agent.entry`` when it cannot be found or is not an async function."""
    module_name, _, name = entry.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            spec = importlib.util.spec_from_file_location(f"agentrl_agent_{path.stem}", path)
            if spec is None or spec.loader is None or not path.is_file():
                raise FileNotFoundError(f"no file {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.append(os.getcwd())
            module = importlib.import_module(module_name)
        agent = getattr(module, name)
    except Exception as exc:
        raise ConfigError(f"agent.entry {entry!r}: {type(exc).__name__}: {exc}") from None
    if not inspect.iscoroutinefunction(agent):
        raise ConfigError(f"agent.entry {entry!r} is not an async function (async def)")
    return agent


class AgentRunner:
    """Runs episodes of an agent against one engine (see the module docstring); a
    :class:`~agentrl.rollout.runner.Runner`. Use ``async with`` (or :meth:`start` /
    :meth:`aclose`): it serves the endpoint the agents' clients call."""

    def __init__(
        self,
        agent: Agent | str,
        make_env: EnvMaker,
        engine: Engine,
        tokenizer: Any,
        *,
        env_id: str = "",
        model_name: str = "policy",
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        max_total_tokens: int = 4096,
        stop: tuple[str, ...] = (),
        timeout_s: float = 600.0,
        template_policy: str = "keep",
        seams: str = "keep",
    ) -> None:
        self.agent = load_agent(agent) if isinstance(agent, str) else agent
        self.make_env = make_env
        self.env_id = env_id
        self.temperature, self.top_p, self.stop = temperature, top_p, stop
        self.max_new_tokens, self.max_total_tokens = max_new_tokens, max_total_tokens
        self.timeout_s = timeout_s
        self.gateway = Gateway(
            engine,
            tokenizer,
            model_name=model_name,
            context_length=max_total_tokens,
            template_policy=template_policy,
            seams=seams,
            sampling_policy=self._sampling,
            resume_aborted=True,
        )
        self.url = ""
        self._site: web.AppRunner | None = None
        self._faults: dict[str, str] = {}  # session -> the first call the endpoint failed
        self._running: dict[str, int] = {}  # session -> its calls being served
        self._abandoned: set[str] = set()  # closed sessions with a call still running
        self.episodes = 0
        self.segments_dropped = 0
        """Segments of finished sessions that are not trained on (siblings, left branches)."""
        self.segments_earlier = 0
        """Segments of finished sessions trained as their episode's earlier history."""

    @classmethod
    def configured(
        cls,
        config: AgentConfig,
        rollout: RolloutConfig,
        env: EnvSpec,
        engine: Engine,
        tokenizer: Any,
    ) -> AgentRunner:
        """The runner a train config describes: ``agent``, ``rollout`` and the environment."""
        if config.entry is None:
            raise ConfigError("agent.entry is not set: there is no agent to run")
        return cls(
            config.entry,
            functools.partial(make_env, env.id, **env.kwargs),
            engine,
            tokenizer,
            env_id=env.id,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            max_new_tokens=rollout.max_new_tokens,
            max_total_tokens=rollout.max_total_tokens,
            stop=tuple(rollout.stop),
            timeout_s=config.timeout_s,
            template_policy=rollout.template_policy,
            seams=rollout.token_seams,
        )

    async def __aenter__(self) -> AgentRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Serve the endpoint on a free loopback port (:attr:`url`)."""
        if self._site is not None:
            return
        app = web.Application(middlewares=[self._watch], client_max_size=64 << 20)
        GatewayRoutes(self.gateway).add_to(app)
        self._site = web.AppRunner(app, access_log=None)
        await self._site.setup()
        await web.TCPSite(self._site, "127.0.0.1", 0).start()
        host, port = self._site.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def aclose(self) -> None:
        if self._site is not None:
            await self._site.cleanup()
            self._site = None

    def metrics(self) -> dict[str, float]:
        """Counts since the start: ``agent/episodes`` run, ``agent/segments_dropped`` (segments
        not trained on), ``agent/segments_earlier`` (segments of a rewritten history, trained
        with their episode), ``agent/splits`` (calls that started a new segment)."""
        return {
            "agent/episodes": float(self.episodes),
            "agent/segments_dropped": float(self.segments_dropped),
            "agent/segments_earlier": float(self.segments_earlier),
            "agent/splits": float(self.gateway.sessions.splits),
        }

    def _sampling(self, asked: Sampling, prompt_tokens: int) -> Sampling:
        """The trainer's sampling for a call, whatever the agent asked (module docstring)."""
        room = self.max_total_tokens - prompt_tokens
        budget = min(asked.max_tokens or self.max_new_tokens, self.max_new_tokens)
        return dataclasses.replace(
            asked,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=0,
            max_tokens=min(budget, room) if room > 0 else budget,
            stop=tuple(dict.fromkeys(asked.stop + self.stop)),
        )

    @web.middleware
    async def _watch(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Remember, per session, the first call the endpoint could not serve (5xx, 429)."""
        session = request.match_info.get("session_id") or request.headers.get(SESSION_HEADER)
        if not session:
            return await handler(request)
        self._running[session] = self._running.get(session, 0) + 1
        ended = False
        try:
            response = await handler(request)
        finally:
            self._running[session] -= 1
            if not self._running[session]:
                try:
                    if session in self._abandoned:  # its episode ended while this call ran
                        self._abandoned.discard(session)
                        await self._end(session)
                        ended = True
                finally:  # only once the engine was told is the session no longer running
                    if not self._running.get(session):
                        self._running.pop(session, None)
        if not ended and (response.status >= 500 or response.status == 429):
            text = response.text if isinstance(response, web.Response) else ""
            self._faults.setdefault(session, f"HTTP {response.status}: {text}"[:500])
        return response

    async def run(self, task: RolloutTask) -> Trajectory:
        if self._site is None:
            raise RuntimeError("AgentRunner.run before start(): use `async with AgentRunner(...)`")
        env = self.make_env()
        self.episodes += 1
        try:
            return await self._episode(env, task)
        finally:
            await env.aclose()

    async def _episode(self, env: Any, task: RolloutTask) -> Trajectory:
        trajectory = Trajectory(
            self.env_id, task.group, task.sample, task.seed, TokenTrajectory.empty(), []
        )
        try:
            messages, info = await env.areset(seed=task.seed, options=task.options)
            trajectory.tags = env_tags(info)
        except Exception as exc:
            return _fail(trajectory, f"env: {type(exc).__name__}: {exc}")
        tools = list(info.get("tools") or [])
        agent_task = AgentTask(
            list(messages), tools, info, self.gateway.model_name, task.group, task.sample, task.seed
        )
        # unique per run: a group launched again (a resumed run) must not meet an old session
        session = f"g{task.group}-s{task.sample}-{uuid.uuid4().hex[:12]}"
        returned: Any = None
        try:
            client = openai.AsyncOpenAI(
                base_url=f"{self.url}/sessions/{session}/v1", api_key="agentrl", max_retries=0
            )
            async with client:
                returned = await asyncio.wait_for(self.agent(agent_task, client), self.timeout_s)
        except openai.BadRequestError as exc:
            if exc.code == "context_length_exceeded":  # the policy's own doing: judged, reward 0
                trajectory.truncated, trajectory.stop_reason = True, "context_length"
            else:
                _fail(trajectory, f"agent: {type(exc).__name__}: {exc}")
        except INFRA_EXCEPTIONS as exc:
            trajectory.infra_error = f"agent: {type(exc).__name__}: {exc}"
        except TimeoutError:
            _fail(trajectory, f"agent: ran past agent.timeout_s={self.timeout_s:g}")
        except Exception as exc:
            _fail(trajectory, f"agent: {type(exc).__name__}: {exc}")
        finally:
            record = await self._close(session)
        fault = self._faults.pop(session, None)
        if fault is not None and trajectory.infra_error is None:
            trajectory.infra_error = f"gateway: {fault}"
        if record is None or not record.segments:
            if trajectory.judged:
                _fail(trajectory, "agent: it made no chat call in its session")
            return trajectory
        self._take_segment(trajectory, record)
        if trajectory.judged and trajectory.stop_reason != "context_length":
            await self._reward(trajectory, env, returned)
        return trajectory

    async def _close(self, session: str) -> SessionRecord | None:
        """Hand out the session (None if it made no call) and end it on the engine; a call of it
        still running (the agent timed out) is dropped when it ends, rather than left as an open
        session."""
        if session in self._running:
            self._abandoned.add(session)
        return await self._end(session)

    async def _end(self, session: str) -> SessionRecord | None:
        try:
            return await self.gateway.close_session(session)
        except GatewayError:  # 404: the session never made a call that succeeded
            return None

    def _take_segment(self, trajectory: Trajectory, record: SessionRecord) -> None:
        """The segment holding the last call's first choice becomes the trajectory, and the
        segments of a rewritten history before it its :attr:`~Trajectory.earlier` ones."""
        last = max(
            record.segments,
            # a sibling segment (choices > 0 of an n > 1 call) holds no first choice
            key=lambda s: max((c.call for c in s.calls if c.choice == 0), default=-1),
        )
        begins = min((c.call for c in last.calls), default=0)
        earlier = sorted(
            (
                s
                for s in record.segments
                if s is not last
                and any(c.choice == 0 for c in s.calls)
                and max(c.call for c in s.calls) < begins
            ),
            key=lambda s: min(c.call for c in s.calls),
        )
        self.segments_dropped += len(record.segments) - 1 - len(earlier)
        self.segments_earlier += len(earlier)
        trajectory.tokens, trajectory.messages = last.trajectory, list(last.messages)
        trajectory.earlier = [s.trajectory for s in earlier]
        for segment in [*earlier, last]:
            tokens = segment.trajectory
            completions = [s for s in tokens.segments if s.kind is SegmentKind.COMPLETION]
            for call, piece in zip(segment.calls, completions, strict=False):
                version = tokens.versions[piece.end - 1] if piece.end > piece.start else -1
                turn = Turn(
                    call.prompt_tokens, call.completion_tokens, call.finish_reason, version, 0
                )
                trajectory.turns.append(turn)

    async def _reward(self, trajectory: Trajectory, env: Any, returned: Any) -> None:
        if isinstance(returned, int | float):
            trajectory.reward = float(returned)
            trajectory.terminated, trajectory.stop_reason = True, "agent"
            return
        if not isinstance(returned, str):
            kind = type(returned).__name__
            _fail(trajectory, f"agent: returned {kind}; expected a number (reward) or a string")
            return
        try:
            _, reward, terminated, truncated, info = await env.astep(returned)
        except Exception as exc:
            _fail(trajectory, f"env: {type(exc).__name__}: {exc}")
            return
        trajectory.reward = float(reward)
        trajectory.terminated, trajectory.truncated = bool(terminated), bool(truncated)
        trajectory.stop_reason = "terminated" if terminated else "graded"
        trajectory.reward_components.update(info.get("reward_components", {}))
        if info.get(INFRA_ERROR):
            trajectory.infra_error = str(info[INFRA_ERROR])
        if isinstance(info.get("submission"), dict):
            trajectory.submission = dict(info["submission"])


def _fail(trajectory: Trajectory, error: str) -> Trajectory:
    trajectory.error, trajectory.stop_reason = error, "error"
    return trajectory
