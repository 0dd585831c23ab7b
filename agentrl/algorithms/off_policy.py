"""Off-policy correction: train/inference mismatch, importance weights, and stale tokens.

Every token the engine produced carries the engine's log-prob and the weight version that produced
it (`agentrl.tokenization.TokenTrajectory`). The trainer's log-prob of the same token differs for
two reasons: numerics (kernels, dtypes, batching; the version is the current one) and staleness
(the weights moved on since the token was sampled). Both make the engine the *behaviour* policy and
the trainer the *target*; this module measures the gap and turns it into per-token loss weights.

* `mismatch_metrics`: mean and max ``|trainer - engine|`` and a KL estimate; log them every step.
* `importance_weights`: truncated (TIS, "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training", Yao et al. 2025) or masked (MIS, "When Speed Kills Stability:
  Demystifying RL Collapse from the Training-Inference Mismatch", Liu et al. 2025) importance
  weights, per token or per sequence, for `agentrl.algorithms.losses.policy_loss`'s
  ``token_weights``.
* `rejection_mask`: which loss tokens to train on at all. Tokens (IcePop, Ring-1T 2025) or whole
  sequences (by their geometric-mean ratio, Liu et al.'s "geometric" rejection; verl's geo-RS)
  whose ratio leaves a two-sided band get weight 0; the rest weigh 1 (or their importance
  weight, when combined with `importance_weights`).
* `staleness` and `staleness_policy`: how many versions old each token is, and what a staleness
  bound does with tokens beyond it (drop the trajectory, mask the tokens, or keep them for IS).

All tensors are token-aligned ``(N, T)``; ratios are computed in float32 (float64 when log-probs
are float64). Log-prob entries off the loss mask are ignored (they may be anything, including
-inf). Nothing here has a gradient. Metrics are detached 0-dim tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from agentrl.algorithms.losses import MAX_LOG_RATIO, check_aligned


def _masked_mean(values: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    return torch.where(on, values, 0.0).sum() / on.sum().clamp(min=1)


def _masked_max(values: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """Max of ``values`` where ``on``; 0 when nothing is on. No host sync."""
    if values.numel() == 0:
        return values.new_zeros(())
    return torch.where(on.any(), torch.where(on, values, -torch.inf).amax(), 0.0)


def _log_ratio(
    trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log(pi_trainer / pi_engine)`` ``(N, T)``, 0 off the mask, and the bool mask.

    float32, or float64 when either input is float64 (reference checks compute in float64)."""
    check_aligned(trainer_logprobs, engine_logprobs, loss_mask)
    on = loss_mask != 0
    wide = torch.float64 in (trainer_logprobs.dtype, engine_logprobs.dtype)
    dtype = torch.float64 if wide else torch.float32
    diff = trainer_logprobs.detach().to(dtype) - engine_logprobs.detach().to(dtype)
    return torch.where(on, diff, 0.0), on


