"""SWE-bench-style tasks: instances (:mod:`agentrl.envs.swe.instances`), their repository trees
(:mod:`agentrl.envs.swe.repo`) and the task generator (:mod:`agentrl.envs.swe.taskgen`)."""

from agentrl.envs.swe.instances import InstanceError, SWEInstance, load_instances

__all__ = ["InstanceError", "SWEInstance", "load_instances"]
