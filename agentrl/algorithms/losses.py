"""Policy-gradient losses (PPO-clip with dual-clip, DAPO clip-higher, GSPO, CISPO), the critic's
clipped value loss, their aggregation, KL and entropy.

All tensors are token-aligned ``(N, T)``: entry ``[i, t]`` of ``logprobs``, ``old_logprobs``,
``advantages`` and ``loss_mask`` refers to the same token of trajectory ``i``. The caller aligns
them (`agentrl.training.logprobs.token_logprobs` scores ``input_ids[:, 1:]``).

**Aggregation and micro-batches.** A loss is ``numerator / denominator``. The numerator is a sum
over trajectories, so it splits over micro-batches and ranks; the denominator must be that of the
*whole* batch. `loss_denominator` gives a piece's denominator, and denominators add up: compute
``D = sum of loss_denominator(piece)`` over every micro-batch on every rank (an all-reduce), pass
``denominator=D`` to each piece, and the sum of the pieces' losses (and of their gradients) is the
loss of the whole batch. Data-parallel wrappers that *average* gradients over ``W`` ranks need the
loss multiplied by ``W``. ``denominator=1`` returns the numerator itself: the ``(loss_sum,
denominator)`` pair of `agentrl.training.actor`'s ``loss_fn`` is ``(policy_loss(...,
denominator=1)[0], loss_denominator(mask, agg))``.

Modes (``L[i, t]`` the per-token loss, ``m`` the mask, ``|o_i|`` the trajectory's loss-token
count; only trajectories with ``|o_i| > 0`` count as sequences):

=========================  ===========================================  =========================
``agg``                    numerator                                    denominator
=========================  ===========================================  =========================
token-mean                 ``sum_{i,t} m L``                            number of loss tokens
seq-mean-token-sum         ``sum_{i,t} m L``                            number of sequences
seq-mean-token-mean        ``sum_i (sum_t m L) / |o_i|``                number of sequences
seq-mean-token-sum-norm    ``sum_{i,t} m L``                            sequences * norm_length
=========================  ===========================================  =========================

``seq-mean-token-sum-norm`` is Dr.GRPO's: ``norm_length`` is a constant (the generation budget),
never the padded width of one micro-batch, so it is required.

**Off-policy.** ``old_logprobs`` are those of the policy the ratio is taken against. Either the
engine's log-probs (the ratio then absorbs the train/inference gap and staleness), or the
trainer's recomputation before the update, with `agentrl.algorithms.off_policy.importance_weights`
passed as ``token_weights`` to correct from the engine's to the trainer's distribution (AReaL's
decoupled PPO, TIS/MIS). ``token_weights`` are multiplied into the per-token loss without gradient.

Metrics are detached 0-dim tensors (no host sync), masked means over this call's tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
KLEstimator = Literal["k1", "k2", "k3"]
PolicyLossKind = str
"""A name in :data:`POLICY_LOSSES`."""

# exp() of a log-ratio beyond this is inf in float32 long before it means anything (verl clamps
# to the same range).
MAX_LOG_RATIO = 20.0
# The k3 penalty per token (>= 0) is clamped at KL_CLAMP, as verl's "low_var_kl" is to [-10, 10]:
# one token the reference finds absurd must not dominate the loss; beyond it it has no gradient.
KL_CLAMP = 10.0


def check_aligned(*tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless every tensor is (N, T) of one shape."""
    shape = tensors[0].shape
    if len(shape) != 2 or any(t.shape != shape for t in tensors):
        raise ValueError(
            f"expected (N, T) tensors of one shape, got {[tuple(t.shape) for t in tensors]}"
        )


def loss_denominator(
    loss_mask: torch.Tensor, agg: Aggregation, *, norm_length: int | None = None
) -> torch.Tensor:
    """The denominator ``agg`` divides by for this ``(N, T)`` mask: a 0-dim float64 tensor.

    Additive over trajectories: the whole batch's denominator is the sum of its pieces'. (float64:
    token counts stay exact far beyond float32's 2^24.)
    """
    on = loss_mask != 0  # (N, T)
    if agg == "token-mean":
        return on.sum().double()
    sequences = on.any(-1).sum().double()
    if agg in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return sequences
    if agg == "seq-mean-token-sum-norm":
        if norm_length is None or norm_length <= 0:
            raise ValueError("agg='seq-mean-token-sum-norm' needs a positive norm_length")
        return sequences * norm_length
    raise ValueError(f"unknown aggregation {agg!r}")


