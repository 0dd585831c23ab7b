"""Environments: the AgentEnv API, its spaces and wrappers, and registration with Gymnasium."""

from agentrl.envs.core import INFRA_ERROR, AgentEnv, ResetResult, StepResult
from agentrl.envs.registration import (
    BUILTIN_ENVS,
    ENTRY_POINT_GROUP,
    EnvFactory,
    make_env,
    register_builtin_envs,
    register_env,
    register_plugin_envs,
)
from agentrl.envs.spaces import AssistantText, ChatMessages, Message
from agentrl.envs.wrappers import (
    AgentWrapper,
    EpisodeGuard,
    ObservationLengthLimit,
    RewardShaping,
    TurnLimit,
)

__all__ = [
    "BUILTIN_ENVS",
    "ENTRY_POINT_GROUP",
    "INFRA_ERROR",
    "AgentEnv",
    "AgentWrapper",
    "AssistantText",
    "ChatMessages",
    "EnvFactory",
    "EpisodeGuard",
    "Message",
    "ObservationLengthLimit",
    "ResetResult",
    "RewardShaping",
    "StepResult",
    "TurnLimit",
    "make_env",
    "register_builtin_envs",
    "register_env",
    "register_plugin_envs",
]
