"""Environments on other machines: OpenEnv's wire form of an AgentEnv (``protocol``, which
``agentrl env serve`` serves) and ``agentrl/Remote-v0`` (``env``), its client."""

from agentrl.envs.remote.env import RemoteConfig, RemoteEnv, RemoteEnvError

__all__ = ["RemoteConfig", "RemoteEnv", "RemoteEnvError"]
