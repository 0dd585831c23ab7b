"""SWE task generation in the spirit of SWE-smith: bugs injected by AST rewrites into the source of
a Python project's sdist, kept when some of its tests fail, written as verified SWE-bench instances.
The pipeline is described in :mod:`agentrl.envs.swe.taskgen.pipeline`; the command line is
``python -m agentrl.envs.swe.taskgen`` (``docs/swe_tasks.md``)."""

from agentrl.envs.swe.taskgen.candidates import Candidate, find_candidates, mutate
from agentrl.envs.swe.taskgen.config import TaskgenConfig
from agentrl.envs.swe.taskgen.mutators import MUTATORS
from agentrl.envs.swe.taskgen.pipeline import Tally, generate, generate_project

__all__ = [
    "MUTATORS",
    "Candidate",
    "Tally",
    "TaskgenConfig",
    "find_candidates",
    "generate",
    "generate_project",
    "mutate",
]
