"""The training loop: streamed rollouts in, FSDP2 updates, weights back into the engine.

One :class:`Trainer` per process (``torchrun`` starts one per rank; a plain ``python`` run is a
one-process group). Rank 0 holds the rollout engines (``engines``: the embedded
:class:`~agentrl.engine_pool.LocalEngine` on its own copy of the weights, or an
:class:`~agentrl.engine_pool.EnginePool` of servers it started or attached to; see
:mod:`agentrl.rl.engines`) and the :class:`~agentrl.rollout.stream.RolloutStream`
that runs episodes against them in the background. Each step:

1. rank 0 takes ``rollout.groups_per_step`` complete groups from the stream (with
   ``algorithm.dynamic_sampling``, groups without signal are filtered out and replaced:
   :meth:`~agentrl.rollout.stream.RolloutStream.next_groups_with_signal`) and builds the
   batch (:func:`~agentrl.rl.batch.build_batch`: overlong penalty, advantages, staleness
   bound, metrics); the batch is broadcast to the other ranks;
2. every rank packs its share (:func:`~agentrl.training.packing.pack_for_rank`) and updates
   (:func:`train_on_batch`: :meth:`~agentrl.training.actor.Actor.train_step` with
   :class:`~agentrl.rl.objective.Objective`, once, or ``algorithm.mini_batches *
   algorithm.epochs`` times against stored old log-probs; with ``algorithm.advantage=gae`` the
   critic's values give per-token GAE advantages first and the critic is updated after each
   policy update: :mod:`agentrl.rl.critic`) in a worker thread, so rollouts keep running
   on the event loop meanwhile (up to the staleness bound); when none runs (every step with
   ``stream.max_staleness=0``, the last one otherwise), the embedded engine's weights and prefix
   cache are freed for the update (``engines.release_while_training``);
3. the new weights go to the engines as version ``step`` (:func:`sync_engines`: tensors, disk
   or broadcast, every engine's version checked, a released engine's weights allocated again; with
   ``stream.partial_rollouts="abort"`` in-flight generations are aborted first and continued
   by the runner, with ``"pause"`` the engine carries them across the update), and the stream
   may launch one more step's groups;
4. every ``eval.every`` steps, rank 0 validates the new weights on held-out tasks
   (:mod:`agentrl.rl.validation`: ``agentrl eval``'s evaluation on the same engines, the stream
   running meanwhile), and the ``val/*`` numbers join the step's metrics;
5. metrics go to ``metrics.jsonl`` / TensorBoard and the progress display; checkpoints are saved
   every ``trainer.checkpoint_every`` steps and at the end.

Stopping. :meth:`Trainer.request_stop` (the launcher wires it to Ctrl-C) stops at the next safe
point: a wait for rollouts is interrupted, a train step or weight sync in progress finishes.
Then a checkpoint is saved (if a step was taken since the last one), the curves PNG is written,
episodes in flight are cancelled (their environments closed) and the engine shut down. With
several ranks, rank 0 decides and the others follow (the decision travels with the batch).

Determinism. With ``stream.max_staleness = 0`` a step's batch is a function of the data position
and the weights: the prompts are fixed by group seeds, sampling by per-(group, sample, turn)
seeds. So resuming from a checkpoint reproduces the next batch (tested). With a bound above 0,
which groups finish first depends on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch
import torch.distributed as dist
from rich.console import Console
from transformers import PreTrainedModel

from agentrl.config import ConfigError
from agentrl.engine_pool import SamplingParams
from agentrl.engine_pool.engine import Engine
from agentrl.envs import make_env
from agentrl.models import engine_dtype, load_model, load_tokenizer
from agentrl.rl.batch import TrainingBatch, build_batch, group_has_signal
from agentrl.rl.config import TrainConfig
from agentrl.rl.critic import Critic, load_value_model, value_model_from_policy
from agentrl.rl.engines import EMBEDDED, RolloutEngines, start_engines, sync_engines
from agentrl.rl.objective import CRITIC_ADVANTAGE, EXTREME_KEYS, Objective
from agentrl.rl.validation import validate, validation_config
from agentrl.rollout.agent import AgentRunner
from agentrl.rollout.mixture import EnvMixture
from agentrl.rollout.runner import EpisodeRunner, Runner
from agentrl.rollout.stream import Group, RolloutStream
from agentrl.training.actor import Actor
from agentrl.training.attention import use_trainer_attention
from agentrl.training.checkpoint import CheckpointManager, export_hf, resume_from
from agentrl.training.distributed import distributed
from agentrl.training.memory import peak_memory_metrics
from agentrl.training.metrics import MetricsLogger
from agentrl.training.plots import DEFAULT_KEYS as DEFAULT_CURVES
from agentrl.training.plots import plot_curves
from agentrl.training.progress import DEFAULT_PROGRESS_KEYS, TrainProgress

STOP = "stop"


@dataclass
class RunSummary:
    """What :meth:`Trainer.run` did."""

    steps: int
    """Trainer steps taken in this run."""
    final_step: int
    """The actor's step count at the end (resumed steps included)."""
    interrupted: bool
    checkpoint: Path | None
    curves: Path | None
    exported: Path | None
    last_metrics: dict[str, float] = field(default_factory=dict)
    validation: dict[int, dict[str, float]] = field(default_factory=dict)
    """The ``val/*`` metrics of each validation this run made, by step (``eval``)."""


