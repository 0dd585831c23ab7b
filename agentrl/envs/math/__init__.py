"""The Math environment: ``agentrl/Math-v0``."""

from agentrl.envs.math.dataset import MathProblem, last_boxed, read_dataset, to_problems
from agentrl.envs.math.env import MathConfig, MathEnv, extract_answer
from agentrl.envs.math.generated import generate_problems

__all__ = [
    "MathConfig",
    "MathEnv",
    "MathProblem",
    "extract_answer",
    "generate_problems",
    "last_boxed",
    "read_dataset",
    "to_problems",
]
