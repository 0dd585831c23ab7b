"""The typed configuration of a training run: what ``agentrl train CONFIG key=value ...`` reads.

A run is one YAML file (``examples/math_grpo_cpu.yaml``) whose sections are the classes below;
every key has a default, a type and a docstring (``agentrl train --help-config`` prints them all).
Overrides on the command line use dotted keys (``rollout.group_size=8``) and YAML values
(``actor.lr=2e-6``, ``env.kwargs={mode: multi}``). Unknown keys and ill-typed values raise
:class:`~agentrl.config.ConfigError` naming each bad key and the valid keys of its section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from agentrl.algorithms.losses import Aggregation, KLEstimator, PolicyLossKind
from agentrl.algorithms.off_policy import ImportanceLevel, StalenessMode
from agentrl.config import Config, RunConfig, reference_markdown
from agentrl.models import ModelConfig
from agentrl.rl.critic import CriticConfig
from agentrl.training.actor import ActorConfig


class EnvSpec(Config):
    """One environment of a mixture (``env.mix``)."""

    id: str
    """A registered environment id."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of ``gymnasium.make``."""
    weight: float = Field(1.0, gt=0)
    """Relative probability that a group is drawn from this environment."""
    name: str | None = None
    """Its name in metrics (``env/NAME/...``); default: the id without its namespace."""

    @property
    def label(self) -> str:
        return self.name or self.id.rsplit("/", 1)[-1]


class EnvConfig(Config):
    """The environment episodes run in, or a weighted mixture of environments (``mix``)."""

    id: str = "agentrl/Math-v0"
    """A registered environment id (``gymnasium.make`` finds it after ``import agentrl``)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of ``gymnasium.make`` (checked by the environment's own config)."""
    mix: list[EnvSpec] = Field(default_factory=list)
    """Several environments instead of ``id``/``kwargs``: a list of ``{id, kwargs, weight,
    name}``. Each group is drawn from one of them with probability proportional to its weight
    (reproducibly, from the seed and the group's number); metrics are also given per environment
    (``env/NAME/reward_mean``, ``turns_mean``, ``errors``, ``infra_errors``, ``episodes``)."""

    @model_validator(mode="after")
    def _one_way(self) -> Self:
        if self.mix and self.model_fields_set & {"id", "kwargs"}:
            raise ValueError("give either env.id / env.kwargs or env.mix, not both")
        names = [spec.label for spec in self.mix]
        if len(set(names)) != len(names):
            raise ValueError(f"env.mix names must differ (set `name`), got {names}")
        return self

    def specs(self) -> list[EnvSpec]:
        """The environments of the run (one unless ``mix``)."""
        return list(self.mix) or [EnvSpec(id=self.id, kwargs=self.kwargs)]


class RolloutConfig(Config):
    """How episodes are sampled."""

    groups_per_step: int = Field(4, ge=1)
    """Prompts (groups) in one training batch."""
    group_size: int = Field(4, ge=1)
    """Samples per prompt (GRPO's G); one group shares its reset seed, hence its prompt."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; the trainer scores tokens at the same temperature."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold (1 disables it; anything else makes log-probs biased)."""
    max_new_tokens: int = Field(256, ge=1)
    """Tokens per assistant turn."""
    max_total_tokens: int = Field(1024, ge=2)
    """Tokens per trajectory (prompt, every turn and every tool result)."""
    concurrency: int = Field(64, ge=1)
    """Episodes in flight at once."""
    engine_batch_size: int = Field(32, ge=1)
    """The embedded engine's batch rows."""
    engine_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The embedded engine's weights (the trainer keeps float32): bfloat16 decodes about 1.6x
    faster on CPUs with AVX512-BF16 and on GPUs, at the price of a larger train/inference
    mismatch (logged; corrected by TIS/MIS), and slower than float32 on CPUs without it (AVX2
    only), which emulate it. ``auto``: bfloat16 on a GPU or a CPU with native bfloat16
    (AVX512-BF16, AMX), float32 elsewhere."""
    prefix_cache_tokens: int = Field(8192, ge=0)
    """The embedded engine's prefix cache budget in tokens (0 disables it)."""
    template_policy: Literal["keep", "strict"] = "keep"
    """A chat template that is not append-only (``agentrl check-template``): ``keep`` the tokens
    the engine saw, with a warning, or ``strict``: refuse it (each episode then ends with a
    ``tokenization:`` error naming the problem). Templates that cannot be used are refused
    under both."""
    token_seams: Literal["keep", "reencode"] = "keep"
    """Where a full encode splits a prompt/completion boundary differently (token seams):
    ``keep`` the engine's ids, or ``reencode`` them as a full render would (the seam's ids leave
    the loss; counted in ``mismatch/seam_edits`` and ``mismatch/seam_engine_tokens``)."""


