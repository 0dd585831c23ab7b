"""The trainer: advantages, losses and off-policy correction (pure functions), the FSDP2 actor,
weight sync into engines, and the log-prob functions shared with the engines."""

from agentrl.trainer.actor import Actor, ActorConfig, LossFn
from agentrl.trainer.advantages import (
    broadcast_to_tokens,
    group_centered,
    grpo_advantages,
    reinforce_pp_advantages,
)
from agentrl.trainer.distributed import DistInfo, destroy, distributed, init_distributed
from agentrl.trainer.gae import discounted_reverse_cumsum, gae, gae_reference
from agentrl.trainer.logprobs import logprob_mismatch, token_logprobs
from agentrl.trainer.losses import (
    Aggregation,
    KLEstimator,
    aggregate,
    entropy_from_logits,
    kl_penalty,
    loss_denominator,
    policy_loss,
)
from agentrl.trainer.off_policy import (
    StalenessDecision,
    importance_weights,
    mismatch_metrics,
    staleness,
    staleness_policy,
)
from agentrl.trainer.optim import lr_factor
from agentrl.trainer.weight_sync import (
    SyncReport,
    WeightSyncError,
    iter_full_state_dict_buckets,
    sync_weights,
)

__all__ = [
    "Actor",
    "ActorConfig",
    "Aggregation",
    "DistInfo",
    "KLEstimator",
    "LossFn",
    "StalenessDecision",
    "SyncReport",
    "WeightSyncError",
    "aggregate",
    "broadcast_to_tokens",
    "destroy",
    "discounted_reverse_cumsum",
    "distributed",
    "entropy_from_logits",
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
    "policy_loss",
    "reinforce_pp_advantages",
    "staleness",
    "staleness_policy",
    "sync_weights",
    "token_logprobs",
]
