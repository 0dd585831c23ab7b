"""agentrl: reinforcement learning for multi-turn, tool-using LLM agents.

Importing the package registers the built-in environments (``agentrl/...``) and those of installed
plugins (entry-point group ``agentrl.envs``) with Gymnasium.
"""

from agentrl.envs import (
    AgentEnv,
    AgentWrapper,
    register_builtin_envs,
    register_env,
    register_plugin_envs,
)

__version__ = "0.1.0"
__all__ = ["AgentEnv", "AgentWrapper", "__version__", "register_env"]

register_builtin_envs()
register_plugin_envs()
