"""Deprecated: the trainer is split by concern; this package re-exports it for one release.

Where each part went: the RL math to :mod:`agentrl.algorithms`, the training base shared with SFT
(actor, packing, checkpoints, metrics, ...) to :mod:`agentrl.training`, the RL run (loop, config,
batch, objective, critic, engines, weight sync, ``agentrl train``) to :mod:`agentrl.rl`, and the
rollout stream to :mod:`agentrl.rollout.stream`. Importing this package warns once; the old module
paths (``agentrl.trainer.loop``, ...) stay importable as aliases of the moved modules (:data:`MOVED`).
"""

import importlib
import sys
import warnings

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
from agentrl.rl.config import TrainConfig
from agentrl.rl.loop import RunSummary, Trainer
from agentrl.rl.weight_sync import (
    SyncReport,
    WeightSyncError,
    iter_full_state_dict_buckets,
    sync_weights,
)
from agentrl.training.actor import Actor, ActorConfig, LossFn
from agentrl.training.checkpoint import CheckpointManager, export_hf
from agentrl.training.distributed import DistInfo, destroy, distributed, init_distributed
from agentrl.training.logprobs import logprob_mismatch, token_logprobs
from agentrl.training.metrics import MetricsLogger, read_metrics
from agentrl.training.micro_batches import balance_across_ranks, plan_micro_batches, plan_tokens
from agentrl.training.optim import lr_factor
from agentrl.training.packing import (
    FILLER,
    PACKED_ATTENTION,
    PackedMicroBatch,
    build_micro_batches,
    pack,
    pack_for_rank,
    packed_logprobs,
    sequence_lengths,
)
from agentrl.training.plots import plot_curves

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


MOVED = {
    "actor": "agentrl.training.actor",
    "advantages": "agentrl.algorithms.advantages",
    "batching": "agentrl.training.micro_batches",
    "checkpoint": "agentrl.training.checkpoint",
    "cli": "agentrl.rl.cli",
    "critic": "agentrl.rl.critic",
    "distributed": "agentrl.training.distributed",
    "engines": "agentrl.rl.engines",
    "fp8_training": "agentrl.training.fp8_training",
    "gae": "agentrl.algorithms.gae",
    "logprobs": "agentrl.training.logprobs",
    "loop": "agentrl.rl.loop",
    "losses": "agentrl.algorithms.losses",
    "metrics": "agentrl.training.metrics",
    "objective": "agentrl.rl.objective",
    "off_policy": "agentrl.algorithms.off_policy",
    "optim": "agentrl.training.optim",
    "packing": "agentrl.training.packing",
    "plots": "agentrl.training.plots",
    "progress": "agentrl.training.progress",
    "rl_batch": "agentrl.rl.batch",
    "rollout_stream": "agentrl.rollout.stream",
    "train_config": "agentrl.rl.config",
    "weight_sync": "agentrl.rl.weight_sync",
}
"""Old module name under ``agentrl.trainer`` -> the module it moved to."""

for _old, _new in MOVED.items():
    # In sys.modules, not as attributes: ``agentrl.trainer.gae`` stays the function re-exported
    # above, and ``import agentrl.trainer.gae`` still finds the module.
    sys.modules[f"{__name__}.{_old}"] = importlib.import_module(_new)

warnings.warn(
    "agentrl.trainer is deprecated and goes in the next release: import from agentrl.algorithms, "
    "agentrl.training, agentrl.rl or agentrl.rollout.stream (see agentrl.trainer.MOVED)",
    DeprecationWarning,
    stacklevel=2,
)
