"""Tool-use demonstrations from the environments themselves, verified by stepping them.

A demonstration is a conversation row for :mod:`agentrl.sft.data`::

    {"messages": [...], "tools": [...], "env_id": "agentrl/Math-v0", "env_kwargs": "{...}",
     "index": 17, "problem_id": "gen-2-17", "reward": 1.0, "source": "constructed"}

Two sources:

* **Constructed** (:func:`constructed_demonstrations`): for environments whose tasks have a
  solution we can write down. Math-v0's generated problems (``agentrl.envs.math.generated``) are
  parsed back into the operations that made them, and the demonstration is: the environment's own
  reset messages (system prompt and question, exactly what the agent sees), an assistant turn
  calling the python tool in the environment's own tool format (its parser's ``format``: tags or
  Hermes JSON) with code that computes the answer, the tool message the environment returns after
  *really* running that code in its sandbox, and a final assistant turn giving the printed result
  in the environment's answer format. Code-v0's HumanEval problems (:mod:`agentrl.sft.code_demos`)
  are solved with their canonical solution: the function is written and run with the python
  tool on the docstring's examples, then submitted in a ```` ```python ```` block; for every
  third problem a planted one-line bug shows in the first run and is named and fixed before the
  submission. Every assistant turn is stepped in the real environment, and only demonstrations
  it rewards 1 (no infrastructure error) are kept.
* **Rejection sampling** (:func:`successful_trajectories`): episodes of ``agentrl rollout``
  (its JSONL) with reward at least a threshold, no error, ended by the environment.

Guaranteed: every kept constructed demonstration got reward 1 from the environment, turn by turn
as a rollout would have (the tool message is the environment's, not a copy). Not guaranteed: that
a problem can be demonstrated; problems that are not parsed (a Math-v0 dataset other than the
generated one) or whose docstring examples the reference solution does not reproduce (a few
HumanEval docstrings are wrong) are skipped and counted. The assistant turns are written from
templates: they show the tool format and the write-run-submit (and fix) loop, not reasoning.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import gymnasium

from agentrl.rollout.runner import bounded_as_completed
from agentrl.rollout.trajectory import Trajectory
from agentrl.sft.code_demos import code_demonstration
from agentrl.sft.demo_row import Env, Row, finish_demonstration
from agentrl.tools import ToolCall

_START = re.compile(r"(\w+) has (\d+) (\w+)\.")
_STEPS = (
    (re.compile(r"Then \w+ gets (\d+) more\."), "+="),
    (re.compile(r"Then \w+ gives away (\d+)\."), "-="),
    (re.compile(r"Then the number of \w+ is multiplied by (\d+)\."), "*="),
)
_QUESTION = re.compile(r"How many (\w+) does (\w+) have now\?")
_LEADS = (
    "Let me compute this with Python.",
    "I'll keep track of the count in Python.",
    "Let me work it out step by step in code.",
)


def math_solution_code(question: str) -> str | None:
    """Python that prints the answer of a generated Math-v0 problem, or None if ``question`` is
    not one (``"Ava has 3 coins. Then Ava gets 4 more. How many coins does Ava have now?"`` ->
    ``"coins = 3\\ncoins += 4\\nprint(coins)"``)."""
    sentences = re.findall(r"[^.?]+[.?]", question)
    sentences = [s.strip() for s in sentences]
    if len(sentences) < 3 or not (start := _START.fullmatch(sentences[0])):
        return None
    item = start.group(3)
    lines = [f"{item} = {start.group(2)}"]
    for sentence in sentences[1:-1]:
        for pattern, operator in _STEPS:
            if match := pattern.fullmatch(sentence):
                lines.append(f"{item} {operator} {match.group(1)}")
                break
        else:
            return None
    if not _QUESTION.fullmatch(sentences[-1]):
        return None
    return "\n".join([*lines, f"print({item})"])


async def math_demonstration(env: Env, index: int) -> Row | None:
    """A verified demonstration of Math-v0 problem ``index`` (None: not demonstrable or not
    rewarded 1). ``env`` is a ``mode="multi"`` Math-v0 environment (it is reset here)."""
    math_env: Any = env.unwrapped  # a MathEnv
    messages, info = await env.areset(seed=index, options={"index": index})
    code = math_solution_code(messages[-1]["content"])
    parser = getattr(math_env, "parser", None)
    if code is None or parser is None:
        return None
    call = parser.format(ToolCall("python", {"code": code}, raw=""))
    conversation = [*messages]
    first = f"{_LEADS[index % len(_LEADS)]}\n{call}"
    observation, _, terminated, truncated, _ = await env.astep(first)
    if terminated or truncated or len(observation) != 1 or observation[0]["role"] != "tool":
        return None
    result = observation[0]["content"].strip()
    if not re.fullmatch(r"-?\d+", result):
        return None
    answer_format = math_env.config.answer_format
    final = (
        f"<answer>{result}</answer>" if answer_format == "answer_tag" else f"\\boxed{{{result}}}"
    )
    last = f"The code prints {result}, so the answer is {final}."
    conversation += [{"role": "assistant", "content": first}, *observation]
    problem_id = str(info.get("problem_id", ""))
    return await finish_demonstration(
        env, conversation, last, info=info, index=index, problem_id=problem_id
    )


DEMONSTRATORS: dict[str, Callable[[Env, int], Awaitable[Row | None]]] = {
    "agentrl/Math-v0": math_demonstration,
    "agentrl/Code-v0": code_demonstration,
}
"""Environment id -> an async function that builds and verifies the demonstration of one task."""


async def constructed_demonstrations(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    indices: Iterable[int],
    *,
    concurrency: int = 8,
) -> AsyncIterator[Row | None]:
    """Yield a verified demonstration (or None: skipped) per task index, as they complete, at
    most ``concurrency`` episodes at a time (one environment each)."""
    if env_id not in DEMONSTRATORS:
        raise ValueError(
            f"no demonstrations can be constructed for {env_id!r}; supported: "
            f"{sorted(DEMONSTRATORS)} (use rejection sampling of rollouts for others)"
        )
    demonstrate = DEMONSTRATORS[env_id]

    async def one(index: int) -> Row | None:
        env = gymnasium.make(env_id, **env_kwargs)
        try:
            row = await demonstrate(env, index)  # type: ignore[arg-type]
        finally:
            await env.aclose()  # type: ignore[attr-defined]
        if row is not None:
            row.update(env_id=env_id, env_kwargs=json.dumps(dict(env_kwargs)))
            row["source"] = "constructed"
        return row

    async for row in bounded_as_completed(indices, one, concurrency):
        yield row


def successful_trajectories(
    records: Iterable[Mapping[str, Any]],
    min_reward: float,
    tools: list[dict[str, Any]] | None = None,
) -> list[Row]:
    """Rows of the trajectories (records of ``agentrl rollout``'s JSONL) with reward at least
    ``min_reward`` that the environment ended (no error, no infrastructure failure, not cut)."""
    rows = []
    for record in records:
        trajectory = Trajectory.from_record(dict(record))
        ok = trajectory.terminated and not (trajectory.error or trajectory.infra_error)
        if not ok or trajectory.reward < min_reward:
            continue
        if not trajectory.messages or trajectory.messages[-1].get("role") != "assistant":
            continue
        rows.append(
            {
                "messages": trajectory.messages,
                "tools": tools or [],
                "env_id": trajectory.env_id,
                "seed": trajectory.seed,
                "reward": trajectory.reward,
                "source": "rejection_sampling",
            }
        )
    return rows