def aggregate(
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    agg: Aggregation,
    *,
    norm_length: int | None = None,
    denominator: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values`` ``(N, T)`` to a scalar under ``loss_mask`` ``(N, T)``.

    ``denominator`` defaults to `loss_denominator` of this mask (one batch, no splitting); pass the
    whole batch's when this is one micro-batch of it. A zero denominator (nothing to train on)
    gives 0, with a graph, instead of NaN.
    """
    check_aligned(values, loss_mask)
    on = loss_mask != 0  # (N, T) bool
    if denominator is None:
        denominator = loss_denominator(loss_mask, agg, norm_length=norm_length)
    elif agg == "seq-mean-token-sum-norm" and norm_length is None:
        loss_denominator(loss_mask, agg)  # raises: the mode needs norm_length even so
    # where, not a product: NaN or inf at padding must not leak into the sum (or its gradient).
    masked = torch.where(on, values, 0.0)  # (N, T)
    if agg == "seq-mean-token-mean":
        numerator = (masked.sum(-1) / on.sum(-1).clamp(min=1)).sum()
    elif agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        numerator = masked.sum()
    else:
        raise ValueError(f"unknown aggregation {agg!r}")
    denominator = torch.as_tensor(denominator, dtype=values.dtype, device=values.device)
    return numerator / torch.where(denominator > 0, denominator, torch.ones_like(denominator))


def _masked_mean(values: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    return torch.where(on, values, 0.0).sum() / on.sum().clamp(min=1)


def _masked_extreme(values: torch.Tensor, on: torch.Tensor, largest: bool) -> torch.Tensor:
    """Max (or min) of ``values`` where ``on``; 0 when nothing is on. No host sync."""
    if values.numel() == 0:
        return values.new_zeros(())
    fill = -torch.inf if largest else torch.inf
    picked = torch.where(on, values, fill)
    extreme = picked.amax() if largest else picked.amin()
    return torch.where(on.any(), extreme, 0.0)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    kind: PolicyLossKind = "ppo",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    agg: Aggregation = "token-mean",
    norm_length: int | None = None,
    denominator: torch.Tensor | float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss (to minimise) and its metrics. All inputs ``(N, T)``.

    ``kind="ppo"``: token ratio ``rho = exp(logprobs - old_logprobs)``, per-token loss
    ``L = max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high))``. ``clip_high > clip_low`` is
    DAPO's clip-higher ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale", Yu et al.
    2025; ``clip_high=0.28``). Dual-clip ("Mastering Complex Control in MOBA Games with Deep
    Reinforcement Learning", Ye et al. 2020; verl's ``clip_ratio_c``): for ``A < 0`` the loss is
    ``min(L, -A clip_ratio_c)``, so a token whose ratio grew past ``clip_ratio_c`` (> 1) while its
    advantage says to lower it has a bounded loss and no gradient; ``None`` turns it off.

    ``kind="gspo"`` ("Group Sequence Policy Optimization", Zheng et al. 2025): the ratio is the
    sequence's, ``s_i = exp(mean over its loss tokens of (logprobs - old_logprobs))``, clipped at
    the sequence level, so a sequence is clipped as a whole. Gradients reach every token through
    GSPO-token's ``s_i,t = sg[s_i] * exp(logprobs_t - sg[logprobs_t])``, equal to ``s_i`` in value;
    with sequence-constant advantages and ``agg="seq-mean-token-mean"`` (the paper's) the gradient
    is exactly GSPO's. The paper's clip ranges are far smaller than PPO's (3e-4 / 4e-4). No
    dual-clip.

    ``kind="cispo"`` ("MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention", MiniMax 2025): ``L = -sg(clip(rho, 1 - clip_low, 1 + clip_high)) A logprobs``.
    The importance weight is clipped and detached, and every token keeps the gradient of its
    log-prob (PPO drops the gradient of clipped tokens). ``clip_low = 1`` sets no lower bound (the
    paper's choice); ``clip_ratio_c`` does not apply.

    ``advantages`` and ``old_logprobs`` get no gradient. Metrics: ``clip_fraction`` (loss tokens
    whose clipped branch is active; CISPO: whose weight is clipped), ``clip_low_fraction`` /
    ``clip_high_fraction`` (clipped because ``rho < 1 - clip_low`` with ``A < 0``, or ``rho > 1 +
    clip_high`` with ``A > 0``; CISPO: whatever the sign of ``A``), ``clip_dual_fraction`` (loss
    tokens bounded by the dual-clip), ``ratio_mean``, ``ratio_max``, ``ratio_min`` (over loss
    tokens; GSPO: the sequence ratio at each token) and ``approx_kl`` (k3 estimate of KL(old ||
    new)).
    """
    check_aligned(logprobs, old_logprobs, advantages, loss_mask)
    rule = POLICY_LOSSES.get(kind)
    if rule is None:
        raise ValueError(f"unknown policy loss kind {kind!r}; registered: {sorted(POLICY_LOSSES)}")
    low_ok = 0 <= clip_low <= 1 if rule.clip_low_may_be_1 else 0 <= clip_low < 1
    if not low_ok or clip_high < 0:
        raise ValueError(
            f"need 0 <= clip_low < 1 (<= 1 for cispo) and clip_high >= 0, got {clip_low}, "
            f"{clip_high}"
        )
    if clip_ratio_c is not None and not clip_ratio_c > 1:
        raise ValueError(f"clip_ratio_c must be > 1 (or None), got {clip_ratio_c}")
    on = loss_mask != 0  # (N, T) bool
    advantages = advantages.detach()
    log_ratio = torch.where(on, logprobs - old_logprobs.detach(), 0.0)  # (N, T)
    ratio = rule.ratio(log_ratio, logprobs, on)  # (N, T)
    clipped_ratio = ratio.clamp(1 - clip_low, 1 + clip_high)
    per_token, clipped, dual = rule.per_token(
        ratio, clipped_ratio, advantages, torch.where(on, logprobs, 0.0), clip_ratio_c
    )
    if token_weights is not None:
        check_aligned(per_token, token_weights)
        per_token = per_token * token_weights.detach()
    loss = aggregate(per_token, loss_mask, agg, norm_length=norm_length, denominator=denominator)

    with torch.no_grad():
        ratio, log_ratio = ratio.detach(), log_ratio.detach()
        high = ratio > 1 + clip_high
        low = ratio < 1 - clip_low
        if rule.clips_against_advantage:  # PPO and GSPO clip only against A's direction
            high, low = high & (advantages > 0), low & (advantages < 0)
        k3 = torch.expm1(log_ratio.clamp(max=MAX_LOG_RATIO)) - log_ratio
        metrics = {
            "clip_fraction": _masked_mean(clipped.float(), on),
            "clip_high_fraction": _masked_mean(high.float(), on),
            "clip_low_fraction": _masked_mean(low.float(), on),
            "clip_dual_fraction": _masked_mean(dual.float(), on),
            "ratio_mean": _masked_mean(ratio, on),
            "ratio_max": _masked_extreme(ratio, on, largest=True),
            "ratio_min": _masked_extreme(ratio, on, largest=False),
            "approx_kl": _masked_mean(k3, on),
        }
    return loss, metrics


def _token_ratio(log_ratio: torch.Tensor, logprobs: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """PPO's and CISPO's ratio ``(N, T)``: each token's own."""
    return log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()


def _sequence_ratio(
    log_ratio: torch.Tensor, logprobs: torch.Tensor, on: torch.Tensor
) -> torch.Tensor:
    """GSPO-token's ratio ``(N, T)``: the sequence's ``s_i`` in value, each token's gradient."""
    lengths = on.sum(-1, keepdim=True).clamp(min=1)  # (N, 1)
    seq_log_ratio = log_ratio.sum(-1, keepdim=True).detach() / lengths  # (N, 1)
    token_log_ratio = torch.where(on, seq_log_ratio + logprobs - logprobs.detach(), 0.0)
    return token_log_ratio.clamp(max=MAX_LOG_RATIO).exp()


def _clipped_surrogate(dual_clip: bool) -> PerTokenLoss:
    """PPO-clip's per-token loss (GSPO's too, on its sequence ratio), with the dual-clip when
    ``dual_clip`` and ``clip_ratio_c`` is given."""

    def per_token(
        ratio: torch.Tensor,
        clipped_ratio: torch.Tensor,
        advantages: torch.Tensor,
        logprobs: torch.Tensor,
        clip_ratio_c: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        unclipped_loss = -advantages * ratio  # (N, T)
        clipped_loss = -advantages * clipped_ratio
        loss = torch.maximum(unclipped_loss, clipped_loss)  # (N, T)
        dual = torch.zeros_like(loss, dtype=torch.bool)
        if dual_clip and clip_ratio_c is not None:
            bound = -advantages * clip_ratio_c  # (N, T)
            dual = (advantages < 0) & (loss > bound)
            loss = torch.where(dual, bound, loss)
        return loss, clipped_loss > unclipped_loss, dual

    return per_token


def _cispo_loss(
    ratio: torch.Tensor,
    clipped_ratio: torch.Tensor,
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    clip_ratio_c: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO's per-token loss: the clipped weight detached, every token's log-prob gradient kept
    (``logprobs`` is 0 off the loss mask: garbage at padding reaches neither loss nor gradient)."""
    loss = -clipped_ratio.detach() * advantages * logprobs
    clipped = clipped_ratio.detach() != ratio.detach()  # (N, T)
    return loss, clipped, torch.zeros_like(clipped)


Ratio = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``(log_ratio, logprobs, on) -> ratio``, all ``(N, T)``; ``log_ratio`` is 0 off the mask."""
PerTokenLoss = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float | None],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor],
]
"""``(ratio, clipped_ratio, advantages, logprobs, clip_ratio_c) -> (loss, clipped, dual)``,
``(N, T)`` each: the per-token loss, where the clipped branch is active, where the dual-clip
bounds it."""


@dataclass(frozen=True)
class PolicyLossRule:
    """One kind of :func:`policy_loss`: its ratio, its per-token loss, and how it clips."""

    ratio: Ratio
    per_token: PerTokenLoss
    clip_low_may_be_1: bool = False
    """Whether ``clip_low = 1`` (no lower bound) is allowed: a weight may go to 0, a PPO ratio not."""
    clips_against_advantage: bool = True
    """Whether a ratio counts as clipped only against the advantage's direction (the metrics)."""

    @property
    def token_ratio(self) -> bool:
        """Whether each token's ratio is its own (not its whole sequence's, as GSPO's)."""
        return self.ratio is _token_ratio


POLICY_LOSSES: dict[str, PolicyLossRule] = {
    "ppo": PolicyLossRule(_token_ratio, _clipped_surrogate(dual_clip=True)),
    "gspo": PolicyLossRule(_sequence_ratio, _clipped_surrogate(dual_clip=False)),
    "cispo": PolicyLossRule(
        _token_ratio, _cispo_loss, clip_low_may_be_1=True, clips_against_advantage=False
    ),
}
"""The policy losses by name (``algorithm.loss`` takes these): a new one is a ratio and a
per-token loss, one entry here, and its test in tests/algorithms/test_losses.py."""


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip: float | None = 0.5,
    agg: Aggregation = "token-mean",
    norm_length: int | None = None,
    denominator: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss (to minimise) and its metrics. All inputs ``(N, T)``.

    ``values`` are the critic's current predictions at each loss token (with gradient),
    ``old_values`` its predictions when the batch's advantages were computed, ``returns`` the
    GAE targets. Per token, ``0.5 * max((V - R)^2, (clip(V, V_old - clip, V_old + clip) - R)^2)``
    (PPO2's value clipping, as verl's ``compute_value_loss`` and TRL's): a prediction may not
    move more than ``clip`` away from the old one to lower its loss. ``clip=None`` gives the
    plain ``0.5 * (V - R)^2``. Reduced by ``agg`` as the policy loss is (see the module doc).

    Metrics: ``clip_fraction`` (loss tokens where the clipped term is the larger),
    ``values_mean`` and ``error_mean`` (``V - R``), masked means over this call's tokens.
    """
    check_aligned(values, old_values, returns, loss_mask)
    if clip is not None and not clip > 0:
        raise ValueError(f"the value clip must be > 0 (or None), got {clip}")
    on = loss_mask != 0  # (N, T)
    returns, old_values = returns.detach(), old_values.detach()
    unclipped = (values - returns).square()  # (N, T)
    if clip is None:
        per_token = unclipped
        clipped = torch.zeros_like(on)
    else:
        moved = torch.maximum(torch.minimum(values, old_values + clip), old_values - clip)
        clipped_loss = (moved - returns).square()
        per_token = torch.maximum(unclipped, clipped_loss)
        clipped = clipped_loss > unclipped
    loss = 0.5 * aggregate(
        per_token, loss_mask, agg, norm_length=norm_length, denominator=denominator
    )
    with torch.no_grad():
        metrics = {
            "clip_fraction": _masked_mean(clipped.float(), on),
            "values_mean": _masked_mean(values.detach(), on),
            "error_mean": _masked_mean(values.detach() - returns, on),
        }
    return loss, metrics


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLEstimator = "k3"
) -> torch.Tensor:
    """Per-token estimate ``(N, T)`` of KL(policy || reference) at tokens sampled from the policy.

    Schulman's estimators ("Approximating KL Divergence", 2020), with ``r = ref_logprobs -
    logprobs``: ``k1 = -r`` (unbiased, can be negative), ``k2 = r^2 / 2`` (biased, >= 0, accurate
    when the two are close), ``k3 = exp(r) - 1 - r`` (unbiased, >= 0; GRPO's choice), clamped at
    ``KL_CLAMP`` = 10 as verl's ``low_var_kl`` is (a token beyond it adds 10 and no gradient; the
    unbiasedness below holds where no token reaches it). As values,
    E[k1] = E[k3] = KL(policy || ref). As *loss terms* differentiated through ``logprobs`` they
    differ: E[grad k1] = 0, E[grad k2] = grad KL(policy || ref) and E[grad k3] = grad KL(ref ||
    policy) (the forward KL; "On a few pitfalls in KL divergence gradient estimation for RL",
    Tang and Munos 2025). ``ref_logprobs`` gets no gradient; reduce with `aggregate`.
    """
    check_aligned(logprobs, ref_logprobs)
    r = ref_logprobs.detach() - logprobs  # (N, T)
    if kind == "k1":
        return -r
    if kind == "k2":
        return 0.5 * r.square()
    if kind == "k3":
        # expm1 keeps k3 accurate and >= 0 when r is tiny; the clamp keeps exp finite.
        r = r.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        return (torch.expm1(r) - r).clamp(0, KL_CLAMP)
    raise ValueError(f"unknown KL estimator {kind!r}")


def entropy_from_logits(
    logits: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = 1024
) -> torch.Tensor:
    """Entropy ``(N, T)`` float32 of ``softmax(logits / temperature)``; ``logits`` ``(N, T, V)``.

    Pass the sampling temperature to get the entropy of the distribution tokens were sampled
    from (the one the log-probs refer to), not of the model's raw softmax.

    Computed ``chunk_size`` positions at a time in float32, so the float32 copy of a bf16 vocab-wide
    tensor is never materialised for all ``T`` at once. Under ``torch.no_grad`` (logging) that
    bounds the extra memory to ``(N, chunk_size, V)``; with grad enabled each chunk's activations are
    kept for backward as usual.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be (N, T, V), got shape {tuple(logits.shape)}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    parts = []
    for start in range(0, logits.shape[1], chunk_size):
        chunk = logits[:, start : start + chunk_size].float() / temperature  # (N, C, V)
        log_p = torch.log_softmax(chunk, dim=-1)
        # -inf logits (a masked vocabulary) have p = 0 and contribute 0, not 0 * -inf = NaN.
        finite_log_p = log_p.clamp(min=torch.finfo(log_p.dtype).min)
        parts.append(-(log_p.exp() * finite_log_p).sum(-1))  # (N, C)
    if not parts:
        return logits.new_zeros(logits.shape[:2], dtype=torch.float32)
    return torch.cat(parts, dim=1)
