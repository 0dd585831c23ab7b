"""``agentrl eval``'s configuration: the environments, the model and engines, how to sample, and
what to measure. Read from YAML with dotted overrides, like ``agentrl train``'s."""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import Field, field_validator, model_validator

from agentrl.config import Config, RunConfig, reference_markdown
from agentrl.models import ModelConfig
from agentrl.rollout.mixture import EnvConfig


class EvalModelConfig(ModelConfig):
    """The policy evaluated: a model as in training, or a run's checkpoint
    (:mod:`agentrl.evaluation.policy`)."""

    path: str = "smollm2"
    """``"smollm2"``, a Hugging Face model directory (e.g. a run's ``hf/``) or a .gguf; or a run's
    checkpoint: a step directory (``<output_dir>/checkpoints/step_00000040``), a checkpoint
    directory (its newest complete step) or a run's ``output_dir`` (its newest complete
    checkpoint, else its ``hf/``). A checkpoint's policy weights are loaded into ``base``; its
    critic and optimizer state are not read. With ``engines.urls`` only a model (the servers'
    tokenizer), not a checkpoint."""
    base: str | None = None
    """For a checkpoint: the model the run trained (its ``model.path``), which the weights are
    loaded into and whose tokenizer is used; None: the ``model.path`` of the run's
    ``config.yaml`` (``<output_dir>/config.yaml``)."""


class EvalEnginesConfig(Config):
    """The engines episodes are generated with: the embedded one, or servers by URL."""

    urls: list[str] = Field(default_factory=list)
    """SGLang-API servers (``agentrl serve`` or SGLang) to spread requests over, through an
    ``EnginePool``; empty: one embedded engine in this process, loading ``model.path``."""
    max_batch_size: int = Field(32, ge=1)
    """The embedded engine's batch size."""
    dtype: str = "float32"
    """The embedded engine's weights and compute dtype."""


class EvalSamplingConfig(Config):
    """How each assistant turn is sampled."""

    temperature: float = Field(1.0, ge=0)
    """Softmax temperature (0: greedy, which makes every sample of a task the same)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold (1 disables it)."""
    top_k: int = Field(0, ge=0)
    """Keep only the top-k tokens (0 disables it)."""
    max_new_tokens: int = Field(256, ge=1)
    """Tokens per assistant turn."""
    max_total_tokens: int = Field(2048, ge=2)
    """Tokens per episode (prompt, every turn and every tool result)."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings for every turn, besides those the environment asks for."""


class EvalSettings(Config):
    """What is measured and where it is written."""

    k: int = Field(1, ge=1)
    """Samples per task; pass@k is reported for every k in ``ks``."""
    ks: list[int] = Field(default_factory=list)
    """The k of each reported pass@k, each in 1..k (empty: 1 and k)."""
    max_tasks: int | None = Field(None, ge=1)
    """Evaluate only the first ``max_tasks`` tasks of each environment (None: all of them)."""
    pass_threshold: float = 1.0
    """An episode passes when the environment judged it and its reward is at least this."""
    seed: int = Field(0, ge=0)
    """Base of the sampling seeds: sample ``s`` of task ``i`` at turn ``t`` is seeded from
    ``(seed, i, s, t)``, so a rerun samples the same tokens on the same engine."""
    concurrency: int = Field(32, ge=1)
    """Episodes in flight at once."""
    output_dir: str = "eval_out"
    """Where ``episodes.jsonl``, ``summary.json`` and ``summary.md`` go. A directory that holds
    an evaluation of the same config is resumed: its episodes are kept and not run again."""

    @property
    def pass_ks(self) -> list[int]:
        """The k of each reported pass@k."""
        return sorted(set(self.ks) or {1, self.k})

    @model_validator(mode="after")
    def _ks_within_k(self) -> Self:
        bad = [k for k in self.ks if not 1 <= k <= self.k]
        if bad:
            raise ValueError(f"every ks must be in 1..k={self.k}, got {bad}")
        return self


class EvalConfig(RunConfig):
    """An evaluation run: ``agentrl eval CONFIG [key=value ...]``."""

    WHAT: ClassVar[str] = "eval config"

    env: EnvConfig = Field(default_factory=EnvConfig)
    model: EvalModelConfig = Field(default_factory=EvalModelConfig)
    engines: EvalEnginesConfig = Field(default_factory=EvalEnginesConfig)
    sampling: EvalSamplingConfig = Field(default_factory=EvalSamplingConfig)
    eval: EvalSettings = Field(default_factory=EvalSettings)

    @field_validator("model", mode="before")
    @classmethod
    def _training_model(cls, value: Any) -> Any:
        """Validation during training gives its run's ``ModelConfig``."""
        return value.model_dump() if type(value) is ModelConfig else value

    def identity(self) -> dict[str, Any]:
        """What the episodes depend on: a resumed run must match it (concurrency, engines and
        the output directory may change)."""
        values = self.model_dump(mode="json", exclude={"engines": True})
        del values["eval"]["concurrency"], values["eval"]["output_dir"]
        return values


def config_reference_markdown() -> str:
    return reference_markdown(
        EvalConfig,
        "agentrl eval configuration",
        "Every key of `agentrl eval`'s config (`agentrl eval --help-config --markdown`).",
    )
