"""Episodes of SWE-v0 on benchmark rows, driven through its own tools (Hermes tool calls)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentrl.envs import INFRA_ERROR


def hermes(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def apply_command(patch: str) -> str:
    """The bash command that applies ``patch`` in the agent's repository."""
    return f"git apply <<'AGENTRL_EOF'\n{patch}\nAGENTRL_EOF"


async def bash_episode(make_env: Callable[[], Any], *commands: str) -> tuple[list, float, dict]:
    """Reset, one bash call per command, submit: the outputs, the reward and the last info."""
    env = make_env()
    shown = []
    try:
        await env.areset(seed=0)
        for command in commands:
            observation, *_ = await env.astep(hermes("bash", command=command))
            shown.append(observation[0]["content"])
        _, reward, done, _, info = await env.astep(hermes("submit"))
    finally:
        await env.aclose()
    assert done and INFRA_ERROR not in info, info
    return shown, reward, info
