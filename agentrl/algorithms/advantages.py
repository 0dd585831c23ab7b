"""Critic-free advantages from outcome rewards: GRPO, Dr.GRPO and REINFORCE++.

Every estimator here maps one scalar reward per trajectory to one advantage per trajectory
(``(N,)``); `broadcast_to_tokens` spreads it over the trajectory's loss tokens. Trajectories that
answer the same prompt share a *group id* (any int64 values, in any order; groups need not be
contiguous). Token-level rewards and critics are `agentrl.algorithms.gae`'s business.

Estimators (the names the papers use):

* **GRPO** ("DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
  Shao et al. 2024): ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` within each group ``g``, with
  the unbiased (Bessel-corrected) standard deviation, as TRL and verl compute it.
* **Dr.GRPO** ("Understanding R1-Zero-Like Training: A Critical Perspective", Liu et al. 2025):
  ``A_i = r_i - mean_g(r)``; no division by the group's std, which over-weights groups whose
  rewards barely vary. Its other half, no per-sequence length normalisation, is the loss
  aggregation ``"seq-mean-token-sum-norm"`` in `agentrl.algorithms.losses`.
* **REINFORCE++** ("REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
  Models", Hu 2025), with outcome rewards and ``gamma = 1``: the return of every token is the
  trajectory's reward, and advantages are whitened over the whole batch (mean 0, std 1). The
  paper's **REINFORCE++-baseline** first subtracts the group's mean reward, then whitens over the
  batch. Both are `reinforce_pp_advantages` (``group_ids`` given or not). The paper folds a
  per-token KL penalty into the reward; here the KL term belongs in the loss
  (`agentrl.algorithms.losses.kl_penalty`), as in GRPO.

Singleton groups get advantage 0 under GRPO and Dr.GRPO (the reward is its own baseline); groups
whose rewards are all equal get 0 as well, never NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _group_index(group_ids: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """Dense group index ``(N,)`` int64 in ``[0, G)`` and ``G``, for arbitrary group ids."""
    if group_ids.shape != (n,):
        raise ValueError(f"group_ids has shape {tuple(group_ids.shape)}, expected ({n},)")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    unique, index = torch.unique(group_ids, return_inverse=True)
    return index, unique.numel()


def _group_sum(values: torch.Tensor, index: torch.Tensor, groups: int) -> torch.Tensor:
    """Per-group sums ``(G,)`` of ``values`` ``(N,)``."""
    return torch.zeros(groups, dtype=values.dtype, device=values.device).index_add_(
        0, index, values
    )


def _check_rewards(rewards: torch.Tensor) -> torch.Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (N,), got shape {tuple(rewards.shape)}")
    # Statistics in float64 (N is small); results in float32, or float64 for float64 rewards.
    return rewards.double()


def _out_dtype(rewards: torch.Tensor) -> torch.dtype:
    return torch.float64 if rewards.dtype == torch.float64 else torch.float32


def _centered(x: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``x - group mean``, float64, exactly 0 in groups whose values are all equal."""
    index, groups = _group_index(group_ids, x.numel())
    counts = _group_sum(torch.ones_like(x), index, groups)  # (G,)
    means = _group_sum(x, index, groups) / counts  # (G,)
    lo = x.new_full((groups,), torch.inf).scatter_reduce(0, index, x, "amin")
    hi = x.new_full((groups,), -torch.inf).scatter_reduce(0, index, x, "amax")
    return torch.where((lo == hi)[index], 0.0, x - means[index])


