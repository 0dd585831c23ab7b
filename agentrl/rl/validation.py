"""Validation during training: ``agentrl eval``'s evaluation of held-out tasks, on the run's engines.

Every ``eval.every`` steps (and once before the first step with ``eval.before_training``), rank 0
evaluates the current weights: the training environments (or ``eval.env``) with ``split`` set to
``eval.split``, the first ``eval.max_tasks`` tasks, ``eval.k`` samples each, through
:func:`agentrl.evaluation.evaluate` on the same engines the rollouts use, right after the weight
sync, so every validation episode is sampled by the step's weights. The rollout stream keeps
running meanwhile (it shares the engines, which batch both). The numbers join that step's line
of ``metrics.jsonl`` as ``val/<env>/pass@k``, ``val/<env>/reward_mean``, ``val/<env>/judged``,
``val/<env>/infra_errors`` (and ``time/val_s``), so a resumed run keeps the history up to its
checkpoint and TensorBoard and the curves show them; each validation's episodes are kept under
``<output_dir>/validation/step_<n>/``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import Field

from agentrl.config import Config
from agentrl.engine_pool.engine import Engine
from agentrl.evaluation import EvalConfig, evaluate, summarize
from agentrl.evaluation.config import EvalSamplingConfig, EvalSettings
from agentrl.models import ModelConfig
from agentrl.rollout.mixture import EnvConfig, EnvSpec
from agentrl.rollout.runner import RolloutConfig


class ValidationConfig(Config):
    """Held-out evaluation during training (the ``eval`` section)."""

    every: int = Field(0, ge=0)
    """Validate every this many steps (0: never)."""
    before_training: bool = False
    """Also validate the initial weights, logged at step 0 (not on a resumed run)."""
    env: EnvConfig | None = None
    """The environments to validate on (default: the training ones)."""
    split: str | None = "test"
    """Passed to every environment as ``split`` (the built-in ones hold out "test" tasks);
    null leaves their keyword arguments as they are."""
    k: int = Field(1, ge=1)
    """Samples per task (pass@1 and pass@k are logged)."""
    max_tasks: int | None = Field(32, ge=1)
    """The first this many tasks of each environment (null: all)."""
    temperature: float | None = Field(None, ge=0)
    """Sampling temperature (default: the rollouts')."""
    concurrency: int = Field(32, ge=1)
    """Validation episodes in flight at once."""

    @property
    def enabled(self) -> bool:
        return self.every > 0 or self.before_training

    def due(self, step: int) -> bool:
        """Whether the weights after ``step`` optimizer steps are validated."""
        return (step == 0 and self.before_training) or (
            step > 0 and self.every > 0 and step % self.every == 0
        )


def validation_config(
    config: ValidationConfig,
    env: EnvConfig,
    model: ModelConfig,
    rollout: RolloutConfig,
    output_dir: Path,
    seed: int,
) -> EvalConfig:
    """The evaluation one validation runs (written under ``output_dir``)."""
    specs = (config.env or env).specs()
    if config.split is not None:
        specs = [
            EnvSpec(id=s.id, kwargs={**s.kwargs, "split": config.split}, name=s.label)
            for s in specs
        ]
    return EvalConfig(
        env=EnvConfig(mix=specs)
        if len(specs) > 1
        else EnvConfig(id=specs[0].id, kwargs=specs[0].kwargs),
        model=model,
        sampling=EvalSamplingConfig(
            temperature=rollout.temperature if config.temperature is None else config.temperature,
            top_p=rollout.top_p,
            max_new_tokens=rollout.max_new_tokens,
            max_total_tokens=rollout.max_total_tokens,
            stop=rollout.stop,
        ),
        eval=EvalSettings(
            k=config.k,
            max_tasks=config.max_tasks,
            seed=seed,
            concurrency=config.concurrency,
            output_dir=str(output_dir),
        ),
    )


async def validate(config: EvalConfig, engine: Engine, tokenizer: Any) -> dict[str, float]:
    """Run the evaluation and return its numbers as ``val/*`` metrics."""
    start = time.perf_counter()
    rows = await evaluate(config, engine, tokenizer)
    metrics: dict[str, float] = {}
    for label, numbers in summarize(rows, config.eval.pass_ks).items():
        for key in [f"pass@{k}" for k in config.eval.pass_ks] + [
            "reward_mean",
            "judged",
            "infra_errors",
        ]:
            metrics[f"val/{label}/{key}"] = float(numbers[key])
    metrics["time/val_s"] = time.perf_counter() - start
    return metrics
