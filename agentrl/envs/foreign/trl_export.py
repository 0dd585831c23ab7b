"""An agentrl environment for TRL's ``GRPOTrainer(environment_factory=...)``.

::

    from agentrl.envs.foreign.trl_export import trl_environment, trl_reward
    Math = trl_environment("agentrl/Math-v0", mode="multi", tool_format="hermes", max_turns=4)
    GRPOTrainer(model, reward_funcs=trl_reward, environment_factory=Math, train_dataset=rows, ...)

TRL (1.16) makes one instance per rollout through the factory (pooling them across batches),
calls ``reset(**row)`` with the dataset row and appends the string it returns to the row's last
user message, exposes the instance's public methods as tools (their type hints and Google-style
docstrings become the tool schemas), parses the model's tool calls with the tokenizer's response
template and calls those methods, and ends the rollout at the first completion without a tool
call. The mapping:

============================  =============================================================
TRL                           agentrl
============================  =============================================================
``reset(**row)``              ``reset(seed=row["seed"], options={"index": row["index"]})``
                              (either column may be absent); returns the opening messages'
                              contents joined by blank lines (system prompt, then the task)
a tool method, one per tool   ``step(text)`` with ``text`` the call as a Hermes
of the reset info's           ``<tool_call>{"name", "arguments"}</tool_call>`` block; returns
``"tools"`` (same name,       the step's messages' contents (the tool results), joined
arguments and description)
``trl_reward`` (a reward      ``step(final assistant text)`` unless the episode has ended;
function)                     returns the sum of the episode's step rewards
============================  =============================================================

So the environment must take Hermes tool calls (Math-v0: ``tool_format="hermes"``). Not
guaranteed: TRL renders and re-tokenizes the conversation itself, so what the environment
receives for a tool call is TRL's parse of the model's text written back as one Hermes block,
not the model's own text (agentrl's trainer is the token-exact one). An episode with an
``infra_error`` (the environment could not judge it) gets the reward ``None``: TRL's "unscorable"
completion, left out of its group's baseline with an advantage of 0 (the message is kept in
:attr:`last_info`).
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from agentrl.envs.core import INFRA_ERROR
from agentrl.envs.registration import make_env

JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool}


class TRLEnvironment:
    """The base of :func:`trl_environment`'s classes: one agentrl environment, one episode per
    ``reset``. Its tool methods are added per environment id."""

    env_id: str = ""
    env_kwargs: dict[str, Any] = {}  # noqa: RUF012 (set per subclass, never mutated)

    def __init__(self) -> None:
        self._env = make_env(self.env_id, **self.env_kwargs)
        self._rewards: list[float] = []
        self._done = True
        self._infra_error: str | None = None
        self.last_info: dict[str, Any] = {}

    def reset(self, **row: Any) -> str:
        """Start an episode for the dataset ``row``; the opening messages' text."""
        seed = row.get("seed")
        options = None if row.get("index") is None else {"index": int(row["index"])}
        messages, self.last_info = self._env.reset(seed=seed, options=options)
        self._rewards, self._done, self._infra_error = [], False, None
        return "\n\n".join(str(message["content"]) for message in messages)

    def _step(self, text: str) -> str:
        if self._done:
            return "The episode has ended."
        messages, reward, terminated, truncated, self.last_info = self._env.step(text)
        self._rewards.append(float(reward))
        self._done = bool(terminated or truncated)
        if self.last_info.get(INFRA_ERROR) and self._infra_error is None:
            self._infra_error = str(self.last_info[INFRA_ERROR])
        return "\n".join(str(message["content"]) for message in messages)

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        call = json.dumps({"name": name, "arguments": arguments})
        return self._step(f"<tool_call>\n{call}\n</tool_call>")

    def _finish(self, text: str) -> float | None:
        """Take the rollout's final assistant text as the last turn; the episode's reward, or
        None when an infrastructure fault left it unjudged."""
        if not self._done:
            self._step(text)
        return None if self._infra_error is not None else sum(self._rewards)


def trl_environment(env_id: str, **env_kwargs: Any) -> type[TRLEnvironment]:
    """A class for ``environment_factory``: instances hold an ``env_id`` environment made with
    ``env_kwargs``, with a method per tool its reset info lists (see the module docstring).
    The tools are read from one reset of a probe environment, closed at once."""
    probe = make_env(env_id, **env_kwargs)
    try:
        _, info = probe.reset(seed=0)
    finally:
        probe.close()
    namespace: dict[str, Any] = {"env_id": env_id, "env_kwargs": dict(env_kwargs)}
    for schema in info.get("tools", []):
        method = _tool_method(schema.get("function", schema))
        namespace[method.__name__] = method
    name = env_id.split("/")[-1].replace("-", "_") + "_TRLEnvironment"
    return type(name, (TRLEnvironment,), namespace)


def trl_reward(
    completions: list[Any], environments: list[TRLEnvironment], **_: Any
) -> list[float | None]:
    """TRL's reward function for :func:`trl_environment`'s environments: each rollout's final
    assistant text is its environment's last turn; the episode's summed reward, None for an
    episode with an ``infra_error`` (TRL leaves it out)."""
    rewards: list[float | None] = []
    for completion, environment in zip(completions, environments, strict=True):
        if isinstance(completion, list):  # conversational: the last assistant message
            texts = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
            text = texts[-1] if texts else ""
        else:
            text = str(completion)
        rewards.append(environment._finish(str(text)))
    return rewards


def _tool_method(function: dict[str, Any]) -> Any:
    """A method with the tool's name, typed parameters and a Google-style docstring (what
    transformers' ``get_json_schema`` reads) that calls the tool through the environment."""
    name = function["name"]
    parameters = function.get("parameters", {})
    properties: dict[str, Any] = parameters.get("properties", {})
    required = set(parameters.get("required", []))

    def method(self: TRLEnvironment, **arguments: Any) -> str:
        return self._call_tool(name, arguments)

    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    lines = [function.get("description") or name, "", "Args:"]
    for argument, spec in properties.items():
        kind = JSON_TYPES.get(spec.get("type", "string"), str)
        default = inspect.Parameter.empty if argument in required else None
        signature.append(
            inspect.Parameter(
                argument, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind
            )
        )
        annotations[argument] = kind if argument in required else kind | None
        lines.append(f"    {argument}: {spec.get('description') or argument}")
    lines += ["", "Returns:", "    The tool's output."]
    method.__name__ = method.__qualname__ = name
    method.__doc__ = "\n".join(lines)
    method.__annotations__ = annotations
    method.__signature__ = inspect.Signature(signature, return_annotation=str)  # type: ignore[attr-defined]
    return method