def group_centered(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``r_i - mean of r over i's group``: ``(N,)`` float. The Dr.GRPO advantage.

    Exactly 0 for a group whose rewards are all equal (a rounded mean would leave ~1 ulp, which
    GRPO's division by the group std would blow up).
    """
    return _centered(_check_rewards(rewards), group_ids).to(_out_dtype(rewards))


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO advantages ``(N,)`` from rewards ``(N,)`` and group ids ``(N,)`` int64.

    ``scale_by_std=True``: ``(r - group mean) / (group std + eps)`` (GRPO, unbiased std; a group of
    one has std 0 here, and advantage 0). ``scale_by_std=False``: ``r - group mean`` (Dr.GRPO).
    """
    x = _centered(_check_rewards(rewards), group_ids)  # (N,) float64
    if not scale_by_std:
        return x.to(_out_dtype(rewards))
    index, groups = _group_index(group_ids, x.numel())
    counts = _group_sum(torch.ones_like(x), index, groups)  # (G,)
    sq = _group_sum(x.square(), index, groups)  # (G,)
    std = (sq / (counts - 1).clamp(min=1)).sqrt()  # (G,) unbiased; singleton groups: 0
    return (x / (std[index] + eps)).to(_out_dtype(rewards))


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    *,
    token_counts: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """REINFORCE++ advantages ``(N,)``: batch-whitened rewards, optionally group-centred first.

    ``group_ids`` ``(N,)`` int64 given: REINFORCE++-baseline, ``x = r - group mean``; otherwise
    ``x = r``. Then ``A = (x - mean(x)) / (std(x) + eps)`` over the batch, with the population std.

    The papers (and OpenRLHF) whiten over *tokens*: every token carries its trajectory's value, so
    long trajectories weigh more in the mean and std. Pass ``token_counts`` ``(N,)`` (loss tokens
    per trajectory, e.g. ``loss_mask.sum(-1)``) to weight each trajectory by its count, which gives
    exactly that; without it every trajectory weighs the same. Trajectories with count 0 do not
    enter the statistics. For a whitening consistent across data-parallel ranks, pass the
    whole batch, not one rank's share.
    """
    x = _check_rewards(rewards)
    if group_ids is not None:
        x = _centered(x, group_ids)  # (N,) float64
    if token_counts is None:
        weights = torch.ones_like(x)
    else:
        if token_counts.shape != x.shape:
            raise ValueError(
                f"token_counts has shape {tuple(token_counts.shape)}, expected {tuple(x.shape)}"
            )
        weights = token_counts.to(x.dtype)
    total = weights.sum().clamp(min=1)
    mean = (weights * x).sum() / total
    std = ((weights * (x - mean).square()).sum() / total).sqrt()
    return ((x - mean) / (std + eps)).to(_out_dtype(rewards))


def broadcast_to_tokens(seq_advantages: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Per-trajectory advantages ``(N,)`` on every loss token: ``(N, T)``, 0 where the mask is 0."""
    if seq_advantages.dim() != 1 or loss_mask.dim() != 2:
        raise ValueError(
            f"expected (N,) advantages and an (N, T) mask, got {tuple(seq_advantages.shape)} "
            f"and {tuple(loss_mask.shape)}"
        )
    if seq_advantages.shape[0] != loss_mask.shape[0]:
        raise ValueError(
            f"{seq_advantages.shape[0]} advantages for {loss_mask.shape[0]} trajectories"
        )
    return seq_advantages[:, None] * loss_mask.to(seq_advantages.dtype)


OutcomeAdvantage = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``(rewards (N,), group_ids (N,), token_counts (N,)) -> advantages (N,)``: one advantage per
trajectory from its outcome reward; ``token_counts`` are the loss tokens each trains on."""

OUTCOME_ADVANTAGES: dict[str, OutcomeAdvantage] = {
    "grpo": lambda rewards, groups, _tokens: grpo_advantages(rewards, groups),
    "dr_grpo": lambda rewards, groups, _tokens: grpo_advantages(
        rewards, groups, scale_by_std=False
    ),
    "reinforce_pp": lambda rewards, _groups, tokens: reinforce_pp_advantages(
        rewards, token_counts=tokens
    ),
    "reinforce_pp_baseline": lambda rewards, groups, tokens: reinforce_pp_advantages(
        rewards, groups, token_counts=tokens
    ),
}
"""The outcome-reward advantage estimators by name (``algorithm.advantage`` takes these, and
``gae``, the critic's per-token advantages of :mod:`agentrl.algorithms.gae`): a new estimator is a
function above, one entry here, and its test in tests/algorithms/test_advantages.py."""
