"""What a constructed demonstration becomes: one conversation row, once the environment accepts it.

Shared by the Math-v0 and Code-v0 demonstrators (`agentrl.sft.demos`, `agentrl.sft.code_demos`):
each builds a conversation by stepping a real environment, then sends its closing assistant turn
through :func:`finish_demonstration`, which keeps the conversation only if the environment ends the
episode on it with reward 1 and no infrastructure error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.envs import INFRA_ERROR, AgentEnv, AgentWrapper

Row = dict[str, Any]
"""A demonstration: ``messages``, ``tools``, ``index``, ``problem_id``, ``reward`` (and, once
yielded by `agentrl.sft.demos`, where it came from)."""
Env = AgentEnv | AgentWrapper


async def finish_demonstration(
    env: Env,
    conversation: list[dict[str, Any]],
    last: str,
    *,
    info: Mapping[str, Any],
    index: int,
    problem_id: str,
) -> Row | None:
    """Step ``env`` with the closing turn ``last``; the row of ``conversation`` + ``last`` if that
    ends the episode with reward 1 and no infrastructure error, else None. ``info`` is the reset's
    (its ``tools`` are the row's)."""
    _, reward, terminated, _, step_info = await env.astep(last)
    if not terminated or reward != 1.0 or step_info.get(INFRA_ERROR):
        return None
    return {
        "messages": [*conversation, {"role": "assistant", "content": last}],
        "tools": info.get("tools") or [],
        "index": index,
        "problem_id": problem_id,
        "reward": float(reward),
    }
