"""Wrappers every agent environment needs, each overriding one async hook.

:class:`AgentWrapper` is a ``gymnasium.Wrapper`` with the async verbs (``areset``, ``astep``,
``aclose``); its synchronous verbs run them through the environment's ``run_sync``, so a wrapper
behaves the same through ``step`` and ``await astep``. Gymnasium's own wrappers have no async verbs:
put them outside the agentrl wrappers, or use these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium

from agentrl.envs.core import AgentEnv, ResetResult, StepResult
from agentrl.envs.spaces import Message


class AgentWrapper(gymnasium.Wrapper[list[Message], str, list[Message], str]):
    """Base wrapper: forwards the async verbs; subclasses override the ones they change."""

    env: AgentEnv | AgentWrapper
    """The wrapped environment: always an agentrl one (checked in ``__init__``), so it has the
    async verbs."""

    def __init__(self, env: AgentEnv | AgentWrapper):
        if not isinstance(env, (AgentEnv, AgentWrapper)):
            raise TypeError(
                f"{type(self).__name__} wraps an AgentEnv or AgentWrapper, got {type(env).__name__}"
            )
        super().__init__(env)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        return await self.env.areset(seed=seed, options=options)

    async def astep(self, action: str) -> StepResult:
        return await self.env.astep(action)

    async def aclose(self) -> None:
        await self.env.aclose()

    @property
    def agent_env(self) -> AgentEnv:
        env = self.unwrapped
        assert isinstance(env, AgentEnv)
        return env

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        return self.agent_env.run_sync(self.areset(seed=seed, options=options))

    def step(self, action: str) -> StepResult:
        return self.agent_env.run_sync(self.astep(action))

    def close(self) -> None:
        self.agent_env.run_sync(self.aclose())


class EpisodeGuard(AgentWrapper):
    """Rejects ``step`` before ``reset`` and after the episode ended, with a clear error.

    ``gymnasium.make`` applies it outermost to every agentrl environment (instead of Gymnasium's
    ``OrderEnforcing``, which has no async verbs).
    """

    def __init__(self, env: AgentEnv | AgentWrapper):
        super().__init__(env)
        self._state = "new"

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        result = await self.env.areset(seed=seed, options=options)
        self._state = "running"
        return result

    async def astep(self, action: str) -> StepResult:
        if self._state != "running":
            when = "before reset()" if self._state == "new" else "after the episode ended"
            raise gymnasium.error.ResetNeeded(f"step() called {when}; call reset() first")
        obs, reward, terminated, truncated, info = await self.env.astep(action)
        if terminated or truncated:
            self._state = "done"
        return obs, reward, terminated, truncated, info


class TurnLimit(AgentWrapper):
    """Truncates the episode after ``max_turns`` assistant turns (sets ``truncated``), and
    tells the environment which step is the last (:attr:`AgentEnv.final_turn`): set when this
    limit ends the episode after the step, kept when something outside it already set it (a
    limit further out, or the client of an environment server)."""

    def __init__(self, env: AgentEnv | AgentWrapper, max_turns: int):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        super().__init__(env)
        self.max_turns = max_turns
        self._turns = 0

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        self._turns = 0
        self.agent_env.final_turn = False
        return await self.env.areset(seed=seed, options=options)

    async def astep(self, action: str) -> StepResult:
        env = self.agent_env
        env.final_turn = env.final_turn or self._turns + 1 >= self.max_turns
        obs, reward, terminated, truncated, info = await self.env.astep(action)
        self._turns += 1
        if self._turns >= self.max_turns and not terminated:
            truncated = True
        return obs, reward, terminated, truncated, info


class ObservationLengthLimit(AgentWrapper):
    """Caps each message the environment adds during an episode at ``max_chars`` characters.

    Over-long content keeps its head and tail with a marker in between saying how many characters
    were cut; ``info["observation_chars_cut"]`` counts them. The opening messages are left alone.
    """

    def __init__(self, env: AgentEnv | AgentWrapper, max_chars: int):
        if max_chars < 64:
            raise ValueError(f"max_chars must be >= 64, got {max_chars}")
        super().__init__(env)
        self.max_chars = max_chars

    async def astep(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = await self.env.astep(action)
        cut_total = 0
        limited = []
        for message in obs:
            content, cut = truncate_middle(message["content"], self.max_chars)
            cut_total += cut
            limited.append({**message, "content": content})
        if cut_total:
            info = {**info, "observation_chars_cut": cut_total}
        return limited, reward, terminated, truncated, info


def truncate_middle(text: str, max_chars: int) -> tuple[str, int]:
    """Keep the head and tail of ``text`` within ``max_chars``; return (text, characters cut)."""
    if len(text) <= max_chars:
        return text, 0
    marker_room = 48
    keep = max_chars - marker_room
    head, tail = keep - keep // 2, keep // 2
    cut = len(text) - head - tail
    marker = f"\n[... {cut} characters truncated ...]\n"
    return text[:head] + marker + text[len(text) - tail :], cut


RewardFn = Callable[[float, dict[str, Any]], float]


class RewardShaping(AgentWrapper):
    """Replaces each step's reward by ``shape(reward, info)``; the original is kept in
    ``info["raw_reward"]``. Reward components that environments report in ``info`` (e.g. Math-v0's
    ``info["reward_components"]``) are the usual inputs, e.g. a format bonus::

        RewardShaping(env, lambda r, info: r + 0.1 * info["reward_components"]["format"])
    """

    def __init__(self, env: AgentEnv | AgentWrapper, shape: RewardFn):
        super().__init__(env)
        self.shape = shape

    async def astep(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = await self.env.astep(action)
        shaped = float(self.shape(float(reward), info))
        return obs, shaped, terminated, truncated, {**info, "raw_reward": float(reward)}