def mismatch_metrics(
    trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, loss_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the trainer's log-probs ``(N, T)`` are from the engine's, over loss tokens.

    ``mean_abs`` and ``max_abs`` of ``trainer - engine``; ``kl``: the k3 estimate of KL(engine ||
    trainer) (the tokens were sampled by the engine), ``mean(exp(d) - 1 - d)`` with ``d = trainer -
    engine``; ``n_tokens``. All 0 when the mask is empty.
    """
    d, on = _log_ratio(trainer_logprobs, engine_logprobs, loss_mask)
    k3 = (torch.expm1(d.clamp(max=MAX_LOG_RATIO)) - d).clamp(min=0)
    return {
        "mean_abs": _masked_mean(d.abs(), on),
        "max_abs": _masked_max(d.abs(), on),
        "kl": _masked_mean(k3, on),
        "n_tokens": on.sum(),
    }


ImportanceLevel = Literal["token", "sequence"]
RejectionLevel = Literal["token", "geometric"]

REJECTION_BOUNDS: dict[str, tuple[float, float]] = {
    "token": (0.5, 5.0),
    "geometric": (0.999, 1.001),
}
"""Default ``(low, high)`` of `rejection_mask` per level: IcePop's token band, and verl's
geometric-mean band (the mean log-ratio of an accepted sequence lies within about ±1e-3)."""


def importance_weights(
    trainer_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    mode: Literal["tis", "mis", "none"] = "tis",
    level: ImportanceLevel = "token",
    cap: float = 2.0,
    lower: float = 0.5,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Importance weights ``(N, T)`` float32 (float64 for float64 log-probs) from the engine's to
    the trainer's distribution.

    The ratio ``rho = pi_trainer / pi_engine`` is taken per ``level``:

    * ``"token"``: each token's own ratio;
    * ``"sequence"``: the product of the ratios of the sequence's loss tokens (the exact sequence
      importance ratio), on each of its tokens.

    (The geometric mean of a sequence's ratios is not an importance weight: weighting by it
    corrects no expectation. It serves to accept or reject whole sequences: `rejection_mask`.)

    ``mode``:

    * ``"tis"``: ``min(rho, cap)``: truncated, never zero;
    * ``"mis"``: ``rho`` where ``lower <= rho <= cap``, else 0: the token (or, at sequence level,
      the whole sequence) is masked out of the loss. Two-sided by default (``lower = 0.5``);
      ``lower = 0`` masks only the high side, as in Liu et al. Masked tokens still count in the
      loss's denominator (a weight of 0, not a smaller batch). At token level with ``lower=0.5,
      cap=5`` this is IcePop's objective;
    * ``"none"``: 1 (metrics only).

    Weights are 0 off the loss mask; ``log rho`` is clamped to ``[-20, 20]`` before ``exp``.
    Metrics: ``ratio_mean`` / ``ratio_max`` (of ``rho`` at the chosen level, per loss token),
    ``truncated_fraction`` (TIS) and ``masked_fraction`` (MIS) of loss tokens, ``weight_mean``,
    and ``ess``: the normalised effective sample size ``(sum w)^2 / (n sum w^2)`` in ``[0, 1]``
    (0 when every weight is 0).
    """
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    if not 0 <= lower <= 1:
        raise ValueError(f"lower must be in [0, 1], got {lower}")
    d, on = _log_ratio(trainer_logprobs, engine_logprobs, loss_mask)  # (N, T)
    if level == "token":
        log_rho = d
    elif level == "sequence":
        log_rho = d.sum(-1, keepdim=True).expand_as(d)
    else:
        raise ValueError(
            f"unknown importance level {level!r} (token or sequence; geometric-mean ratios "
            "accept or reject sequences: rejection_mask)"
        )
    log_rho = log_rho.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    log_cap = math.log(cap)
    zeros = torch.zeros_like(d, dtype=torch.bool)
    truncated, masked = zeros, zeros
    if mode == "tis":
        truncated = on & (log_rho > log_cap)
        weights = log_rho.clamp(max=log_cap).exp()
    elif mode == "mis":
        log_lower = math.log(lower) if lower > 0 else -math.inf
        masked = on & ((log_rho > log_cap) | (log_rho < log_lower))
        weights = torch.where(masked, 0.0, log_rho.clamp(max=log_cap).exp())
    elif mode == "none":
        weights = torch.ones_like(d)
    else:
        raise ValueError(f"unknown importance mode {mode!r}")
    weights = torch.where(on, weights, 0.0)
    rho = log_rho.exp()
    n = on.sum().clamp(min=1)
    metrics = {
        "ratio_mean": _masked_mean(rho, on),
        "ratio_max": _masked_max(rho, on),
        "truncated_fraction": truncated.sum() / n,
        "masked_fraction": masked.sum() / n,
        "weight_mean": weights.sum() / n,
        "ess": weights.sum().square() / (n * weights.square().sum()).clamp(min=1e-30),
    }
    return weights, metrics


def rejection_mask(
    trainer_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    level: RejectionLevel = "token",
    low: float | None = None,
    high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss tokens ``(N, T)`` bool whose ratio ``pi_trainer / pi_engine`` lies in ``[low, high]``.

    ``level="token"``: each token's own ratio (IcePop: a token the two sides disagree on is
    left out). ``level="geometric"``: the sequence's geometric-mean ratio, ``exp(mean over its
    loss tokens of log(pi_trainer / pi_engine))``, so a sequence is accepted or rejected whole;
    its length-normalised form suits long trajectories (the product of thousands of ratios is
    almost never near 1), and the band is tight. ``None`` bounds take `REJECTION_BOUNDS`.

    The caller multiplies the loss's token weights by the result: rejected tokens get no gradient
    and, like MIS's masked ones, still count in the loss's denominator (so a batch rejected whole
    is a step with zero gradient, not an empty batch). The comparison is in log space (``log
    rho`` clamped to ``[-20, 20]``). Metrics, as fractions of loss tokens:
    ``rejected_fraction``, ``rejected_high_fraction`` (ratio above ``high``) and
    ``rejected_low_fraction`` (below ``low``).
    """
    if level not in REJECTION_BOUNDS:
        raise ValueError(f"unknown rejection level {level!r} (token or geometric)")
    default_low, default_high = REJECTION_BOUNDS[level]
    low = default_low if low is None else low
    high = default_high if high is None else high
    if not 0 <= low <= 1 <= high or low == high:
        raise ValueError(
            f"rejection bounds need 0 <= low <= 1 <= high, low < high; got [{low}, {high}]"
        )
    d, on = _log_ratio(trainer_logprobs, engine_logprobs, loss_mask)  # (N, T)
    if level == "geometric":
        seq = d.sum(-1, keepdim=True) / on.sum(-1, keepdim=True).clamp(min=1)  # (N, 1)
        d = seq.expand_as(d)
    log_rho = d.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    too_high = on & (log_rho > math.log(high))
    too_low = on & (log_rho < (math.log(low) if low > 0 else -math.inf))
    accepted = on & ~too_high & ~too_low
    n = on.sum().clamp(min=1)
    metrics = {
        "rejected_fraction": (too_high | too_low).sum() / n,
        "rejected_high_fraction": too_high.sum() / n,
        "rejected_low_fraction": too_low.sum() / n,
    }
    return accepted, metrics


def staleness(versions: torch.Tensor, current_version: int) -> torch.Tensor:
    """Versions behind ``current_version``: ``(N, T)`` int64, 0 where ``versions`` is -1.

    ``versions`` ``(N, T)`` int64 is the weight version that produced each token, -1 on tokens the
    engine did not produce. Raises ``ValueError`` on a version newer than ``current_version`` (a
    token from weights the trainer has not made yet); that check reads the tensor on the host.
    """
    if versions.dim() != 2:
        raise ValueError(f"versions must be (N, T), got shape {tuple(versions.shape)}")
    versions = versions.long()
    if bool((versions > current_version).any()) or bool((versions < -1).any()):
        raise ValueError(
            f"versions must lie in [-1, {current_version}], got "
            f"[{int(versions.min())}, {int(versions.max())}]"
        )
    return torch.where(versions >= 0, current_version - versions, 0)


StalenessMode = Literal["drop", "mask", "importance"]


@dataclass(frozen=True)
class StalenessDecision:
    """What a staleness bound does to a batch.

    ``loss_mask`` ``(N, T)``: the mask to train with. ``keep`` ``(N,)`` bool: trajectories still
    in the batch (rows that are all 0 in ``loss_mask`` may also be removed by the caller).
    ``stale`` ``(N, T)`` bool: loss tokens beyond the bound in the *input* mask. ``metrics``:
    ``staleness_mean`` / ``staleness_max`` over loss tokens, ``stale_token_fraction``,
    ``dropped_trajectories``, ``masked_tokens``.
    """

    loss_mask: torch.Tensor
    keep: torch.Tensor
    stale: torch.Tensor
    metrics: dict[str, torch.Tensor]


def staleness_policy(
    versions: torch.Tensor,
    loss_mask: torch.Tensor,
    current_version: int,
    *,
    max_staleness: int,
    mode: StalenessMode = "drop",
) -> StalenessDecision:
    """Apply the bound ``max_staleness`` (versions behind the trainer) to a batch's loss tokens.

    A loss token is *stale* when ``current_version - version > max_staleness``; ``0`` means
    synchronous on-policy training (only tokens of the current weights are fresh). A partial
    rollout carries tokens of several versions; the bound applies per token, so its oldest token
    decides under ``"drop"``.

    * ``"drop"``: trajectories with any stale token are excluded (``keep`` False, mask all 0);
    * ``"mask"``: stale tokens get mask 0; the rest of their trajectory stays;
    * ``"importance"``: every token stays; correct the stale ones (``stale``) with
      `importance_weights` between the trainer and the engine, whose log-probs were computed by
      the weights that sampled the token.
    """
    check_aligned(versions, loss_mask)
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    on = loss_mask != 0
    lag = staleness(versions, current_version)  # (N, T) int64
    if bool((on & (versions < 0)).any()):
        raise ValueError("a loss token has version -1; loss tokens are the engine's, with versions")
    stale = on & (lag > max_staleness)  # (N, T)
    keep = torch.ones(on.shape[0], dtype=torch.bool, device=on.device)
    if mode == "drop":
        keep = ~stale.any(-1)
        new_on = on & keep[:, None]
    elif mode == "mask":
        new_on = on & ~stale
    elif mode == "importance":
        new_on = on
    else:
        raise ValueError(f"unknown staleness mode {mode!r}")
    lag_f = lag.float()
    metrics = {
        "staleness_mean": _masked_mean(lag_f, on),
        "staleness_max": _masked_max(lag_f, on),
        "stale_token_fraction": stale.sum() / on.sum().clamp(min=1),
        "dropped_trajectories": (~keep).sum(),
        "masked_tokens": (on & ~new_on).sum(),
    }
    return StalenessDecision(new_on.to(loss_mask.dtype), keep, stale, metrics)
