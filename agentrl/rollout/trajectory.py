"""The trajectory record: what one episode produced, token-exact, plus what happened on each turn.

A :class:`Trajectory` holds the :class:`~agentrl.tokenization.TokenTrajectory` the trainer scores (ids,
loss mask, engine log-probs, per-token weight versions), the conversation as messages, rewards, per-turn
timings and finish reasons, the error that ended the episode early, if any, and the environment's
infrastructure failure, if it could not judge the episode. ``to_record`` gives a
flat JSON-able dict (one JSONL line or one Parquet row); ``from_record`` inverts it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from agentrl.envs.spaces import Message
from agentrl.tokenization import TokenTrajectory


@dataclass
class Turn:
    """One assistant turn: the engine call and the environment step that followed it."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    weight_version: int
    generate_s: float
    env_step_s: float = 0.0
    reward: float = 0.0
    pieces: int = 1
    """Engine calls this turn took: more than 1 when an aborted generation was continued."""


@dataclass
class Trajectory:
    """One episode. ``group`` identifies the prompt (GRPO groups share it); ``sample`` the draw."""

    env_id: str
    group: int
    sample: int
    seed: int
    tokens: TokenTrajectory
    messages: list[Message]
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    stop_reason: str = ""
    error: str | None = None
    infra_error: str | None = None
    """The environment could not judge the episode (``info["infra_error"]``): its reward means
    nothing, and the trainer leaves it out like an errored episode."""
    tags: dict[str, str] = field(default_factory=dict)
    """What the task is, as the environment's reset info tags it (``info["tags"]``: e.g.
    SWE-bench Verified's ``difficulty``); ``agentrl eval`` reports per tag."""
    earlier: list[TokenTrajectory] = field(default_factory=list)
    """Token-exact trajectories of the same episode that ended before :attr:`tokens` began: the
    segments an agent's rewritten history split off (:mod:`agentrl.rollout.agent`). The trainer
    scores each as a sequence of its own, with the episode's advantage."""
    submission: dict[str, Any] | None = None
    """The episode's answer in its benchmark's own format, as the environment's last step info
    gave it (``info["submission"]``): a HumanEval sample for Code-v0, a SWE-bench prediction for
    SWE-v0; None when the environment gives none."""

    @property
    def judged(self) -> bool:
        """The environment judged the episode: no error and no infrastructure fault, so its
        reward is a verdict. Mean rewards are taken over judged episodes only."""
        return self.error is None and self.infra_error is None

    @property
    def completion_tokens(self) -> int:
        return sum(turn.completion_tokens for turn in self.turns)

    @property
    def tool_calls(self) -> int:
        """Tool calls the environment answered: its ``tool`` messages (one per call)."""
        return sum(message.get("role") == "tool" for message in self.messages)

    def to_record(self) -> dict[str, Any]:
        nested = ("tokens", "messages", "turns", "earlier")
        record = {k: v for k, v in asdict(self).items() if k not in nested}
        record["earlier"] = json.dumps([segment.to_dict() for segment in self.earlier])
        record["submission"] = None if self.submission is None else json.dumps(self.submission)
        record["tags"] = json.dumps(self.tags)
        record.update(self.tokens.to_dict())
        record["messages"] = json.dumps(self.messages, ensure_ascii=False)
        record["turns"] = json.dumps([asdict(turn) for turn in self.turns])
        record["reward_components"] = json.dumps(self.reward_components)
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Trajectory:
        token_fields = set(TokenTrajectory.__dataclass_fields__)
        tokens = TokenTrajectory.from_dict({k: record[k] for k in token_fields if k in record})
        plain = {
            k: v
            for k, v in record.items()
            if k in cls.__dataclass_fields__
            and k not in ("messages", "turns", "reward_components", "submission", "tags", "earlier")
        }
        submission = record.get("submission")
        return cls(
            **plain,
            tokens=tokens,
            messages=json.loads(record["messages"]),
            turns=[Turn(**turn) for turn in json.loads(record["turns"])],
            reward_components=json.loads(record["reward_components"]),
            submission=json.loads(submission) if submission else None,
            tags=json.loads(record.get("tags") or "{}"),
            earlier=[
                TokenTrajectory.from_dict(s) for s in json.loads(record.get("earlier") or "[]")
            ],
        )
