"""The trainer: advantages, losses and off-policy correction (pure functions), the FSDP2 actor,
weight sync into engines, the log-prob functions shared with the engines, and the training loop
(:class:`Trainer`, configured by :class:`TrainConfig`) with its checkpoints and metrics."""

from agentrl.algorithms.advantages import (
    broadcast_to_tokens,
    group_centered,
    grpo_advantages,
    reinforce_pp_advantages,
)
from agentrl.algorithms.gae import discounted_reverse_cumsum, gae, gae_reference
from agentrl.algorithms.losses import (
    Aggregation,
    KLEstimator,
    aggregate,
    entropy_from_logits,
    kl_penalty,
    loss_denominator,
    policy_loss,
)
from agentrl.algorithms.off_policy import (
    StalenessDecision,
    importance_weights,
    mismatch_metrics,
    staleness,
    staleness_policy,
)
from agentrl.trainer.actor import Actor, ActorConfig, LossFn
from agentrl.trainer.batching import balance_across_ranks, plan_micro_batches, plan_tokens
from agentrl.trainer.checkpoint import CheckpointManager, export_hf
from agentrl.trainer.distributed import DistInfo, destroy, distributed, init_distributed
from agentrl.trainer.logprobs import logprob_mismatch, token_logprobs
from agentrl.trainer.loop import RunSummary, Trainer
from agentrl.trainer.metrics import MetricsLogger, read_metrics
from agentrl.trainer.optim import lr_factor
from agentrl.trainer.packing import (
    FILLER,
    PACKED_ATTENTION,
    PackedMicroBatch,
    build_micro_batches,
    pack,
    pack_for_rank,
    packed_logprobs,
    sequence_lengths,
)
from agentrl.trainer.plots import plot_curves
from agentrl.trainer.train_config import TrainConfig
from agentrl.trainer.weight_sync import (
    SyncReport,
    WeightSyncError,
    iter_full_state_dict_buckets,
    sync_weights,
)

__all__ = [
    "FILLER",
    "PACKED_ATTENTION",
    "Actor",
    "ActorConfig",
    "Aggregation",
    "CheckpointManager",
    "DistInfo",
    "KLEstimator",
    "LossFn",
    "MetricsLogger",
    "PackedMicroBatch",
    "RunSummary",
    "StalenessDecision",
    "SyncReport",
    "TrainConfig",
    "Trainer",
    "WeightSyncError",
    "aggregate",
    "balance_across_ranks",
    "broadcast_to_tokens",
    "build_micro_batches",
    "destroy",
    "discounted_reverse_cumsum",
    "distributed",
    "entropy_from_logits",
    "export_hf",
    "gae",
    "gae_reference",
    "group_centered",
    "grpo_advantages",
    "importance_weights",
    "init_distributed",
    "iter_full_state_dict_buckets",
    "kl_penalty",
    "logprob_mismatch",
    "loss_denominator",
    "lr_factor",
    "mismatch_metrics",
    "pack",
    "pack_for_rank",
    "packed_logprobs",
    "plan_micro_batches",
    "plan_tokens",
    "plot_curves",
    "policy_loss",
    "read_metrics",
    "reinforce_pp_advantages",
    "sequence_lengths",
    "staleness",
    "staleness_policy",
    "sync_weights",
    "token_logprobs",
]
