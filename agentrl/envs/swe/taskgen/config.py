"""The task generator's options (``python -m agentrl.envs.swe.taskgen --help`` lists them)."""

from __future__ import annotations

import sys

from pydantic import Field, field_validator, model_validator

from agentrl.config import Config
from agentrl.envs.swe.taskgen.mutators import MUTATORS


class TaskgenConfig(Config):
    """Options of the task generator (``python -m agentrl.envs.swe.taskgen``)."""

    seed: int = 0
    """Orders the candidates and draws the PASS_TO_PASS sample."""
    max_instances: int = Field(12, ge=1)
    """Instances kept per project at most."""
    min_fail: int = Field(1, ge=1)
    """Fewest tests that must fail with a bug for it to be kept."""
    max_fail: int = Field(10, ge=1)
    """Most tests that may fail with a bug for it to be kept."""
    max_hidden_bytes: int = Field(65536, ge=1)
    """A bug is not kept when the test files it hides (``test_patch``) exceed this size in all."""
    p2p_max: int = Field(50, ge=-1)
    """PASS_TO_PASS holds at most this many tests, half from the hidden test files (-1: all)."""
    time_budget: float = Field(300.0, gt=0)
    """Seconds per project after which no new candidate is tried."""
    jobs: int = Field(2, ge=1)
    """Candidates tried at once (each in its own copy of the tree)."""
    test_timeout: float | None = Field(None, gt=0)
    """Seconds one run of the suite may take; None: 10x the clean run, at least 10."""
    python: str = sys.executable
    """The interpreter that runs the suites (it needs pytest, and should have only what the
    task's environment has, so that the same tests pass there)."""
    kinds: list[str] | None = None
    """Mutation kinds to use (default: all)."""
    source: list[str] | None = None
    """fnmatch patterns of the modules bugs may go in (default: every non-test module)."""

    @model_validator(mode="after")
    def _fail_range(self) -> TaskgenConfig:
        if self.min_fail > self.max_fail:
            raise ValueError(f"min_fail ({self.min_fail}) exceeds max_fail ({self.max_fail})")
        return self

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, kinds: list[str] | None) -> list[str] | None:
        unknown = sorted(set(kinds or ()) - set(MUTATORS))
        if unknown:
            raise ValueError(f"unknown kinds {unknown}; known: {', '.join(MUTATORS)}")
        return kinds
