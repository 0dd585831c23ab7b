"""Several environments in one run: each GRPO group is drawn from one of them, by weight.

:class:`EnvMixture` holds one :class:`~agentrl.rollout.runner.EpisodeRunner` per environment and
runs each task with the runner its group was drawn for. The draw depends only on the mixture's seed
and the group's number (``numpy``'s ``SeedSequence``), so every episode of a group meets the same
environment, a resumed run draws the same environments for the same groups, and the order in which
groups are launched does not matter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import numpy as np
from pydantic import Field, model_validator

from agentrl.config import Config
from agentrl.rollout.runner import EpisodeRunner, RolloutTask
from agentrl.rollout.trajectory import Trajectory


class EnvSpec(Config):
    """One environment of a mixture (``env.mix``)."""

    id: str
    """A registered environment id."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of ``gymnasium.make``."""
    weight: float = Field(1.0, gt=0)
    """Relative probability that a group is drawn from this environment."""
    name: str | None = None
    """Its name in metrics (``env/NAME/...``); default: the id without its namespace."""

    @property
    def label(self) -> str:
        return self.name or self.id.rsplit("/", 1)[-1]


class EnvConfig(Config):
    """The environment episodes run in, or a weighted mixture of environments (``mix``)."""

    id: str = "agentrl/Math-v0"
    """A registered environment id (``gymnasium.make`` finds it after ``import agentrl``)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of ``gymnasium.make`` (checked by the environment's own config)."""
    mix: list[EnvSpec] = Field(default_factory=list)
    """Several environments instead of ``id``/``kwargs``: a list of ``{id, kwargs, weight,
    name}``. Each group is drawn from one of them with probability proportional to its weight
    (reproducibly, from the seed and the group's number); metrics are also given per environment
    (``env/NAME/reward_mean``, ``turns_mean``, ``errors``, ``infra_errors``, ``episodes``)."""

    @model_validator(mode="after")
    def _one_way(self) -> Self:
        if self.mix and self.model_fields_set & {"id", "kwargs"}:
            raise ValueError("give either env.id / env.kwargs or env.mix, not both")
        names = [spec.label for spec in self.mix]
        if len(set(names)) != len(names):
            raise ValueError(f"env.mix names must differ (set `name`), got {names}")
        return self

    def specs(self) -> list[EnvSpec]:
        """The environments of the run (one unless ``mix``)."""
        return list(self.mix) or [EnvSpec(id=self.id, kwargs=self.kwargs)]


class EnvMixture:
    """Runs each task with the runner of the environment drawn for its group."""

    def __init__(self, runners: Sequence[EpisodeRunner], weights: Sequence[float], seed: int = 0):
        if not runners or len(runners) != len(weights):
            raise ValueError(f"need one weight per runner, got {len(runners)} and {len(weights)}")
        if any(w <= 0 for w in weights):
            raise ValueError(f"weights must be > 0, got {list(weights)}")
        self.runners = list(runners)
        total = float(sum(weights))
        self.probabilities = np.array([w / total for w in weights])
        self.seed = seed

    def index(self, group: int) -> int:
        """Which runner group ``group`` uses."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, group, 0x6D6978]))
        return int(rng.choice(len(self.runners), p=self.probabilities))

    async def run(self, task: RolloutTask) -> Trajectory:
        return await self.runners[self.index(task.group)].run(task)