class Trainer:
    """A training run (see the module docstring). Use ``async with Trainer(config) as t``."""

    def __init__(
        self, config: TrainConfig, *, console: Console | None = None, show_progress: bool = True
    ) -> None:
        self.config = config
        self.console = console or Console()
        self.show_progress = show_progress
        self.output_dir = Path(config.trainer.output_dir)
        self.stop_event = asyncio.Event()
        self.engine: Engine | None = None
        """Where rollouts go: the embedded LocalEngine or an EnginePool of servers (first rank)."""
        self.engines: RolloutEngines | None = None
        self.engine_dtype = "float32"
        """The engine's weight dtype (``engines.dtype`` resolved: ``auto`` by the device)."""
        self.stream: RolloutStream | None = None
        self._launch_ahead = 0
        """Steps the stream launched ahead at its start (:meth:`_launch_staleness`)."""
        self.agents: AgentRunner | None = None
        """The endpoint and episodes of ``agent.entry``, when the run trains an agent (rank 0)."""
        self.metrics: MetricsLogger | None = None
        self.progress: TrainProgress | None = None
        self.last_checkpoint_step: int | None = None
        self._group = contextlib.ExitStack()
        """Holds ``distributed()``: close() destroys the process group if setup() made it."""
        self.critic: Critic | None = None
        """The value model of ``algorithm.advantage=gae`` (every rank), else None."""
        self.last_batch: TrainingBatch | None = None
        """The batch of the latest step (rank 0: with its metrics; other ranks: sequences)."""
        self.validations: dict[int, dict[str, float]] = {}
        """The ``val/*`` metrics of each validation of this run, by step (rank 0)."""

    # -- set-up and tear-down ----------------------------------------------------------------

    async def __aenter__(self) -> Trainer:
        try:
            await self.setup()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def setup(self) -> None:
        cfg = self.config
        offload = "cpu" in (cfg.actor.offload, cfg.critic.offload)
        self.dist = self._group.enter_context(distributed(cpu_collectives=offload))
        self.is_main = self.dist.is_main
        _seed_everything(cfg.trainer.seed + self.dist.rank)
        await self._check_env()
        self.checkpoints = CheckpointManager(
            self.output_dir / "checkpoints", keep_last=cfg.trainer.keep_checkpoints
        )
        resume_from = self._check_output_dir()
        self.tokenizer = load_tokenizer(cfg.model.path)
        with self._status(f"loading {cfg.model.path}"):
            model = load_model(cfg.model.path, dtype="float32")
        if getattr(model.config, "_attn_implementation", None) != cfg.model.attn_implementation:
            model.set_attn_implementation(cfg.model.attn_implementation)
        reference = None
        if cfg.algorithm.kl_coef > 0:
            reference = copy.deepcopy(model).eval().requires_grad_(False)
        engine_model = None
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.engine_dtype = engine_dtype(cfg.engines.dtype, device)
        if self.is_main and cfg.engines.kind == EMBEDDED:
            # the engine's own copy, in its own dtype; weight sync casts on load
            engine_model = copy.deepcopy(model).to(getattr(torch, self.engine_dtype))
        self.critic = self._build_critic(model)
        self.actor = Actor(model, cfg.actor, dist_info=self.dist)
        if self.actor.sequence_parallel.size > 1:
            if reference is not None:  # it scores the same shared micro-batches
                use_trainer_attention(reference)
            if self.is_main:
                self.console.print(self.actor.sequence_parallel.describe())
        self.objective = Objective(
            cfg.algorithm,
            temperature=cfg.rollout.temperature,
            norm_length=cfg.rollout.max_new_tokens,
            reference=reference,
            chunk_tokens=cfg.actor.logprob_chunk_tokens,
        )
        stream_state = self._resume(resume_from)
        if self.is_main:
            where = "embedded engine" if cfg.engines.kind == EMBEDDED else "engine servers"
            with self._status(f"starting the {where}"):
                self.engines = await start_engines(
                    cfg.engines,
                    model_path=cfg.model.path,
                    engine_model=engine_model,
                    tokenizer=self.tokenizer,
                    engine_dtype=self.engine_dtype,
                    engine_device=self.dist.device,
                    output_dir=self.output_dir,
                )
            self.engine = self.engines.engine
        if self.actor.step > 0:  # resumed: the engine still has the initial weights
            await self._sync_weights()
        if self.is_main:
            assert self.engine is not None
            specs = cfg.env.specs()
            runners = [
                EpisodeRunner(
                    functools.partial(make_env, spec.id, **spec.kwargs),
                    self.engine,
                    self.tokenizer,
                    SamplingParams(
                        temperature=cfg.rollout.temperature,
                        top_p=cfg.rollout.top_p,
                        max_new_tokens=cfg.rollout.max_new_tokens,
                        stop=tuple(cfg.rollout.stop),
                        seed=cfg.trainer.seed,
                    ),
                    # in a mixture, trajectories are named by their environment's label
                    env_id=spec.label if cfg.env.mix else spec.id,
                    max_total_tokens=cfg.rollout.max_total_tokens,
                    resume_aborted=True,
                    template_policy=cfg.rollout.template_policy,
                    seams=cfg.rollout.token_seams,
                )
                for spec in specs
            ]
            runner: Runner = runners[0]
            if cfg.env.mix:
                weights = [spec.weight for spec in specs]
                runner = EnvMixture(runners, weights, seed=cfg.trainer.seed)
            if cfg.agent.entry is not None:  # the user's agent; the environment gives its tasks
                self.agents = AgentRunner.configured(
                    cfg.agent, cfg.rollout, specs[0], self.engine, self.tokenizer
                )
                await self.agents.start()
                runner = self.agents
            self._launch_ahead = self._launch_staleness()
            self.stream = RolloutStream(
                runner,
                group_size=cfg.rollout.group_size,
                groups_per_step=cfg.rollout.groups_per_step,
                max_staleness=self._launch_ahead,
                concurrency=cfg.rollout.concurrency,
                seed=cfg.trainer.seed,
                **stream_state,
            )
            self.stream.start()
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / "config.yaml").write_text(cfg.to_yaml())
            self.metrics = MetricsLogger(
                self.output_dir,
                tensorboard=cfg.trainer.tensorboard,
                resume_from_step=self.actor.step if self.actor.step else None,
            )

    async def close(self) -> None:
        """Cancel rollouts, shut the engine down, close the metrics, and destroy the process
        group if setup() made it (idempotent)."""
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None
        if self.agents is not None:
            await self.agents.aclose()
            self.agents = None
        if self.engines is not None:
            await self.engines.aclose()
            self.engines = None
            self.engine = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        self._group.close()

    async def _check_env(self) -> None:
        """Fail before loading anything on a bad env id or kwargs (of every environment)."""
        for spec in self.config.env.specs():
            try:
                env = gymnasium.make(spec.id, **spec.kwargs)
            except gymnasium.error.Error as exc:
                raise ConfigError(f"env id {spec.id!r}: {exc}") from None
            if not hasattr(env, "aclose"):
                env.close()
                raise ConfigError(
                    f"env id {spec.id!r} is not an agentrl environment (no async verbs)"
                )
            await env.aclose()

    def _build_critic(self, policy: PreTrainedModel) -> Critic | None:
        """The critic of ``algorithm.advantage=gae`` (from the unsharded policy), else None."""
        cfg = self.config
        if cfg.algorithm.advantage != CRITIC_ADVANTAGE:
            return None
        attn = cfg.model.attn_implementation
        with self._status("building the critic"):
            if cfg.critic.path is None:
                model = value_model_from_policy(policy, attn)
            else:
                model = load_value_model(cfg.critic.path, attn)
        return Critic(
            Actor(model, cfg.critic, dist_info=self.dist),
            gamma=cfg.algorithm.gamma,
            lam=cfg.algorithm.lam,
            value_clip=cfg.critic.value_clip,
        )

    def _check_output_dir(self) -> Path | None:
        """The checkpoint to resume from; refuse to start a new run over an old one's metrics."""
        return resume_from(self.config.trainer.resume, self.checkpoints, self.output_dir)

    def _resume(self, path: Path | None) -> dict[str, Any]:
        """Load checkpoint ``path`` (if any); returns the stream's data position."""
        if path is None:
            return {}
        extra = self.checkpoints.load(path, self.actor, critic=self._critic_actor)
        self.last_checkpoint_step = self.actor.step
        if self.is_main:
            self.console.print(f"resumed from {path} at step {self.actor.step}")
        stream = extra.get("stream", {})
        return {
            "next_group": int(stream.get("next_group", 0)),
            "pending_groups": [int(g) for g in stream.get("pending_groups", [])],
        }

    # -- the loop ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop at the next safe point (see the module docstring)."""
        self.stop_event.set()

    async def run(self) -> RunSummary:
        """Train until ``trainer.steps`` or a stop request; then checkpoint, plot and export."""
        cfg = self.config.trainer
        first = self.actor.step
        last: dict[str, float] = {}
        interrupted = False
        with self._progress(first) as progress:
            self.progress = progress
            if self.actor.step == 0 and self.config.eval.before_training:
                initial = await self._validate()
                if self.is_main:
                    assert self.metrics is not None
                    self.metrics.log(0, initial)
            while self.actor.step < cfg.steps:
                record = await self.step()
                if record is None:
                    interrupted = True
                    break
                last = record
                if cfg.checkpoint_every and self.actor.step % cfg.checkpoint_every == 0:
                    await self.save_checkpoint()
            self.progress = None
        checkpoint = None
        if self.last_checkpoint_step != self.actor.step:
            checkpoint = await self.save_checkpoint()
        elif self.last_checkpoint_step:
            checkpoint = self.checkpoints.latest()
        curves = self.write_curves() if self.is_main else None
        exported = None
        if cfg.export_hf and not interrupted:
            exported = await asyncio.to_thread(
                export_hf, self.actor, self.tokenizer, self.output_dir / "hf"
            )
            if self.critic is not None:  # loadable as critic.path by a later run
                await asyncio.to_thread(
                    export_hf, self.critic.actor, None, self.output_dir / "hf_critic"
                )
        return RunSummary(
            self.actor.step - first,
            self.actor.step,
            interrupted,
            checkpoint,
            curves,
            exported if self.is_main else None,
            last,
            dict(self.validations),
        )

    async def step(self) -> dict[str, float] | None:
        """One step: batch, update, weight sync, metrics. None if stopped before training."""
        start = time.perf_counter()
        batch = await self._next_batch()
        if batch is None:
            return None
        wait_s = time.perf_counter() - start
        version = self.actor.step
        released = 0
        in_flight = self.stream.in_flight if self.stream is not None else 0
        if self.engines is not None and self.stream is not None and self.stream.idle:
            released = await self.engines.release_for_training()  # back at the sync below
        self._set_status("training")
        train_start = time.perf_counter()
        if batch.sequences:
            report = await asyncio.to_thread(self._train, batch)
        else:  # every group dropped or failed: nothing to learn from, keep the weights
            report = {"train/skipped": 1.0}
            for actor in (self.actor, self._critic_actor):
                if actor is not None:
                    actor.step += 1
                    actor.scheduler.step()
        train_s = time.perf_counter() - train_start
        self._set_status("syncing weights")
        sync_start = time.perf_counter()
        await self._sync_weights()
        sync_s = time.perf_counter() - sync_start
        if self.stream is not None and self.actor.step + self._launch_ahead < (
            self.config.trainer.steps
        ):
            self.stream.advance()  # rollouts for a step this run will train
        validation = await self._validate() if self.config.eval.due(self.actor.step) else {}
        record = {
            **batch.metrics,
            **report,
            **(self.engines.metrics() if self.engines is not None else {}),
            **(self.agents.metrics() if self.agents is not None else {}),
            "version/trained_on": float(version),
            "time/wait_rollouts_s": wait_s,
            "time/train_s": train_s,
            "time/sync_s": sync_s,
            "time/step_s": time.perf_counter() - start,
            "throughput/train_tokens_per_s": batch.metrics.get("batch/tokens", 0.0)
            / max(train_s, 1e-9),
            **peak_memory_metrics(),
            "memory/engine_released_gb": released / 1e9,
            "stream/in_flight_groups": float(in_flight),
            **validation,
        }
        self.last_batch = batch
        if self.is_main:
            assert self.metrics is not None
            self.metrics.log(self.actor.step, record)
            if self.progress is not None:
                self.progress.update(self.actor.step, record)
        return record

    async def _validate(self) -> dict[str, float]:
        """Validate the current weights (rank 0; see :mod:`agentrl.rl.validation`)."""
        if not self.is_main:
            return {}
        assert self.engine is not None
        cfg = self.config
        step = self.actor.step
        self._set_status(f"validating step {step}")
        evaluation = validation_config(
            cfg.eval,
            cfg.env,
            cfg.model,
            cfg.rollout,
            self.output_dir / "validation" / f"step_{step}",
            cfg.trainer.seed,
        )
        metrics = await validate(evaluation, self.engine, self.tokenizer)
        self.validations[step] = metrics
        return metrics

    async def _next_batch(self) -> TrainingBatch | None:
        """Rank 0 builds the batch from the stream; every rank gets it (None: stop)."""
        batch: TrainingBatch | None = None
        if self.is_main:
            assert self.stream is not None
            self._set_status("waiting for rollouts")
            algorithm = self.config.algorithm
            budget = self.config.rollout.max_new_tokens  # the overlong penalty's default L_max
            drawn: tuple[list[Group], dict[str, float]] | None
            if algorithm.dynamic_sampling:
                drawn = await self.stream.next_groups_with_signal(
                    functools.partial(
                        group_has_signal, algorithm=algorithm, max_response_tokens=budget
                    ),
                    algorithm.dynamic_sampling_max_draws * self.stream.groups_per_step,
                    self.stop_event,
                )
            else:
                groups = await self.stream.next_groups(self.stop_event)
                drawn = None if groups is None else (groups, {})
            if drawn is not None:
                groups, sampling = drawn
                batch = build_batch(
                    groups,
                    algorithm,
                    self.config.stream,
                    self.actor.step,
                    max_response_tokens=budget,
                )
                batch.metrics.update(sampling)
        if self.dist.world_size > 1:
            payload = [batch if batch is not None else STOP]
            await asyncio.to_thread(dist.broadcast_object_list, payload, 0)
            received = payload[0]
            batch = received if isinstance(received, TrainingBatch) else None
        return batch

    def _launch_staleness(self) -> int:
        """How many steps ahead the stream launches: ``stream.max_staleness``, but never past
        ``trainer.steps``, so that no rollout runs (beside the last steps' training, holding
        engine memory and cores) for a step this run will not train; :meth:`step` stops
        advancing the stream once its launches cover the last step. Only launches are capped:
        the per-token staleness bound stays ``stream.max_staleness``."""
        remaining = self.config.trainer.steps - self.actor.step
        return max(0, min(self.config.stream.max_staleness, remaining - 1))

    def _train(self, batch: TrainingBatch) -> dict[str, float]:
        """One trainer step on the batch (runs in a worker thread)."""
        return train_on_batch(
            self.actor,
            self.objective,
            batch.sequences,
            micro_batch_tokens=self.config.trainer.micro_batch_tokens,
            mini_batches=self.config.algorithm.mini_batches,
            epochs=self.config.algorithm.epochs,
            critic=self.critic,
        )

    async def _sync_weights(self) -> None:
        await sync_engines(
            self.engines,
            self.config.engines.weight_sync,
            self.actor,
            self.actor.step,
            bucket_bytes=self.config.trainer.weight_sync_bucket_mb * 2**20,
            abort=self.config.stream.partial_rollouts == "abort",
        )

    # -- outputs -----------------------------------------------------------------------------

    async def save_checkpoint(self) -> Path:
        """Save model, optimizer, scheduler, RNG and the data position (every rank calls it)."""
        self._set_status("saving checkpoint")
        stream_state = self.stream.state if self.stream is not None else {}
        if self.dist.world_size > 1:
            payload = [stream_state]
            await asyncio.to_thread(dist.broadcast_object_list, payload, 0)
            stream_state = payload[0]
        extra = {"stream": stream_state, "version": self.actor.step}
        path = await asyncio.to_thread(
            self.checkpoints.save, self.actor, extra, critic=self._critic_actor
        )
        self.last_checkpoint_step = self.actor.step
        return path

    @property
    def _critic_actor(self) -> Actor | None:
        return self.critic.actor if self.critic is not None else None

    def write_curves(self) -> Path:
        keys = list(DEFAULT_CURVES)
        if self.config.eval.enabled:  # held-out pass@1 of each validated environment
            specs = (self.config.eval.env or self.config.env).specs()
            keys += [f"val/{spec.label}/pass@1" for spec in specs]
        return plot_curves(
            self.output_dir / "metrics.jsonl",
            self.output_dir / "curves.png",
            keys=keys,
            title=f"{' + '.join(s.label for s in self.config.env.specs())} · "
            f"{self.config.model.path}",
        )

    def _progress(self, first: int) -> contextlib.AbstractContextManager[Any]:
        if not (self.is_main and self.show_progress):
            return contextlib.nullcontext(None)
        keys = list(DEFAULT_PROGRESS_KEYS)
        if self.config.env.mix:  # the reward of each environment after the overall one
            labels = [f"env/{spec.label}/reward_mean" for spec in self.config.env.mix]
            keys[1:1] = labels
        return TrainProgress(
            self.config.trainer.steps, start_step=first, keys=keys, console=self.console
        )

    def _status(self, text: str) -> contextlib.AbstractContextManager[Any]:
        if not (self.is_main and self.show_progress):
            return contextlib.nullcontext()
        return self.console.status(text)

    def _set_status(self, text: str) -> None:
        if self.progress is not None:
            stream = self.stream
            if stream is not None and text == "waiting for rollouts":
                text = f"rollouts: {stream.ready} groups ready, {stream.in_flight} running"
            self.progress.status(text)


