"""The RL run: the training loop (:class:`Trainer`, configured by :class:`TrainConfig`), the
batch it builds from trajectories (rewards, advantages, staleness), the policy objective and the
critic, the rollout engines it starts and syncs weights into, and ``agentrl train``. It builds on
the training base (:mod:`agentrl.training`), the RL math (:mod:`agentrl.algorithms`) and the
rollouts (:mod:`agentrl.rollout`)."""

from agentrl.rl.batch import TrainingBatch, build_batch
from agentrl.rl.config import TrainConfig
from agentrl.rl.engines import SERVER_KINDS, EnginesConfig
from agentrl.rl.loop import RunSummary, Trainer, train_on_batch
from agentrl.rl.objective import AlgorithmConfig, Objective
from agentrl.rl.weight_sync import SyncReport, WeightSyncError, sync_weights

__all__ = [
    "SERVER_KINDS",
    "AlgorithmConfig",
    "EnginesConfig",
    "Objective",
    "RunSummary",
    "SyncReport",
    "TrainConfig",
    "Trainer",
    "TrainingBatch",
    "WeightSyncError",
    "build_batch",
    "sync_weights",
    "train_on_batch",
]
