"""OpenEnv's wire protocol, as ``openenv`` 0.10.0 speaks it, for an agentrl environment.

OpenEnv (``openenv/core/env_server/http_server.py`` and ``types.py``) moves three models: an
``Action`` (``extra="forbid"``, a ``metadata`` dict), an ``Observation`` (``done``, ``reward``,
``metadata`` plus the environment's fields) and a ``State`` (``episode_id``, ``step_count``,
extra fields allowed). On the wire an observation travels as ``{"observation": <its fields less
done and reward, metadata included>, "reward": ..., "done": ...}``, plus a top-level ``metadata``
when it is not empty (``serialize_observation``), over HTTP as the body and over the ``/ws``
session route as the ``data`` of ``{"type": "observation"}``. An agentrl environment's
observation has empty ``metadata`` (its ``info`` travels as a field of its own).

The mapping of an :class:`~agentrl.envs.AgentEnv` onto those models:

=======================  ============================================================
agentrl                  OpenEnv
=======================  ============================================================
``astep(text)``          ``step`` with action ``{"text": text, "metadata": {}}``
``areset`` messages      ``observation.messages`` (reset: the opening messages)
``astep`` messages       ``observation.messages`` (only the messages the step added)
``info``                 ``observation.info`` (JSON values; see :func:`json_safe`)
``terminated``           ``observation.terminated``
``truncated``            ``observation.truncated``
``reward``               ``reward`` (``None`` after a reset)
``terminated or trunc``  ``done``
``seed``, ``options``    reset ``data``: ``seed``, ``episode_id``, ``options`` and any
                         other key, which joins ``options`` (``{"index": 3}``)
``final_turn``           the action's ``metadata``: ``{"final_turn": true}`` (else ``{}``)
``num_tasks``            the state's ``num_tasks`` (extra fields are allowed in a State)
=======================  ============================================================

``info["infra_error"]`` arrives as it left the environment (``observation.info.infra_error``),
next to the environment's reward: it is for the client to leave the episode out of training, as
agentrl's trainer does, never folded into the reward here.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.envs import Message

# The error codes of OpenEnv's WSErrorCode (types.py), which its clients and validators read.
INVALID_JSON = "INVALID_JSON"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
VALIDATION_ERROR = "VALIDATION_ERROR"
EXECUTION_ERROR = "EXECUTION_ERROR"
CAPACITY_REACHED = "CAPACITY_REACHED"
FACTORY_ERROR = "FACTORY_ERROR"
SESSION_ERROR = "SESSION_ERROR"

FINAL_TURN = "final_turn"
"""The step action's ``metadata`` key by which a client says its turn limit ends the episode
after this step (:attr:`agentrl.envs.AgentEnv.final_turn`); absent or false otherwise."""


class AgentAction(BaseModel):
    """An agentrl action as an OpenEnv ``Action``: the assistant's text for one turn."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="The assistant's text for one turn, as decoded")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Additional metadata for the action"
    )


class AgentObservation(BaseModel):
    """An agentrl observation as an OpenEnv ``Observation``."""

    model_config = ConfigDict(extra="forbid")

    done: bool = Field(default=False, description="Whether the episode has terminated")
    reward: bool | int | float | None = Field(
        default=None, description="Reward signal from the last action"
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Additional metadata for the observation"
    )
    messages: list[dict[str, Any]] = Field(
        description="Chat messages: the opening ones after a reset, those the step added after "
        "a step (tool results, feedback), possibly none"
    )
    info: dict[str, Any] = Field(
        default_factory=dict,
        description="The environment's info dict (reset: tools; step: infra_error, ...)",
    )
    terminated: bool = Field(default=False, description="Gymnasium's terminated")
    truncated: bool = Field(default=False, description="Gymnasium's truncated")


class AgentState(BaseModel):
    """A session's state as an OpenEnv ``State`` (extra fields allowed)."""

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = Field(
        default=None, description="Unique identifier for the current episode"
    )
    step_count: int = Field(
        default=0, ge=0, description="Number of steps taken in the current episode"
    )


class ResetData(BaseModel):
    """A reset's ``data`` (OpenEnv's ResetRequest): keys other than these join ``options``."""

    model_config = ConfigDict(extra="allow")

    seed: int | None = Field(default=None, ge=0, description="Random seed of the episode")
    episode_id: str | None = Field(
        default=None, max_length=255, description="Custom episode identifier"
    )
    options: dict[str, Any] | None = Field(
        default=None, description="AgentEnv.reset's options (for example {'index': 3})"
    )

    def env_options(self) -> dict[str, Any] | None:
        """``options`` with the extra keys added; None when there are none."""
        merged = dict(self.options or {})
        merged.update(self.model_extra or {})
        return merged or None


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _WithData(_Envelope):
    data: dict[str, Any]


class _WithOptionalData(_Envelope):
    data: dict[str, Any] = Field(default_factory=dict)


# OpenEnv's WSResetMessage, WSStepMessage, WSStateMessage, WSCloseMessage and WSMCPMessage,
# less their ``type`` field (the key of this table).
ENVELOPES: dict[str, type[_Envelope]] = {
    "reset": _WithOptionalData,
    "step": _WithData,
    "state": _Envelope,
    "close": _Envelope,
    "mcp": _WithData,
}


def envelope(message: dict[str, Any]) -> dict[str, Any] | None:
    """A WebSocket message's ``data`` ({} for ``state`` and ``close``), checked as OpenEnv
    checks it (ValidationError for a missing or extra field); None for an unknown ``type``."""
    kind = message.get("type", "")
    model = ENVELOPES.get(kind) if isinstance(kind, str) else None
    if model is None:
        return None
    fields = {key: value for key, value in message.items() if key != "type"}
    return dict(getattr(model.model_validate(fields), "data", {}))


def json_safe(value: Any) -> Any:
    """``value`` with every part JSON can hold kept as is; numpy scalars and arrays become
    numbers and lists, tuples lists, non-finite floats ``None``, and anything else its ``str``."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return json_safe(value.tolist())
    return str(value)


def observation_payload(
    messages: list[Message],
    info: dict[str, Any],
    *,
    reward: float | None = None,
    terminated: bool = False,
    truncated: bool = False,
) -> dict[str, Any]:
    """The wire form of a reset (``reward=None``) or a step, as OpenEnv's
    ``serialize_observation`` gives it: ``{"observation", "reward", "done"}``."""
    return {
        "observation": {
            "messages": json_safe(messages),
            "info": json_safe(info),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "metadata": {},
        },
        "reward": None if reward is None else json_safe(float(reward)),
        "done": bool(terminated or truncated),
    }


def validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's error list, as OpenEnv sends it, made JSON-safe."""
    errors: list[dict[str, Any]] = json.loads(exc.json(include_url=False))
    return errors


def schemas() -> dict[str, Any]:
    """The body of ``GET /schema``: the JSON schemas of the action, observation and state."""
    return {
        "action": AgentAction.model_json_schema(),
        "observation": AgentObservation.model_json_schema(),
        "state": AgentState.model_json_schema(),
    }


def ws_error(message: str, code: str, **extra: Any) -> dict[str, Any]:
    """OpenEnv's WSErrorResponse: ``{"type": "error", "data": {"message", "code", ...}}``."""
    return {"type": "error", "data": {"message": message, "code": code, **extra}}
