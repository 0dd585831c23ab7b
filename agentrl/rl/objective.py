"""The training objective over packed micro-batches: the ``loss_fn`` the actor's step calls.

One packed forward gives the trainer's log-probs of the loss tokens (at the sampling temperature;
the LM head runs only where a loss token is predicted) and their logits; everything else is
per-sequence rows (:meth:`PackedMicroBatch.as_rows`) so that sequence-level aggregation and GSPO
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

import torch
import torch.distributed as dist
from torch import nn

from agentrl.algorithms.losses import (
    aggregate,
    entropy_from_logits,
    kl_penalty,
    loss_denominator,
    policy_loss,
)
from agentrl.algorithms.off_policy import importance_weights, mismatch_metrics, rejection_mask
from agentrl.engine_pool.sampling import logprob_temperature
from agentrl.rl.config import AlgorithmConfig
from agentrl.training.packing import PackedMicroBatch, packed_forward

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
    ) -> None:
        if config.kl_coef > 0 and reference is None:
            raise ValueError("algorithm.kl_coef > 0 needs a reference model")
        self.config = config
        self.temperature = temperature
        self.norm_length = config.norm_length or norm_length
        self.reference = reference
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
        logprobs, logits, scored = packed_forward(
            model, batch, self.temperature, loss_tokens_only=True
        )  # (1, T), (1, K, V), (K,)
        rows = batch.as_rows
        lp = rows(logprobs)  # (S, L)
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
                reference = packed_forward(
                    self.reference, batch, self.temperature, loss_tokens_only=True
                )[0]
                reference = rows(reference)
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
            entropy = torch.zeros_like(batch.loss_mask, dtype=torch.float32)  # (1, T)
            entropy[0, scored] = entropy_from_logits(
                logits.detach(), temperature=logprob_temperature(self.temperature)
            )[0]
            entropy = rows(entropy)
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
            logprobs = packed_forward(model, batch, self.temperature, loss_tokens_only=True)[0]
        return dataclasses.replace(batch, fields={**batch.fields, OLD_LOGPROBS: logprobs})

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
        names = EXTREME_KEYS  # the same on every rank, whatever each rank saw
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
