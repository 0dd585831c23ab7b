"""Rollouts: environments against an engine, concurrently, into token-exact trajectories."""

from agentrl.rollout.mixture import EnvMixture
from agentrl.rollout.runner import EpisodeRunner, RolloutTask, Runner, group_tasks
from agentrl.rollout.trajectory import Trajectory, Turn

__all__ = [
    "EnvMixture",
    "EpisodeRunner",
    "RolloutTask",
    "Runner",
    "Trajectory",
    "Turn",
    "group_tasks",
]
