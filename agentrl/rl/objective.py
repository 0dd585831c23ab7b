"""The training objective over packed micro-batches: the ``loss_fn`` the actor's step calls.

One packed forward gives the trainer's log-probs of the loss tokens (at the sampling temperature;
the LM head runs only where a loss token is predicted) and their entropy, all vocabulary-wide
logits at once or, with ``actor.logprob_chunk_tokens``, a chunk of tokens at a time (never the
whole ``(K, V)``: :mod:`agentrl.training.chunked_logprobs`); everything else is per-sequence rows (:meth:`PackedMicroBatch.as_rows`) so that sequence-level aggregation and GSPO
see one row per trajectory:

* the policy loss (:func:`~agentrl.algorithms.losses.policy_loss`: PPO-clip with dual-clip, GSPO or
  CISPO) against ``old_logprobs``: the trainer's own log-probs before the step's first update, or
  the engine's. With one optimizer step per batch the current log-probs, detached, *are* the
  pre-update values, so no second forward is needed; with several (PPO mini-batches or epochs)
  :meth:`Objective.with_old_logprobs` stores them in the micro-batch first (field
  ``old_logprobs``), and the ratio to them moves, and is clipped, after the first update;
* with trainer ``old_logprobs``, importance weights from the engine's distribution to the
  trainer's old one (:func:`~agentrl.algorithms.off_policy.importance_weights`, TIS or MIS): this corrects
  both numerical mismatch and staleness, because the engine's log-probs were computed by the
  weights that sampled each token;
* optionally, rejection (:func:`~agentrl.algorithms.off_policy.rejection_mask`): tokens or whole
  sequences whose trainer/engine ratio leaves a band get weight 0 (the others keep their
  importance weight, or 1);
* an optional KL penalty to a frozen reference model;
* logging: train/inference mismatch (mean and max ``|Δ log-prob|``, KL), the entropy of the
  sampling distribution (``softmax(logits / T)``), clip fractions, importance and rejection
  statistics.

Metric plumbing. :meth:`Actor.train_step` divides every metric sum by the loss's global
denominator; :class:`Objective` reports token-weighted sums plus a ``tokens`` count, so the
token-mean of a metric over the whole batch (every rank) is ``reported[m] / reported["tokens"]``
(:meth:`Objective.finish`). Maxima and minima cannot be summed: they are kept per rank in
:attr:`Objective.extremes` and reduced with an all-reduce by :meth:`Objective.finish`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Literal, Self

import torch
import torch.distributed as dist
from pydantic import Field, field_validator, model_validator
from torch import nn

from agentrl.algorithms.advantages import OUTCOME_ADVANTAGES
from agentrl.algorithms.losses import (
    POLICY_LOSSES,
    Aggregation,
    KLEstimator,
    PolicyLossKind,
    aggregate,
    kl_penalty,
    loss_denominator,
    policy_loss,
)
from agentrl.algorithms.off_policy import (
    ImportanceLevel,
    importance_weights,
    mismatch_metrics,
    rejection_mask,
)
from agentrl.config import Config, registered
from agentrl.training.packing import PackedMicroBatch, PackedScores, packed_scores

CRITIC_ADVANTAGE = "gae"
"""``algorithm.advantage`` of PPO with a critic: per-token GAE advantages (:mod:`agentrl.rl.critic`)."""


class AlgorithmConfig(Config):
    """Advantages, the policy loss and off-policy correction."""

    advantage: str = "grpo"
    """A registered estimator (:data:`~agentrl.algorithms.advantages.OUTCOME_ADVANTAGES`, or
    ``gae``). ``grpo``: group-normalised; ``dr_grpo``: group-centred, not scaled; ``reinforce_pp``:
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
    """A registered policy loss (:data:`~agentrl.algorithms.losses.POLICY_LOSSES`). ``ppo``: token-level PPO-clip (with dual-clip); ``gspo``: GSPO's sequence-level ratio;
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

    @field_validator("advantage")
    @classmethod
    def _registered_advantage(cls, value: str) -> str:
        return registered(value, [*OUTCOME_ADVANTAGES, CRITIC_ADVANTAGE], "advantage estimator")

    @field_validator("loss")
    @classmethod
    def _registered_loss(cls, value: str) -> str:
        return registered(value, POLICY_LOSSES, "policy loss")

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
        if self.advantage != CRITIC_ADVANTAGE:
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


MEAN_METRICS = {
    "clip_fraction": "policy/clip_fraction",
    "clip_high_fraction": "policy/clip_high_fraction",
    "clip_low_fraction": "policy/clip_low_fraction",
    "clip_dual_fraction": "policy/clip_dual_fraction",
    "ratio_mean": "policy/ratio_mean",
    "approx_kl": "policy/approx_kl",
}
EXTREME_METRICS = {"ratio_max": "policy/ratio_max", "ratio_min": "policy/ratio_min"}
EXTREME_KEYS = ("mismatch/max_abs", "policy/ratio_max", "policy/ratio_min")
ON_POLICY_MAX = "mismatch/on_policy_max_abs"
"""The maximum over on-policy tokens (see :attr:`Objective.policy_version`); an extreme as well."""
IMPORTANCE_METRICS = ("ratio_mean", "truncated_fraction", "masked_fraction", "weight_mean")
OLD_LOGPROBS = "old_logprobs"
"""The micro-batch field of stored trainer old log-probs (:meth:`Objective.with_old_logprobs`)."""


class Objective:
    """``loss_fn(model, micro_batch)`` for :meth:`Actor.train_step` (see the module docstring).

    Micro-batches are :class:`PackedMicroBatch` with fields ``logprobs`` (the engine's),
    ``advantages`` and ``versions``, and optionally :data:`OLD_LOGPROBS`. ``reference`` is the frozen model of the KL penalty, required
    when ``config.kl_coef > 0``.
    """

    def __init__(
        self,
        config: AlgorithmConfig,
        *,
        temperature: float,
        norm_length: int | None = None,
        reference: nn.Module | None = None,
        chunk_tokens: int | None = None,
    ) -> None:
        if config.kl_coef > 0 and reference is None:
            raise ValueError("algorithm.kl_coef > 0 needs a reference model")
        self.config = config
        self.temperature = temperature
        self.norm_length = config.norm_length or norm_length
        self.reference = reference
        self.chunk_tokens = chunk_tokens
        """``actor.logprob_chunk_tokens``: the LM head and log-softmax run this many tokens at a
        time, recomputed in the backward (0 or ``None``: all at once; see
        :func:`~agentrl.training.packing.packed_scores`), for the policy, the reference and the
        old log-probs alike."""
        self.extremes: dict[str, float] = {}
        """Per-rank maxima since the last :meth:`finish` (minima stored negated)."""
        self.policy_version: int | None = None
        """The weight version being trained (:attr:`Actor.step`), set before each step by
        :func:`~agentrl.rl.loop.train_on_batch`. ``mismatch/*`` compares the engine's
        log-probs of every loss token with the trainer's, so it adds staleness (tokens sampled
        by older weights) to the numerical train/inference gap; the ``mismatch/on_policy_*``
        metrics, logged when this is set, cover only the tokens sampled by exactly these weights
        (``versions == policy_version``), the numerical gap alone: ``on_policy_fraction`` of the
        loss tokens, their ``on_policy_mean_abs`` and ``on_policy_max_abs`` (NaN when the step
        has no such token)."""

    def __call__(
        self, model: nn.Module, batch: PackedMicroBatch
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.config
        scores = self._scores(model, batch, entropy=True)
        rows = batch.as_rows
        lp = rows(scores.logprobs)  # (S, L)
        mask = rows(batch.loss_mask.float())
        engine = rows(batch.fields["logprobs"].float())
        advantages = rows(batch.fields["advantages"].float())
        tokens = mask.sum()
        if OLD_LOGPROBS in batch.fields:  # stored before the step's first update
            trainer_old = rows(batch.fields[OLD_LOGPROBS].float())
        else:  # the only update of the step: the current values are the pre-update ones
            trainer_old = lp.detach()
        sums: dict[str, torch.Tensor] = {}
        weights = None
        if cfg.importance_correction != "none":  # the config allows it with trainer old only
            weights, is_metrics = importance_weights(
                trainer_old,
                engine,
                mask,
                mode=cfg.importance_correction,
                level=cfg.importance_level,
                cap=cfg.importance_cap,
                lower=cfg.importance_lower,
            )
            for name in IMPORTANCE_METRICS:
                sums[f"importance/{name}"] = is_metrics[name] * tokens
        if cfg.rejection != "none":
            accepted, rs_metrics = rejection_mask(
                trainer_old,
                engine,
                mask,
                level=cfg.rejection,
                low=cfg.rejection_low,
                high=cfg.rejection_high,
            )
            weights = accepted.float() if weights is None else weights * accepted
            for name, fraction in rs_metrics.items():
                sums[f"rejection/{name}"] = fraction * tokens
        old = trainer_old if cfg.old_logprobs == "trainer" else engine
        if cfg.loss == "cispo":
            clip_low, clip_high = cfg.cispo_clip_low, cfg.cispo_clip_high
        else:
            clip_low, clip_high = cfg.clip_low, cfg.clip_high
        agg, norm = cfg.aggregation, self.norm_length
        loss, metrics = policy_loss(
            lp,
            old,
            advantages,
            mask,
            kind=cfg.loss,
            clip_low=clip_low,
            clip_high=clip_high,
            clip_ratio_c=cfg.clip_ratio_c,
            agg=agg,
            norm_length=norm,
            denominator=1,
            token_weights=weights,
        )
        sums.update({MEAN_METRICS[k]: v * tokens for k, v in metrics.items() if k in MEAN_METRICS})
        if self.reference is not None and cfg.kl_coef > 0:
            with torch.no_grad():
                reference = rows(self._scores(self.reference, batch).logprobs)
            kl = kl_penalty(lp, reference, cfg.kl_estimator)
            loss = loss + cfg.kl_coef * aggregate(kl, mask, agg, norm_length=norm, denominator=1)
            sums["policy/kl_ref"] = torch.where(mask != 0, kl.detach(), 0.0).sum()
        with torch.no_grad():
            mismatch = mismatch_metrics(trainer_old, engine, mask)
            sums["mismatch/mean_abs"] = mismatch["mean_abs"] * tokens
            sums["mismatch/kl"] = mismatch["kl"] * tokens
            on_policy = None
            if self.policy_version is not None:
                versions = rows(batch.fields["versions"])
                fresh = torch.where(versions == self.policy_version, mask, 0.0)
                on_policy = mismatch_metrics(trainer_old, engine, fresh)
                # a token-weighted sum like the others; finish() turns it into the mean over them
                sums["mismatch/on_policy_mean_abs"] = on_policy["mean_abs"] * on_policy["n_tokens"]
                sums["mismatch/on_policy_fraction"] = on_policy["n_tokens"].float()
            # the entropy of the distribution tokens were sampled from: softmax(logits / T)
            assert scores.entropy is not None  # asked for
            entropy = rows(scores.entropy)
            sums["policy/entropy"] = torch.where(mask != 0, entropy, 0.0).sum()
        sums["tokens"] = tokens
        if batch.n_loss_tokens:
            self._extreme("mismatch/max_abs", float(mismatch["max_abs"]))
            if on_policy is not None and int(on_policy["n_tokens"]):
                self._extreme(ON_POLICY_MAX, float(on_policy["max_abs"]))
            for name, key in EXTREME_METRICS.items():
                value = float(metrics[name])
                self._extreme(key, -value if name == "ratio_min" else value)
        return loss, loss_denominator(mask, agg, norm_length=norm), sums

    def with_old_logprobs(self, model: nn.Module, batch: PackedMicroBatch) -> PackedMicroBatch:
        """``batch`` with ``model``'s current log-probs of its loss tokens (no grad) as field
        :data:`OLD_LOGPROBS`, the ratio reference of every later update on it. Runs the model
        once, as :meth:`__call__` does (so every rank must call it as often)."""
        with torch.no_grad():
            logprobs = self._scores(model, batch).logprobs
        return dataclasses.replace(batch, fields={**batch.fields, OLD_LOGPROBS: logprobs})

    def _scores(
        self, model: nn.Module, batch: PackedMicroBatch, *, entropy: bool = False
    ) -> PackedScores:
        """The loss tokens' log-probs (and entropy) under ``model``, at the sampling temperature."""
        return packed_scores(
            model,
            batch,
            self.temperature,
            loss_tokens_only=True,
            chunk_tokens=self.chunk_tokens,
            entropy=entropy,
        )

    def _extreme(self, key: str, value: float) -> None:
        self.extremes[key] = max(self.extremes.get(key, -float("inf")), value)

    def finish(self, reported: Mapping[str, float], device: torch.device) -> dict[str, float]:
        """Turn :meth:`Actor.train_step`'s report into batch-level metrics (a collective)."""
        tokens = reported.get("tokens", 0.0)
        out: dict[str, float] = {}
        for name, value in reported.items():
            if name == "tokens":
                continue
            if "/" in name:  # a token-weighted sum / D: make it a token mean
                out[name] = value / tokens if tokens else 0.0
            else:
                out[f"train/{name}"] = value
        if "mismatch/on_policy_fraction" in out:  # a mean over all tokens: over on-policy ones
            fraction = out["mismatch/on_policy_fraction"]
            total = out["mismatch/on_policy_mean_abs"]
            out["mismatch/on_policy_mean_abs"] = total / fraction if fraction else math.nan
        names: tuple[str, ...] = EXTREME_KEYS  # the same on every rank, whatever each rank saw
        if self.policy_version is not None:  # set on every rank alike
            names = (*EXTREME_KEYS, ON_POLICY_MAX)
        values = torch.tensor(
            [self.extremes.get(n, -math.inf) for n in names], dtype=torch.float64, device=device
        )
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(values, op=dist.ReduceOp.MAX)
        for name, value in zip(names, values.tolist(), strict=True):
            if not math.isfinite(value):
                value = math.nan  # no loss token anywhere
            out[name] = -value if name == "policy/ratio_min" else value
        self.extremes = {}
        return out
