"""An agentrl environment as a ``skyrl-gym`` ``BaseTextEnv``, so that SkyRL's trainer (its
``SkyRLGymGenerator``) trains on it.

::

    from agentrl.envs.foreign.skyrl_export import register_skyrl_env
    register_skyrl_env("agentrl_math", "agentrl/Math-v0", mode="multi", sandbox="subprocess")
    # SkyRL then makes it as for any of its environments:
    env = skyrl_gym.make("agentrl_math", env_config=cfg, extras=row)

SkyRL's generator makes one environment per trajectory, ``skyrl_gym.make(env_class,
env_config=environment.skyrl_gym[env_class], extras=row)`` with ``row`` the dataset row less its
``prompt`` and ``env_class``, and with ``extras["max_turns"]`` set to ``generator.max_turns``;
then ``init(prompt)``, ``step(text)`` until ``done``, ``get_metrics()`` and ``close()``,
each in a worker thread or on its event loop's thread. The mapping:

==============================  ===========================================================
skyrl-gym                       agentrl
==============================  ===========================================================
``init(prompt)``                ``reset(seed=extra_info["seed"], options={"index":
                                extra_info["index"]})`` (either may be absent); returns the
                                environment's opening messages, not ``prompt`` (the task is
                                the environment's), and metadata ``{"tools": [...]}``
``step(text)``                  ``step(text)``: ``observations`` the new messages,
                                ``reward``, ``done = terminated or truncated``, ``metadata``
                                the step info
``extras["max_turns"]``         the ``max_turns`` wrapper (TurnLimit)
``env_config``                  ``env_id`` and ``kwargs`` of the environment, when
                                :func:`register_skyrl_env` did not fix them
``get_metrics()``               ``{"turns": n, "reward": sum of rewards}``
``close()``                     ``close()``
==============================  ===========================================================

Guaranteed: the environment gets the generator's text unchanged, and the verbs run on the
environment's own event loop (a worker thread when called inside a running loop, so a
generator that steps on its event loop's thread works too). Not guaranteed: SkyRL has no
infrastructure-failure channel: a step whose info has ``"infra_error"`` scores 0 for SkyRL
(the message is in ``metadata``); turning it into a dropped sample is the trainer's affair.

Requires ``skyrl-gym`` (not a dependency of agentrl), imported with this module.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register

from agentrl.envs.registration import make_env
from agentrl.envs.remote.protocol import json_safe

T = TypeVar("T")


class AgentrlTextEnv(BaseTextEnv):
    """One episode of an agentrl environment as a skyrl-gym ``BaseTextEnv`` (see the module
    docstring)."""

    def __init__(
        self,
        env_config: Any = None,
        extras: dict[str, Any] | None = None,
        *,
        env_id: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        config = dict(env_config or {})
        env_id = env_id or config.get("env_id")
        if not env_id:
            raise ValueError("AgentrlTextEnv: no env_id (register_skyrl_env's or env_config's)")
        kwargs = dict(env_kwargs if env_kwargs is not None else config.get("kwargs") or {})
        extras = dict(extras or {})
        if extras.get("max_turns") is not None:
            self.max_turns = int(extras["max_turns"])
            kwargs["max_turns"] = self.max_turns
        extra_info = dict(extras.get("extra_info") or {})
        self._seed = extra_info.get("seed")
        self._index = extra_info.get("index")
        self.total_reward = 0.0
        self._worker: concurrent.futures.ThreadPoolExecutor | None
        self._worker = concurrent.futures.ThreadPoolExecutor(1, "agentrl-env")
        self.env = self._call(lambda: make_env(env_id, **kwargs))

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        options = None if self._index is None else {"index": int(self._index)}
        messages, info = self._call(lambda: self.env.reset(seed=self._seed, options=options))
        return [dict(m) for m in messages], {"tools": json_safe(info.get("tools", []))}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        messages, reward, terminated, truncated, info = self._call(lambda: self.env.step(action))
        self.turns += 1
        self.total_reward += float(reward)
        return BaseTextEnvStepOutput(
            observations=[dict(m) for m in messages],
            reward=float(reward),
            done=bool(terminated or truncated),
            metadata=json_safe(info),
        )

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns, "reward": self.total_reward}

    def close(self) -> None:
        if self._worker is None:
            return  # closed already
        try:
            self._call(self.env.close)
        finally:
            self._worker.shutdown()
            self._worker = None

    def _call(self, verb: Callable[[], T]) -> T:
        """Run ``verb`` on this episode's own worker thread, where no event loop runs, so the
        environment's synchronous verbs work whatever thread SkyRL calls from."""
        if self._worker is None:
            raise RuntimeError("AgentrlTextEnv: the environment is closed")
        return self._worker.submit(verb).result()


def register_skyrl_env(skyrl_id: str, env_id: str, **env_kwargs: Any) -> None:
    """Register agentrl's ``env_id`` (made with ``env_kwargs``) in skyrl-gym's registry as
    ``skyrl_id``, the ``env_class`` of SkyRL's dataset rows and config."""
    if env_id not in gymnasium.registry:
        raise ValueError(f"register_skyrl_env: {env_id!r} is not a registered environment")
    register(
        id=skyrl_id,
        entry_point=AgentrlTextEnv,
        kwargs={"env_id": env_id, "env_kwargs": env_kwargs},
    )