def train_on_batch(
    actor: Actor,
    objective: Objective,
    sequences: Sequence[Mapping[str, Any]],
    *,
    micro_batch_tokens: int,
    mini_batches: int = 1,
    epochs: int = 1,
    critic: Critic | None = None,
) -> dict[str, float]:
    """One trainer step on ``sequences``, which every rank holds in full; a collective.

    Sequence ``i`` goes to part ``i % mini_batches`` (whole sequences; a part without a loss
    token is left out), and each rank packs its share of each part
    (:func:`~agentrl.training.packing.pack_for_rank`), so every rank takes the same number of
    optimizer steps with the same number of micro-batches each. ``epochs`` passes take one
    optimizer step per part; only the last ends the trainer step (:attr:`Actor.step` and the LR
    schedule advance once). With more than one update and ``old_logprobs="trainer"`` the old
    log-probs are computed for every part before the first (:meth:`Objective.with_old_logprobs`).
    With ``actor.sequence_parallel`` above 1, each group of ranks shares its micro-batches
    (:meth:`Actor.micro_batches`).
    With a ``critic`` (``algorithm.advantage=gae``) the advantages are first computed from its
    values (:meth:`Critic.prepare`), and every policy update is followed by a critic update on
    the same micro-batches (:meth:`Critic.update`).
    Returns the mean of the updates' metrics (maxima and minima: over the updates) and
    ``train/optimizer_steps``.
    """
    objective.policy_version = actor.step  # the weights the engines sampled on-policy tokens with
    parts = [sequences[k::mini_batches] for k in range(mini_batches)]
    parts = [part for part in parts if any(any(s["loss_mask"]) for s in part)] or [sequences]
    packed = [actor.micro_batches(part, micro_batch_tokens) for part in parts]
    updates = len(packed) * epochs
    critic_metrics: dict[str, float] = {}
    if critic is not None:
        packed, critic_metrics = critic.prepare(packed)
    if updates > 1 and objective.config.old_logprobs == "trainer":
        packed = [[objective.with_old_logprobs(actor.model, mb) for mb in mbs] for mbs in packed]
    reports: list[dict[str, float]] = []
    for _ in range(epochs):
        for micro_batches in packed:
            end_step = len(reports) == updates - 1
            reported = actor.train_step(micro_batches, objective, end_step=end_step)
            report = objective.finish(reported, actor.device)
            if critic is not None:
                report.update(critic.update(micro_batches, end_step=end_step))
            reports.append(report)
    return {
        **_merge_reports(reports),
        **critic_metrics,
        "train/optimizer_steps": float(updates),
    }


def _merge_reports(reports: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each metric over the updates; maxima and minima over them."""
    merged = {}
    for name in reports[0]:
        values = [report[name] for report in reports]
        if name == "policy/ratio_min":
            merged[name] = min(values)
        elif name in EXTREME_KEYS:
            merged[name] = max(values)
        else:
            merged[name] = sum(values) / len(values)
    return merged


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
