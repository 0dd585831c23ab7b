"""Rollouts: environments against an engine, concurrently, into token-exact trajectories."""

from agentrl.rollout.runner import EpisodeRunner, RolloutTask, group_tasks
from agentrl.rollout.trajectory import Trajectory, Turn

__all__ = ["EpisodeRunner", "RolloutTask", "Trajectory", "Turn", "group_tasks"]
