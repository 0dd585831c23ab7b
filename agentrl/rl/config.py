"""The typed configuration of a training run: what ``agentrl train CONFIG key=value ...`` reads.

A run is one YAML file (``examples/math_grpo_cpu.yaml``) whose sections are the classes below;
every key has a default, a type and a docstring (``agentrl train --help-config`` prints them all).
Overrides on the command line use dotted keys (``rollout.group_size=8``) and YAML values
(``actor.lr=2e-6``, ``env.kwargs={mode: multi}``). Unknown keys and ill-typed values raise
:class:`~agentrl.config.ConfigError` naming each bad key and the valid keys of its section.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal, Self

from pydantic import Field, model_validator

from agentrl.algorithms.losses import POLICY_LOSSES
from agentrl.config import Config, RunConfig, reference_markdown
from agentrl.models import ModelConfig
from agentrl.rl.critic import CriticConfig
from agentrl.rl.engines import EnginesConfig
from agentrl.rl.objective import CRITIC_ADVANTAGE, AlgorithmConfig
from agentrl.rl.validation import ValidationConfig
from agentrl.rollout.agent import AgentConfig
from agentrl.rollout.mixture import EnvConfig
from agentrl.rollout.runner import RolloutConfig
from agentrl.rollout.stream import StreamConfig
from agentrl.training.actor import ActorConfig, check_micro_batch_budget


class TrainerConfig(Config):
    """The loop: steps, micro-batches, checkpoints, outputs."""

    steps: int = Field(4, ge=1)
    """Optimizer steps (one batch each)."""
    micro_batch_tokens: int = Field(4096, ge=16)
    """Token budget of one packed micro-batch on one rank (times ``actor.sequence_parallel``, at
    least ``rollout.max_total_tokens``: a micro-batch that ranks share may be that much
    longer)."""
    seed: int = 0
    """Seeds the prompts, sampling and torch."""
    output_dir: Path = Path("runs/train")
    """Metrics, TensorBoard events, checkpoints, the curves PNG and the exported model go here."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every this many steps (0: only at the end and on Ctrl-C)."""
    keep_checkpoints: int = Field(2, ge=1)
    """Newest checkpoints kept."""
    resume: Literal["auto", "never"] | Path = "auto"
    """``auto``: continue from the newest checkpoint in output_dir if there is one; ``never``;
    or a checkpoint directory."""
    export_hf: bool = True
    """Write a Hugging Face model directory (output_dir/hf) at the end."""
    tensorboard: bool = True
    """Write TensorBoard events besides metrics.jsonl."""
    weight_sync_bucket_mb: int = Field(256, ge=1)
    """Size of the buckets weights are gathered and pushed to the engine in."""


class TrainConfig(RunConfig):
    """One training run; each field is a section of the YAML file."""

    WHAT = "train config"
    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "rollout.engine_dtype": "engines.dtype",
        "rollout.engine_batch_size": "engines.batch_size",
        "rollout.prefix_cache_tokens": "engines.prefix_cache_tokens",
    }

    model: ModelConfig = ModelConfig()
    env: EnvConfig = EnvConfig()
    agent: AgentConfig = AgentConfig()
    """Your own agent (``agent.entry``) instead of the environment's turns; ``env`` gives its
    tasks and grades its answers (:mod:`agentrl.rollout.agent`)."""
    rollout: RolloutConfig = RolloutConfig()
    engines: EnginesConfig = EnginesConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    stream: StreamConfig = StreamConfig()
    actor: ActorConfig = ActorConfig()
    critic: CriticConfig = CriticConfig()
    """The value model of ``algorithm.advantage=gae`` (refused away from its defaults otherwise)."""
    trainer: TrainerConfig = TrainerConfig()
    eval: ValidationConfig = ValidationConfig()
    """Held-out validation during training (:mod:`agentrl.rl.validation`)."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        default_critic = CriticConfig()
        changed = [
            k
            for k in CriticConfig.model_fields
            if getattr(self.critic, k) != getattr(default_critic, k)
        ]
        if self.algorithm.advantage != CRITIC_ADVANTAGE and changed:
            keys = ", ".join(f"critic.{k}" for k in changed)
            raise ValueError(
                f"{keys} set with algorithm.advantage={self.algorithm.advantage}, which trains "
                "no critic; set algorithm.advantage=gae or remove the critic section"
            )
        check_micro_batch_budget(
            self.trainer.micro_batch_tokens,
            self.actor.sequence_parallel,
            self.rollout.max_total_tokens,
            "rollout.max_total_tokens",
            "trajectory",
        )
        self._check_sequence_parallel()
        if self.agent.entry is not None and self.env.mix:
            raise ValueError(
                "agent.entry runs one environment's tasks; give env.id, not env.mix, with an agent"
            )
        algorithm = self.algorithm
        if (
            self.stream.staleness_mode == "importance"
            and algorithm.old_logprobs == "trainer"
            and algorithm.importance_correction == "none"
        ):
            raise ValueError(
                "stream.staleness_mode=importance keeps stale tokens for importance correction, "
                "but algorithm.importance_correction=none corrects nothing (with "
                "algorithm.old_logprobs=trainer); set algorithm.importance_correction=tis or mis, "
                "or stream.staleness_mode=drop or mask"
            )
        budget = algorithm.overlong_max_tokens or self.rollout.max_new_tokens
        if algorithm.overlong_buffer > budget:
            where = (
                "algorithm.overlong_max_tokens"
                if algorithm.overlong_max_tokens
                else "rollout.max_new_tokens"
            )
            raise ValueError(
                f"algorithm.overlong_buffer ({algorithm.overlong_buffer}) is larger than the "
                f"response budget it is a part of, {where} ({budget})"
            )
        return self

    def _check_sequence_parallel(self) -> None:
        """Sequence parallelism splits sequences across ranks: refuse what needs them whole."""
        if self.critic.sequence_parallel != 1:
            raise ValueError(
                "critic.sequence_parallel is not supported: the critic's values need every "
                "sequence whole on one rank"
            )
        if self.actor.sequence_parallel == 1:
            return
        algorithm, whole = self.algorithm, []
        if algorithm.aggregation != "token-mean":
            whole.append(f"algorithm.aggregation={algorithm.aggregation}")
        if not POLICY_LOSSES[algorithm.loss].token_ratio:
            whole.append(f"algorithm.loss={algorithm.loss} (a sequence-level ratio)")
        if algorithm.importance_correction != "none" and algorithm.importance_level != "token":
            whole.append(f"algorithm.importance_level={algorithm.importance_level}")
        if algorithm.rejection == "geometric":
            whole.append("algorithm.rejection=geometric")
        if algorithm.advantage == CRITIC_ADVANTAGE:
            whole.append(f"algorithm.advantage={CRITIC_ADVANTAGE} (the critic's values)")
        if whole:
            raise ValueError(
                f"actor.sequence_parallel={self.actor.sequence_parallel} splits each micro-batch "
                f"across ranks, but {', '.join(whole)} need(s) every sequence whole on one rank; "
                "use token-level settings or actor.sequence_parallel=1"
            )


def config_reference_markdown() -> str:
    """The reference as the Markdown page ``docs/train_config.md`` (a test keeps it in sync)."""
    return reference_markdown(
        TrainConfig,
        "`agentrl train` configuration",
        """
Generated by `agentrl train --help-config --markdown`; every key, its default and meaning.
Set keys in the YAML file (sections as mappings) or as dotted overrides on the command
line (`actor.lr=5e-6`, values parsed as YAML). Unknown keys are rejected.
""",
    )
