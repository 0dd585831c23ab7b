"""The training base shared by RL (:mod:`agentrl.rl`) and SFT (:mod:`agentrl.sft`): the FSDP2
actor and its optimizer, distributed set-up, FP8 training, sequence packing and micro-batch
planning, token log-probs, the full state dict in buckets, checkpoints and Hugging Face export,
metrics, the progress display and the curves. Nothing here imports the RL run or SFT."""

from agentrl.training.actor import Actor, ActorConfig, LossFn
from agentrl.training.checkpoint import CheckpointManager, export_hf
from agentrl.training.distributed import DistInfo, destroy, distributed, init_distributed
from agentrl.training.full_state import engine_parameter_name, iter_full_state_dict_buckets
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
    "CheckpointManager",
    "DistInfo",
    "LossFn",
    "MetricsLogger",
    "PackedMicroBatch",
    "balance_across_ranks",
    "build_micro_batches",
    "destroy",
    "distributed",
    "engine_parameter_name",
    "export_hf",
    "init_distributed",
    "iter_full_state_dict_buckets",
    "logprob_mismatch",
    "lr_factor",
    "pack",
    "pack_for_rank",
    "packed_logprobs",
    "plan_micro_batches",
    "plan_tokens",
    "plot_curves",
    "read_metrics",
    "sequence_lengths",
    "token_logprobs",
]
