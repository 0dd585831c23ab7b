"""The Code environment: ``agentrl/Code-v0`` (HumanEval, graded by its tests in a sandbox)."""

from agentrl.envs.code.env import CodeConfig, CodeEnv
from agentrl.envs.code.examples import PublicTest, public_tests
from agentrl.envs.code.grading import GradeResult, grade
from agentrl.envs.code.problems import (
    CodeProblem,
    assemble_program,
    extract_code,
    load_problems,
)

__all__ = [
    "CodeConfig",
    "CodeEnv",
    "CodeProblem",
    "GradeResult",
    "PublicTest",
    "assemble_program",
    "extract_code",
    "grade",
    "load_problems",
    "public_tests",
]
