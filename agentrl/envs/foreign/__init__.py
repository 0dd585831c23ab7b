"""Other ecosystems' environments as agentrl environments, and agentrl's in other trainers.

- :mod:`~agentrl.envs.foreign.openenv`: ``agentrl/OpenEnv-v0``, an environment on OpenEnv's own
  server (its Action and Observation types) as an :class:`~agentrl.envs.AgentEnv`;
- :mod:`~agentrl.envs.foreign.skyrl`: ``agentrl/SkyRL-v0``, a ``skyrl-gym`` ``BaseTextEnv`` as
  an :class:`~agentrl.envs.AgentEnv`;
- :mod:`~agentrl.envs.foreign.skyrl_export`: an agentrl environment as a ``skyrl-gym``
  ``BaseTextEnv``, for SkyRL's trainer;
- :mod:`~agentrl.envs.foreign.trl_export`: an agentrl environment for TRL's ``GRPOTrainer``
  (``environment_factory``).

The foreign packages (``skyrl-gym``) are imported only by the module that needs them, when it is
used; none is a dependency of agentrl. docs/env_serving.md documents every mapping.
"""
