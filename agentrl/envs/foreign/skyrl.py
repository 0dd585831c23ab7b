"""``agentrl/SkyRL-v0``: a ``skyrl-gym`` environment (a ``BaseTextEnv``) as an
:class:`~agentrl.envs.AgentEnv` that trains here, token-exact.

::

    env = gymnasium.make("agentrl/SkyRL-v0", env="gsm8k_multi_turn", tasks=[
        {"prompt": [{"role": "user", "content": "What is 2 + 3?"}],
         "reward_spec": {"method": "rule", "ground_truth": "5"}, "max_turns": 2},
    ])

The tasks are rows of SkyRL's dataset format: ``prompt`` (chat messages) and the rest the
environment's ``extras`` (``reward_spec``, ``extra_info``, ``max_turns``, ...; ``env_class``,
if present, is dropped: ``env`` names the class). Each episode makes a fresh skyrl-gym
environment, as SkyRL's generator does (``skyrl_gym.make(env, env_config=..., extras=row)``),
and drives it as the generator does:

==============================  ===========================================================
agentrl                         skyrl-gym
==============================  ===========================================================
``areset`` messages             ``env.init(prompt)``'s conversation; its metadata goes to
                                the reset info under ``"skyrl"``
``astep(text)``                 ``env.step(text)`` (in a worker thread)
step messages, reward           ``observations``, ``reward``
terminated                      ``done`` (skyrl-gym has no truncation; ``max_turns`` in a
                                row is the environment's own limit)
info                            ``{"skyrl": metadata}`` (JSON-safe)
``aclose`` / a new reset        ``env.close()``
==============================  ===========================================================

Token-exact: the action is the assistant's text as decoded and the observations are appended
as chat-template deltas. A ``postprocessed_action`` (SkyRL rewrites the turn's tokens with it,
which breaks token-in-token-out) cannot change tokens already sampled here: it is left out and
its text put in the step info under ``"postprocessed_action"``; use the environment's stop
strings instead (Search-v0 does). ``get_metrics()`` is put in the info of the step that ends
the episode, under ``"skyrl_metrics"``.

Requires ``skyrl-gym`` (not a dependency of agentrl; ``scripts/setup-skyrl-env`` makes a venv
with it), imported when the first environment is made.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

from pydantic import Field

from agentrl.config import Config
from agentrl.envs.core import AgentEnv, ResetResult, StepResult
from agentrl.envs.remote.protocol import json_safe


class SkyRLConfig(Config):
    """Keyword arguments of ``gymnasium.make("agentrl/SkyRL-v0", ...)``."""

    env: str
    """The skyrl-gym environment: an id of its registry (``gsm8k_multi_turn``, ``aime``, ...)
    or ``"package.module:Class"`` (a ``BaseTextEnv`` subclass)."""
    env_config: dict[str, Any] = Field(default_factory=dict)
    """The environment's ``env_config`` (SkyRL's ``environment.skyrl_gym.<env>`` section), given
    to it as an OmegaConf ``DictConfig``, as SkyRL does."""
    tasks: list[dict[str, Any]] = Field(min_length=1)
    """Rows of SkyRL's dataset format, each a ``prompt`` (chat messages) and the extras the
    environment reads (``reward_spec``, ``extra_info``, ``max_turns``, ...)."""


class SkyRLEnv(AgentEnv):
    """A skyrl-gym environment (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        self.config = SkyRLConfig.build("agentrl/SkyRL-v0", kwargs)
        for index, row in enumerate(self.config.tasks):
            prompt = row.get("prompt")
            if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
                raise ValueError(
                    f"agentrl/SkyRL-v0: tasks[{index}].prompt must be a list of chat messages"
                )
        self._env: Any = None

    @property
    def num_tasks(self) -> int:
        return len(self.config.tasks)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        await super().areset(seed=seed, options=options)
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(self.num_tasks))
        if not isinstance(index, int) or not 0 <= index < self.num_tasks:
            raise ValueError(f"agentrl/SkyRL-v0: options['index'] must be in [0, {self.num_tasks})")
        await self._close_env()
        row = dict(self.config.tasks[index])
        prompt = [dict(message) for message in row.pop("prompt")]
        row.pop("env_class", None)
        self._env = await asyncio.to_thread(self._make, row)
        messages, metadata = await asyncio.to_thread(self._env.init, prompt)
        return [dict(message) for message in messages], {"tools": [], "skyrl": json_safe(metadata)}

    async def astep(self, action: str) -> StepResult:
        if self._env is None:
            raise RuntimeError("agentrl/SkyRL-v0: step before reset")
        output = await asyncio.to_thread(self._env.step, action)
        done = bool(output["done"])
        info: dict[str, Any] = {"skyrl": json_safe(output.get("metadata") or {})}
        if output.get("postprocessed_action") is not None:
            info["postprocessed_action"] = output["postprocessed_action"]
        if done:
            info["skyrl_metrics"] = json_safe(self._env.get_metrics())
        messages = [dict(message) for message in output["observations"] or []]
        return messages, float(output["reward"]), done, False, info

    async def aclose(self) -> None:
        await self._close_env()

    def _make(self, extras: dict[str, Any]) -> Any:
        """A fresh skyrl-gym environment for one episode, made as SkyRL's generator makes it."""
        try:
            import skyrl_gym
            from omegaconf import DictConfig
        except ImportError as exc:
            raise ImportError(
                f"agentrl/SkyRL-v0 needs skyrl-gym ({exc}): pip install skyrl-gym, or run in the "
                "venv scripts/setup-skyrl-env makes"
            ) from exc

        env_config = DictConfig(self.config.env_config)
        if ":" in self.config.env:
            module_name, _, name = self.config.env.partition(":")
            cls = getattr(importlib.import_module(module_name), name)
            return cls(env_config=env_config, extras=extras)
        return skyrl_gym.make(self.config.env, env_config=env_config, extras=extras)

    async def _close_env(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            await asyncio.to_thread(env.close)
