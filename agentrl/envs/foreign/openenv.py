"""``agentrl/OpenEnv-v0``: an environment served by OpenEnv's own server (``openenv``'s
``create_app``: its ``/ws`` session route, its Action and Observation types) as an
:class:`~agentrl.envs.AgentEnv` that trains here, token-exact.

::

    env = gymnasium.make("agentrl/OpenEnv-v0", url="http://localhost:8000",
                         action_field="message", observation_field="echoed_message", max_turns=3)

It is :class:`~agentrl.envs.remote.RemoteEnv` (the same sessions, server spreading and
infra_error guarantee, over the one wire implementation) with another mapping of text and
messages onto the foreign environment's types:

=============================  =============================================================
agentrl                        OpenEnv (``{"observation", "reward", "done"}``)
=============================  =============================================================
``astep(text)``                step data ``{action_field: text, **action_fields}``
reset messages                 ``system_prompt`` (if set), then one ``observation_role``
                               message holding the reset observation
step messages                  one ``observation_role`` message holding the observation, or
                               none when ``done`` (``observe_final=True`` keeps it)
message content                ``observation[observation_field]`` (a string as is, any other
                               value as JSON); no field: the observation less its
                               ``metadata``, as JSON
reward                         ``reward`` (``None`` counts 0)
terminated                     ``done``; truncated is never set here: ``max_turns`` truncates
info                           reset: ``{"tools": []}``; step: ``{"metadata": ...}`` when the
                               observation carries a non-empty ``metadata``, else ``{}``
=============================  =============================================================

The action is the assistant's text exactly as decoded, so the trajectory's tokens are the
engine's; the observation's text is what the chat template renders next. Not guaranteed:
an Observation's ``metadata`` reaches ``info`` only where the server sends it (OpenEnv 0.10.0's
``/ws`` route does, its HTTP ``/step`` does not); a foreign environment whose episodes never end
(the echo environment) needs ``max_turns``; OpenEnv's server holds one session unless its app was made with a larger
``max_concurrent_envs`` (each GRPO sample is one session).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import Field

from agentrl.envs.core import ResetResult, StepResult
from agentrl.envs.remote.env import RemoteConfig, RemoteEnv
from agentrl.envs.spaces import Message


class OpenEnvConfig(RemoteConfig):
    """Keyword arguments of ``gymnasium.make("agentrl/OpenEnv-v0", ...)`` (``url`` and the
    timeouts as for ``agentrl/Remote-v0``)."""

    action_field: str = "message"
    """The Action field that carries the assistant's text (the echo environment's ``message``)."""
    action_fields: dict[str, Any] = Field(default_factory=dict)
    """Fixed values of the Action's other fields, sent with every step."""
    observation_field: str | None = None
    """The Observation field whose value becomes the message's content (the echo environment's
    ``echoed_message``); None: the whole observation, as JSON."""
    observation_role: Literal["user", "tool"] = "user"
    """The role of the message an observation becomes."""
    system_prompt: str | None = None
    """A system message put before the reset observation's message."""
    observe_final: bool = False
    """Also add a message for the observation of the step that ends the episode."""


class OpenEnvEnv(RemoteEnv):
    """An environment on OpenEnv's own server (see the module docstring)."""

    env_id: ClassVar[str] = "agentrl/OpenEnv-v0"
    config_class: ClassVar[type[RemoteConfig]] = OpenEnvConfig
    config: OpenEnvConfig

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.config.action_field in self.config.action_fields:
            raise ValueError(
                f"{self.env_id}: action_fields sets {self.config.action_field!r}, the field "
                "that carries the text (action_field)"
            )

    def action_data(self, action: str) -> dict[str, Any]:
        return {**self.config.action_fields, self.config.action_field: action}

    def reset_result(self, payload: dict[str, Any]) -> ResetResult:
        messages: list[Message] = []
        if self.config.system_prompt is not None:
            messages.append({"role": "system", "content": self.config.system_prompt})
        messages.append(self._message(payload))
        return messages, {"tools": []}

    def step_result(self, payload: dict[str, Any]) -> StepResult:
        done = bool(payload.get("done", False))
        messages = [] if done and not self.config.observe_final else [self._message(payload)]
        metadata = (payload.get("observation") or {}).get("metadata")
        info = {"metadata": metadata} if metadata else {}
        return messages, float(payload.get("reward") or 0.0), done, False, info

    def _message(self, payload: dict[str, Any]) -> Message:
        observation = payload.get("observation")
        if not isinstance(observation, dict):
            raise ValueError(f"{self.env_id}: the server's reply has no observation: {payload}")
        field = self.config.observation_field
        if field is None:
            value: Any = {key: item for key, item in observation.items() if key != "metadata"}
        elif field in observation:
            value = observation[field]
        else:
            raise ValueError(
                f"{self.env_id}: observation_field {field!r} is not in the server's observation "
                f"(its fields: {sorted(observation)})"
            )
        content = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        return {"role": self.config.observation_role, "content": content}
