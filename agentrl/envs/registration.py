"""Registration of agentrl environments with Gymnasium, including third-party plugins.

``import agentrl`` registers every built-in environment under the ``agentrl/`` namespace and every
environment that an installed package declares in the ``agentrl.envs`` entry-point group::

    # the plugin's pyproject.toml: the entry point's name is the env id, its value the class
    [project.entry-points."agentrl.envs"]
    "mypkg/Echo-v0" = "mypkg.envs:EchoEnv"

Plugin modules are imported only when their environment is made. Every environment is made through
:class:`EnvFactory`, which accepts, besides the environment's own keyword arguments, the wrapper
arguments ``max_turns`` (:class:`TurnLimit`) and ``max_observation_chars``
(:class:`ObservationLengthLimit`), and wraps the result in :class:`EpisodeGuard`. Gymnasium's
``OrderEnforcing`` and ``PassiveEnvChecker`` are turned off for these specs because they hide the
async verbs; run ``gymnasium.utils.env_checker.check_env(env.unwrapped)`` to check an environment.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from typing import Any

import gymnasium
from gymnasium.envs.registration import parse_env_id

from agentrl.envs.core import AgentEnv
from agentrl.envs.wrappers import AgentWrapper, EpisodeGuard, ObservationLengthLimit, TurnLimit

ENTRY_POINT_GROUP = "agentrl.envs"

BUILTIN_ENVS: dict[str, str] = {
    "agentrl/Math-v0": "agentrl.envs.math.env:MathEnv",
    "agentrl/Code-v0": "agentrl.envs.code.env:CodeEnv",
    "agentrl/Search-v0": "agentrl.envs.search.env:SearchEnv",
    "agentrl/SWE-v0": "agentrl.envs.swe.env:SWEEnv",
}
SERVICE_ENVS: dict[str, str] = {
    "agentrl/Remote-v0": "agentrl.envs.remote.env:RemoteEnv",
    "agentrl/OpenEnv-v0": "agentrl.envs.foreign.openenv:OpenEnvEnv",
    "agentrl/SkyRL-v0": "agentrl.envs.foreign.skyrl:SkyRLEnv",
}
"""Built-in environments that need a service (a server's ``url``), another system's package
(skyrl-gym) or arguments to run: registered as the others are, but kept out of BUILTIN_ENVS,
each of which makes and passes check_env alone."""
BUILTIN_DEFAULTS: dict[str, dict[str, Any]] = {"agentrl/SWE-v0": {"max_turns": 30}}
"""Default keyword arguments of built-in environments (a caller's own arguments replace them)."""


class EnvFactory:
    """Makes an environment from ``"module:Class"`` (imported on first use) or a class, applying
    the standard agentrl wrappers."""

    def __init__(self, target: str | type[AgentEnv]):
        self.target = (
            target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
        )
        self._cls = None if isinstance(target, str) else target

    def __repr__(self) -> str:
        return f"EnvFactory({self.target!r})"

    def load_class(self) -> type[AgentEnv]:
        if self._cls is None:
            module_name, _, attr = self.target.partition(":")
            self._cls = getattr(importlib.import_module(module_name), attr)
        return self._cls

    def __call__(
        self,
        *,
        max_turns: int | None = None,
        max_observation_chars: int | None = None,
        **kwargs: Any,
    ) -> AgentEnv | AgentWrapper:
        env: AgentEnv | AgentWrapper = self.load_class()(**kwargs)
        if not isinstance(env, AgentEnv):
            raise TypeError(f"{self.target} made a {type(env).__name__}, not an agentrl AgentEnv")
        if max_observation_chars is not None:
            env = ObservationLengthLimit(env, max_observation_chars)
        if max_turns is not None:
            env = TurnLimit(env, max_turns)
        return EpisodeGuard(env)


def make_env(env_id: str, **kwargs: Any) -> AgentEnv | AgentWrapper:
    """``gymnasium.make(env_id, **kwargs)`` for an agentrl environment, typed as one (its async
    verbs); TypeError when ``env_id`` names some other kind of environment."""
    env = gymnasium.make(env_id, **kwargs)
    if not isinstance(env, (AgentEnv, AgentWrapper)):
        raise TypeError(f"{env_id} is not an agentrl environment (it has no async verbs)")
    return env


def register_env(env_id: str, target: str | type[AgentEnv], **spec_kwargs: Any) -> None:
    """Register ``env_id`` (``namespace/Name-vN``) for an AgentEnv class, given as the class or as
    ``"module:Class"``; ``spec_kwargs`` go to ``gymnasium.register`` (e.g. default ``kwargs``)."""
    parse_env_id(env_id)  # raises gymnasium.error.Error on a malformed id
    if isinstance(target, type):
        if not issubclass(target, AgentEnv):
            raise TypeError(f"{env_id}: {target.__name__} is not an AgentEnv subclass")
    elif ":" not in target:
        raise ValueError(f"{env_id}: entry point {target!r} must look like 'package.module:Class'")
    gymnasium.register(
        id=env_id,
        entry_point=EnvFactory(target),
        order_enforce=False,
        disable_env_checker=True,
        **spec_kwargs,
    )


def register_builtin_envs() -> None:
    for env_id, target in {**BUILTIN_ENVS, **SERVICE_ENVS}.items():
        if env_id not in gymnasium.registry:
            register_env(env_id, target, kwargs=BUILTIN_DEFAULTS.get(env_id, {}))


def register_plugin_envs() -> list[str]:
    """Register the environments of every ``agentrl.envs`` entry point; return their ids.

    A broken entry point (malformed id or target, id already taken by another class) is skipped with
    a warning naming the distribution, so one bad plugin never breaks ``import agentrl``.
    """
    registered = []
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {entry.name!r} of {entry.dist.name if entry.dist else 'unknown'}"
        existing = gymnasium.registry.get(entry.name)
        if existing is not None:
            if getattr(existing.entry_point, "target", None) != entry.value:
                warnings.warn(f"{where}: id already registered, skipped", stacklevel=2)
            continue
        try:
            register_env(entry.name, entry.value)
        except (gymnasium.error.Error, ValueError) as exc:
            warnings.warn(f"{where}: {exc}; skipped", stacklevel=2)
            continue
        registered.append(entry.name)
    return registered
