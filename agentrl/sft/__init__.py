"""Supervised fine-tuning on multi-turn conversations: the warm start before RL.

* :mod:`agentrl.sft.data` loads conversation rows (JSONL / Parquet via ``datasets``) and tokenizes
  them through the rollout's :class:`~agentrl.tokenization.TrajectoryBuilder`, so the ids and loss
  masks are those a rollout of the same conversation holds.
* :mod:`agentrl.sft.trainer` trains them on the RL trainer's FSDP2 actor, packed like RL batches,
  with its checkpoints, metrics and Hugging Face export (``agentrl sft``).
* :mod:`agentrl.sft.demos` writes verified tool-use demonstrations from the environments' own
  tasks, or keeps the successful episodes of rollouts (``agentrl demos``).
"""

from agentrl.sft.config import DataConfig, SFTActorConfig, SFTConfig, SFTTrainerConfig
from agentrl.sft.data import (
    ConversationError,
    TokenizedConversations,
    conversation_of,
    load_conversations,
    tokenize_conversation,
    tokenize_dataset,
)

__all__ = [
    "ConversationError",
    "DataConfig",
    "SFTActorConfig",
    "SFTConfig",
    "SFTTrainerConfig",
    "TokenizedConversations",
    "conversation_of",
    "load_conversations",
    "tokenize_conversation",
    "tokenize_dataset",
]
