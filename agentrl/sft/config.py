"""The typed configuration of a supervised fine-tuning run: what ``agentrl sft CONFIG`` reads.

The same style as :mod:`agentrl.rl.config` (and its YAML loader, dotted overrides and
error messages): one YAML file whose sections are the classes below, every key with a default, a
type and a docstring (``agentrl sft --help-config``). ``model`` and ``actor`` are the sections of
``agentrl train``, so an SFT run and the RL run that starts from it read alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, model_validator

from agentrl.config import Config, ConfigError, RunConfig, config_reference, reference_markdown
from agentrl.models import ModelConfig
from agentrl.training.actor import ActorConfig, check_micro_batch_budget


class DataConfig(Config):
    """The conversations: rows with ``messages`` (and optional ``tools``), see docs/sft.md."""

    path: Path | None = None
    """Training conversations: a .jsonl/.json or .parquet file (``agentrl demos`` writes them)."""
    val_path: Path | None = None
    """Validation conversations (same format); default: ``val_fraction`` of ``path``."""
    val_fraction: float = Field(default=0.0, ge=0, lt=1)
    """Share of ``path`` held out for the validation loss when ``val_path`` is not given (0: no
    validation). The split is drawn with ``trainer.seed``."""
    max_tokens: int = Field(default=2048, ge=16)
    """Longest tokenized conversation kept; longer ones are left out (counted in the line the run
    prints when it loads the data). Must not exceed ``trainer.micro_batch_tokens``."""
    template_policy: Literal["keep", "strict"] = "keep"
    """A chat template that is not append-only, as ``rollout.template_policy`` of ``agentrl
    train``: ``keep`` the rollout's token sequence (with a warning) or ``strict``: refuse it."""


class SFTActorConfig(ActorConfig):
    """:class:`~agentrl.training.actor.ActorConfig` with a learning rate for SFT."""

    lr: float = Field(default=2e-5, gt=0)
    """Peak learning rate of AdamW (SFT's default, higher than ``agentrl train``'s)."""


class SFTTrainerConfig(Config):
    """The loop: epochs, batches, checkpoints, outputs."""

    epochs: int = Field(default=1, ge=1)
    """Passes over the training conversations (each in a new order drawn from ``seed``)."""
    steps: int | None = Field(default=None, ge=1)
    """Stop after this many optimizer steps in all (default: ``epochs`` times the steps of one
    epoch)."""
    batch_size: int = Field(default=8, ge=1)
    """Conversations per optimizer step, over all ranks (the last batch of an epoch may be
    smaller). The loss is the mean over the loss tokens of the whole batch."""
    micro_batch_tokens: int = Field(default=4096, ge=16)
    """Token budget of one packed micro-batch on one rank (times ``actor.sequence_parallel``, at
    least ``data.max_tokens``: a micro-batch that ranks share may be that much longer)."""
    seed: int = 0
    """Seeds the shuffling, the validation split and torch."""
    output_dir: Path = Path("runs/sft")
    """Metrics, TensorBoard events, checkpoints and the exported model (output_dir/hf) go here."""
    eval_every: int = Field(default=0, ge=0)
    """Compute the validation loss every this many steps, and at the end (0: at the end only;
    nothing without validation data)."""
    checkpoint_every: int = Field(default=0, ge=0)
    """Save a checkpoint every this many steps (0: only at the end and on Ctrl-C)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Newest checkpoints kept."""
    resume: Literal["auto", "never"] | Path = "auto"
    """``auto``: continue from the newest checkpoint in output_dir if there is one; ``never``; or
    a checkpoint directory."""
    export_hf: bool = True
    """Write a Hugging Face model directory (output_dir/hf) at the end: ``model.path`` of the
    ``agentrl train`` run that follows."""
    tensorboard: bool = True
    """Write TensorBoard events besides metrics.jsonl."""


class SFTConfig(RunConfig):
    """One supervised fine-tuning run; each field is a section of the YAML file."""

    WHAT = "sft config"

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    # model_validate: ActorConfig's positional Field defaults are invisible to mypy
    actor: SFTActorConfig = SFTActorConfig.model_validate({})
    trainer: SFTTrainerConfig = SFTTrainerConfig()

    @model_validator(mode="after")
    def _check(self) -> Self:
        check_micro_batch_budget(
            self.trainer.micro_batch_tokens,
            self.actor.sequence_parallel,
            self.data.max_tokens,
            "data.max_tokens",
            "conversation",
        )
        if self.data.val_path is not None and self.data.val_fraction:
            raise ValueError("give data.val_path or data.val_fraction, not both")
        return self

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | None = None) -> Self:
        """Read ``path`` (YAML; None: all defaults), apply ``key.sub=value`` overrides, validate."""
        config = super().load(path, overrides)
        if config.data.path is None:
            raise ConfigError(f"{path or cls.WHAT}: data.path is required (a .jsonl/.parquet)")
        return config


def sft_config_reference() -> list[tuple[str, str, str]]:
    """(dotted key, default, description) of every key, for ``--help-config`` and docs."""
    return config_reference(SFTConfig)


def sft_config_reference_markdown() -> str:
    """The reference as the Markdown page ``docs/sft_config.md`` (a test keeps it in sync)."""
    return reference_markdown(
        SFTConfig,
        "`agentrl sft` configuration",
        """
Generated by `agentrl sft --help-config --markdown`; every key, its default and meaning.
Set keys in the YAML file (sections as mappings) or as dotted overrides on the command
line (`actor.lr=2e-5`, values parsed as YAML). Unknown keys are rejected. See
[sft.md](sft.md) for the data format and the loss masks.
""",
    )
