"""Several environments in one run: each GRPO group is drawn from one of them, by weight.

:class:`EnvMixture` holds one :class:`~agentrl.rollout.runner.EpisodeRunner` per environment and
runs each task with the runner its group was drawn for. The draw depends only on the mixture's seed
and the group's number (``numpy``'s ``SeedSequence``), so every episode of a group meets the same
environment, a resumed run draws the same environments for the same groups, and the order in which
groups are launched does not matter.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentrl.rollout.runner import EpisodeRunner, RolloutTask
from agentrl.rollout.trajectory import Trajectory


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