class EnginesConfig(Config):
    """Where rollouts are generated, and how new weights reach the engines."""

    kind: Literal["embedded", "serve", "sglang", "attach", "ray"] = "embedded"
    """``embedded``: one LocalEngine inside the trainer's first process; ``serve``: ``count``
    ``agentrl serve`` processes started and owned by the run; ``sglang``: ``count`` SGLang
    servers started with ``python -m sglang.launch_server`` (one per GPU of ``gpu_ids``);
    ``attach``: servers already running at ``urls``; ``ray``: ``count`` servers placed as Ray
    actors (``ray_server``, on the cluster at ``ray_address``). All but ``embedded`` go through
    an ``EnginePool``: routing, retries on another engine, health checks, eviction."""
    count: int = Field(2, ge=1)
    """Servers to start (``serve``, ``sglang``, ``ray``)."""
    urls: list[str] = Field(default_factory=list)
    """Servers to use (``attach``): ``http://host:port`` of SGLang or ``agentrl serve``."""
    server_args: list[str] = Field(default_factory=list)
    """Extra command-line arguments of each started server."""
    command: list[str] = Field(default_factory=list)
    """``serve``, ``sglang``: the argv that starts one server, instead of the built-in one, with
    ``{model}``, ``{port}``, ``{host}`` and ``{gpu}`` filled in (``server_args`` appended); e.g.
    ``[python, -m, sglang.launch_server, --model-path, "{model}", --port, "{port}",
    --skip-tokenizer-init]``. The server must answer SGLang's HTTP API at ``http://{host}:{port}``."""
    gpu_ids: list[int] = Field(default_factory=list)
    """``sglang``: the GPU of each server (``CUDA_VISIBLE_DEVICES``); default 0, 1, 2..."""
    ray_server: Literal["agentrl", "sglang"] = "agentrl"
    """``ray``: what each actor runs, ``agentrl serve`` or SGLang (``--skip-tokenizer-init``)."""
    ray_gpus_per_engine: float | None = Field(None, ge=0)
    """``ray``: GPUs each actor reserves; default 1 for SGLang, 0 for ``agentrl serve``."""
    ray_address: str | None = None
    """``ray``: the cluster ``ray.init`` joins (``auto``, ``ray://host:10001``); default: the one
    ``RAY_ADDRESS`` names, else a new local instance, stopped when the run ends."""
    weight_sync: Literal["tensor", "disk", "broadcast"] = "tensor"
    """How weights reach the servers after each step: ``tensor`` (buckets posted to
    ``/update_weights_from_tensor``), ``disk`` (written under output_dir/weights, loaded with
    ``/update_weights_from_disk``; servers must read that path), or ``broadcast`` (one process
    group of the trainer and the serving engines: gloo on CPU, NCCL on GPU; formed again when
    the serving engines change, and a failed broadcast is finished by ``tensor``)."""
    startup_timeout: float = Field(600.0, gt=0)
    """Seconds a started server has to become healthy."""
    max_inflight_per_engine: int = Field(64, ge=1)
    """Requests one engine serves at once; more wait for a slot."""
    health_interval: float = Field(2.0, gt=0)
    """Seconds between health probes of every engine."""
    fp8_weights: bool = False
    """Rollouts with blockwise-FP8 weights (128x128 blocks, SGLang's FP8 checkpoint layout; see
    `agentrl.fp8_weights`): weight sync sends each linear weight but the LM head's as
    ``float8_e4m3fn`` with its ``weight_scale_inv``. The embedded engine and ``agentrl serve``
    (started with ``--fp8-weights``) compute with the dequantised weights; an SGLang server must
    have been started from a blockwise-FP8 checkpoint. The mismatch metrics then show the cost.
    Needs ``weight_sync=tensor``."""
    fp8_ignored_layers: list[str] = Field(default_factory=list)
    """With ``fp8_weights``: modules (names or name prefixes, SGLang's ``ignored_layers``) whose
    weights stay in full precision, e.g. ``[model.layers.0]``."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.kind == "attach" and not self.urls:
            raise ValueError("engines.kind=attach needs engines.urls")
        if self.kind != "attach" and self.urls:
            raise ValueError("engines.urls is only for engines.kind=attach")
        if self.command and self.kind not in ("serve", "sglang"):
            raise ValueError("engines.command is only for engines.kind=serve or sglang")
        if self.command and not any("{port}" in part for part in self.command):
            raise ValueError("engines.command must place the server's port: '{port}'")
        for part in self.command:
            try:
                part.format(model="", port=0, host="", gpu=0)
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"engines.command: {part!r} is not a template of {{model}}, {{port}}, "
                    f"{{host}} and {{gpu}} ({type(exc).__name__}: {exc}); write '{{{{' for '{{'"
                ) from None
        if self.kind == "embedded" and self.weight_sync != "tensor":
            raise ValueError("the embedded engine takes weights as tensors (weight_sync=tensor)")
        if self.fp8_weights and self.weight_sync != "tensor":
            raise ValueError(
                f"engines.fp8_weights is sent by weight_sync=tensor only, not "
                f"{self.weight_sync}: FP8 checkpoints on disk and FP8 broadcasts are not built yet"
            )
        if self.fp8_ignored_layers and not self.fp8_weights:
            raise ValueError("engines.fp8_ignored_layers is set but engines.fp8_weights is off")
        return self


class AlgorithmConfig(Config):
    """Advantages, the policy loss and off-policy correction."""

    advantage: Literal["grpo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline", "gae"] = "grpo"
    """``grpo``: group-normalised; ``dr_grpo``: group-centred, not scaled; ``reinforce_pp``:
    batch-whitened rewards; ``reinforce_pp_baseline``: group-centred, then batch-whitened;
    ``gae``: PPO with a critic (the ``critic`` section): per-token GAE advantages from the
    critic's values over each trajectory's loss tokens (environment tokens skipped), whitened over
    the batch's loss tokens; groups need not have more than one sample."""
    gamma: float = Field(1.0, ge=0, le=1)
    """``gae``: the discount per loss token (verl's default 1: no discount within an episode)."""
    lam: float = Field(1.0, ge=0, le=1)
    """``gae``: GAE's lambda (1: Monte-Carlo returns minus the value; 0: one-step TD errors)."""
    small_groups: Literal["drop", "keep"] = "drop"
    """A group that failures (errors, infrastructure failures) left with fewer than two valid
    samples, out of two or more: ``drop`` it from the loss, or ``keep`` it (a lone sample's
    group-relative advantage is 0). Counted in ``batch/small_groups`` either way."""
    loss: PolicyLossKind = "ppo"
    """``ppo``: token-level PPO-clip (with dual-clip); ``gspo``: GSPO's sequence-level ratio;
    ``cispo``: CISPO, ``-sg(clip(ratio)) * A * log-prob``, which keeps every token's gradient
    (with ``old_logprobs=trainer`` and one update per step its ratio is 1, so it is REINFORCE
    weighted by the importance correction; with ``engine`` its weight is the clipped ratio to the
    engine)."""
    clip_low: float = Field(0.2, ge=0, lt=1)
    """Lower clip range (``ppo``, ``gspo``): ratios below ``1 - clip_low`` are clipped."""
    clip_high: float = Field(0.28, ge=0)
    """Upper clip range (``ppo``, ``gspo``; DAPO's clip-higher when above ``clip_low``)."""
    clip_ratio_c: float | None = Field(3.0, gt=1)
    """Dual-clip (``ppo``): a token with advantage ``A < 0`` loses at most ``-A * clip_ratio_c``,
    so one whose ratio grew past ``clip_ratio_c`` gets no gradient (verl's default 3.0);
    ``null`` turns it off."""
    cispo_clip_low: float = Field(1.0, ge=0, le=1)
    """``cispo``: weights below ``1 - cispo_clip_low`` are raised to it; 1 (the MiniMax-M1
    paper's choice) sets no lower bound."""
    cispo_clip_high: float = Field(0.28, ge=0)
    """``cispo``: weights above ``1 + cispo_clip_high`` are cut to it."""
    aggregation: Aggregation = "token-mean"
    """How per-token losses reduce to one number (see agentrl.algorithms.losses)."""
    norm_length: int | None = Field(None, ge=1)
    """Constant length for ``seq-mean-token-sum-norm`` (Dr.GRPO); defaults to max_new_tokens."""
    old_logprobs: Literal["trainer", "engine"] = "trainer"
    """Ratio reference: ``trainer`` (the trainer's log-probs before the step's first update; the
    engine gap is corrected by importance weights) or ``engine`` (the ratio absorbs the gap and
    is clipped; needs ``importance_correction=none``)."""
    mini_batches: int = Field(1, ge=1)
    """PPO mini-batches: each epoch splits the step's sequences (round-robin by batch index,
    whole sequences, the same split on every rank) into this many parts and takes one optimizer
    step per part. Above 1 (or with ``epochs`` above 1) the trainer's old log-probs are computed
    once with a gradient-free forward before the first update, so the ratio moves and clipping
    acts from the second update on; 1 with ``epochs=1`` is one update, old = current detached."""
    epochs: int = Field(1, ge=1)
    """Passes over the step's mini-batches: ``mini_batches * epochs`` optimizer steps per trainer
    step (the LR schedule and the weight version still advance once per trainer step)."""
    importance_correction: Literal["tis", "mis", "none"] = "tis"
    """Engine-to-trainer importance weights (``old_logprobs=trainer`` only): ``tis`` truncates the
    ratio at ``importance_cap``; ``mis`` zeroes the weight of tokens (or sequences) whose ratio
    leaves ``[importance_lower, importance_cap]`` (at token level with bounds 0.5 and 5, IcePop);
    ``none``."""
    importance_level: ImportanceLevel = "token"
    """Per-token ratios, or their product per sequence (the geometric mean is a rejection test:
    ``rejection=geometric``)."""
    importance_cap: float = Field(2.0, ge=1)
    """TIS truncation / MIS upper bound on the ratio."""
    importance_lower: float = Field(0.5, ge=0, le=1)
    """MIS lower bound on the ratio (0: mask only the high side)."""
    rejection: Literal["none", "token", "geometric"] = "none"
    """Take tokens out of the loss by their trainer/engine ratio: ``token`` (IcePop-style: each
    token whose ratio leaves ``[rejection_low, rejection_high]``) or ``geometric`` (a whole
    sequence whose geometric-mean ratio leaves it); ``none``. Rejected tokens weigh 0 (still
    counted in the loss's denominator, as MIS's), accepted ones 1 times any importance weight
    (e.g. token TIS)."""
    rejection_low: float | None = Field(None, ge=0, le=1)
    """Lower bound of the accepted ratio band; default 0.5 (``token``) or 0.999 (``geometric``)."""
    rejection_high: float | None = Field(None, ge=1)
    """Upper bound of the accepted ratio band; default 5 (``token``) or 1.001 (``geometric``)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of a KL penalty to the initial policy (0: no reference model is loaded)."""
    kl_estimator: KLEstimator = "k3"
    """Estimator of the KL penalty (k3 is clamped at 10 per token, as verl's low_var_kl)."""
    overlong_buffer: int = Field(0, ge=0)
    """DAPO's soft overlong punishment: the last this many tokens of the response budget
    ``L_max`` (``overlong_max_tokens``) are a buffer. An episode of ``n`` completion tokens (the
    engine's, summed over its turns: ``Trajectory.completion_tokens``) gets ``0`` up to
    ``L_max - overlong_buffer``, then ``-(n - (L_max - overlong_buffer)) / overlong_buffer *
    overlong_penalty``, reaching ``-overlong_penalty`` at ``L_max`` and staying there beyond;
    added to its reward before the advantages (``reward/mean`` stays the environment's reward;
    the penalty is in ``reward/overlong_penalty_mean`` and ``reward/overlong_fraction``).
    0 turns it off."""
    overlong_penalty: float = Field(1.0, gt=0)
    """The largest overlong penalty (DAPO's factor), reached at ``L_max``."""
    overlong_max_tokens: int | None = Field(None, ge=1)
    """The response budget ``L_max`` of the overlong penalty; default ``rollout.max_new_tokens``
    (one turn's budget: right for single-turn episodes; set it for multi-turn ones, whose
    completion tokens add up over turns)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: a group whose valid samples all have the same reward (after
    the overlong penalty) has no group-relative signal, so it is filtered out and more groups
    are drawn from the stream until the step has ``rollout.groups_per_step`` groups with
    signal, or ``dynamic_sampling_max_draws`` is reached (then the step trains on the groups
    it has). Counted in ``dynamic_sampling/drawn``, ``filtered`` and ``cap_hit``. Meant for the
    group-relative estimators (``grpo``, ``dr_grpo``, ``reinforce_pp_baseline``)."""
    dynamic_sampling_max_draws: int = Field(3, ge=1)
    """Dynamic sampling draws at most this many times ``rollout.groups_per_step`` groups per
    step (1: no extra draws, only the filter)."""

    @field_validator("importance_level", mode="before")
    @classmethod
    def _no_geometric_weights(cls, value: object) -> object:
        if value == "geometric":
            raise ValueError(
                "geometric-mean ratios accept or reject whole sequences rather than weigh them: "
                "set algorithm.rejection=geometric (with importance_level token or sequence for "
                "the weights)"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.old_logprobs == "engine" and self.importance_correction != "none":
            raise ValueError(
                f"algorithm.importance_correction={self.importance_correction} has no effect "
                "with algorithm.old_logprobs=engine (the ratio to the engine is itself the "
                "correction); set algorithm.importance_correction=none or "
                "algorithm.old_logprobs=trainer"
            )
        bounds = {"rejection_low": self.rejection_low, "rejection_high": self.rejection_high}
        given = [f"algorithm.{k}" for k, v in bounds.items() if v is not None]
        if self.rejection == "none" and given:
            raise ValueError(
                f"{' and '.join(given)} set with algorithm.rejection=none: the bounds apply "
                "only to algorithm.rejection=token or geometric"
            )
        if self.rejection_low is not None and self.rejection_low == self.rejection_high:
            raise ValueError(
                "algorithm.rejection_low and algorithm.rejection_high are equal: the band must "
                "have a width, or every sequence is rejected"
            )
        if self.advantage != "gae":
            # a key away from its default (a dumped config.yaml sets every key to its value)
            stray = [
                f"algorithm.{k}"
                for k in ("gamma", "lam")
                if getattr(self, k) != type(self).model_fields[k].default
            ]
            if stray:
                raise ValueError(
                    f"{' and '.join(stray)} set with algorithm.advantage={self.advantage}: "
                    "gamma and lam belong to algorithm.advantage=gae (the critic)"
                )
        if self.overlong_max_tokens is not None and not self.overlong_buffer:
            raise ValueError(
                "algorithm.overlong_max_tokens is set but algorithm.overlong_buffer=0 turns the "
                "overlong penalty off; set algorithm.overlong_buffer"
            )
        return self


class StreamConfig(Config):
    """Streaming rollouts into the trainer, staleness and partial rollouts."""

    max_staleness: int = Field(0, ge=0)
    """Policy versions a token may lag the weights being trained; 0 is synchronous on-policy
    training (rollouts for step s start only once the weights of step s are in the engine)."""
    staleness_mode: StalenessMode = "drop"
    """For tokens beyond the bound: ``drop`` their group, ``mask`` the tokens, or keep them for
    ``importance`` correction (by algorithm.importance_correction, or by the ratio to the engine
    with algorithm.old_logprobs=engine)."""
    partial_rollouts: Literal["pause", "abort"] = "pause"
    """At a weight update, in-flight generations are paused and continue under the new weights
    (``pause``), or aborted, keeping their tokens, and re-issued (``abort``)."""


class TrainerConfig(Config):
    """The loop: steps, micro-batches, checkpoints, outputs."""

    steps: int = Field(4, ge=1)
    """Optimizer steps (one batch each)."""
    micro_batch_tokens: int = Field(4096, ge=16)
    """Token budget of one packed micro-batch (at least ``rollout.max_total_tokens``)."""
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

    model: ModelConfig = ModelConfig()
    env: EnvConfig = EnvConfig()
    rollout: RolloutConfig = RolloutConfig()
    engines: EnginesConfig = EnginesConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    stream: StreamConfig = StreamConfig()
    actor: ActorConfig = ActorConfig()
    critic: CriticConfig = CriticConfig()
    """The value model of ``algorithm.advantage=gae`` (refused away from its defaults otherwise)."""
    trainer: TrainerConfig = TrainerConfig()

    @model_validator(mode="after")
    def _check(self) -> Self:
        default_critic = CriticConfig()
        changed = [
            k
            for k in CriticConfig.model_fields
            if getattr(self.critic, k) != getattr(default_critic, k)
        ]
        if self.algorithm.advantage != "gae" and changed:
            keys = ", ".join(f"critic.{k}" for k in changed)
            raise ValueError(
                f"{keys} set with algorithm.advantage={self.algorithm.advantage}, which trains "
                "no critic; set algorithm.advantage=gae or remove the critic section"
            )
        if self.trainer.micro_batch_tokens < self.rollout.max_total_tokens:
            raise ValueError(
                f"trainer.micro_batch_tokens ({self.trainer.micro_batch_tokens}) must be at least "
                f"rollout.max_total_tokens ({self.rollout.max_total_tokens}): a trajectory "
                "cannot be split across micro-batches"
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
