"""From completed GRPO groups to the sequences the trainer packs: advantages, staleness, metrics.

:func:`build_batch` takes the groups one step trains on and returns one column mapping per
trajectory that still has loss tokens (``input_ids``, ``loss_mask``, the engine's ``logprobs``, the
per-token weight ``versions`` and the trajectory's ``advantages``), ready for
:func:`agentrl.training.packing.pack_for_rank`, plus the batch's metrics.

* Advantages are computed per group over the trajectories that did not fail; a failed episode
  (``Trajectory.error``: an environment, engine or tokenization error) or one the environment could
  not judge (``Trajectory.infra_error``: its reward means nothing) is excluded from both the group
  statistics and the loss, and counted in ``episodes/errors`` or ``episodes/infra_errors``; the
  reward metrics (``reward/*``, ``env/NAME/reward_mean``) are over the judged episodes only. A
  group that failures left with fewer than two valid samples (out of two or more) is dropped or
  kept by ``AlgorithmConfig.small_groups`` and counted in ``batch/small_groups``.
* The staleness bound (:func:`agentrl.algorithms.off_policy.staleness_policy`) is applied per token;
  under ``drop`` a group with any stale token is dropped whole, so groups stay together. It is
  applied before the advantages, so that REINFORCE++'s batch whitening, which is over loss tokens
  (each trajectory weighs its loss-token count), covers exactly the tokens trained on.
* DAPO's overlong penalty (``AlgorithmConfig.overlong_buffer``, :func:`overlong_penalties`) is
  added to each reward before the advantages, by the episode's completion tokens (the engine's,
  summed over turns). :func:`group_has_signal` is the dynamic-sampling filter on those rewards
  (the loop draws the groups: :meth:`RolloutStream.next_groups_with_signal`).
* With ``algorithm.advantage=gae`` the advantages are per token and come from the critic in the
  training step (:mod:`agentrl.rl.critic`): each sequence carries its shaped reward on its
  last loss token (``token_rewards``) and a placeholder advantage of 0.
* Trailing tokens off the loss mask (the chat-template delta of a last environment message that
  no generation followed) are trimmed: nothing is scored after them.
* An episode whose history was rewritten (``Trajectory.earlier``: an agent's earlier segments)
  gives one sequence per segment, each with the episode's advantage (under GAE, each with the
  reward on its last loss token); its loss tokens count once each, in the advantage statistics
  that weigh tokens and in the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from agentrl.algorithms.advantages import OUTCOME_ADVANTAGES
from agentrl.algorithms.off_policy import staleness_policy
from agentrl.rl.critic import TOKEN_REWARDS
from agentrl.rl.objective import CRITIC_ADVANTAGE, AlgorithmConfig
from agentrl.rollout.stream import StreamConfig
from agentrl.rollout.trajectory import Trajectory


@dataclass
class TrainingBatch:
    """What one step trains on (identical on every rank) and what the batch looked like."""

    sequences: list[dict[str, Any]]
    """Per trajectory with loss tokens: ``input_ids``, ``loss_mask``, ``logprobs``, ``versions``
    (lists) and ``advantages`` (a float)."""
    metrics: dict[str, float]
    """``reward/*``, ``episodes/*``, ``response_length/*``, ``staleness/*``, ``batch/*``."""


def advantages_for(
    rewards: torch.Tensor, group_ids: torch.Tensor, kind: str, token_counts: torch.Tensor
) -> torch.Tensor:
    """Per-trajectory advantages ``(N,)`` float64 under ``AlgorithmConfig.advantage``.

    ``token_counts`` ``(N,)``: the loss tokens each trajectory trains on; REINFORCE++ whitens over
    them (a trajectory with none is left out of the statistics). GRPO's group statistics are
    per trajectory.
    """
    estimator = OUTCOME_ADVANTAGES.get(kind)
    if estimator is None:
        raise ValueError(
            f"unknown advantage estimator {kind!r}; registered: {sorted(OUTCOME_ADVANTAGES)}"
        )
    return estimator(rewards, group_ids, token_counts)


def overlong_penalties(
    lengths: torch.Tensor, max_tokens: int, buffer: int, factor: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment ``(N,)`` float64 for response ``lengths`` ``(N,)``: 0 up
    to ``max_tokens - buffer``, then falling linearly to ``-factor`` at ``max_tokens``, and
    ``-factor`` beyond. ``buffer`` 0: no penalty."""
    if buffer == 0:
        return torch.zeros(lengths.shape, dtype=torch.float64)
    excess = (lengths.to(torch.float64) - (max_tokens - buffer)).clamp(0, buffer)
    return -excess / buffer * factor


def shaped_rewards(
    trajectories: Sequence[Trajectory],
    algorithm: AlgorithmConfig,
    max_response_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards with the overlong penalty ``(N,)`` float64, and the penalties ``(N,)``.

    ``max_response_tokens``: the budget ``L_max`` when ``algorithm.overlong_max_tokens`` is
    unset (the trainer passes ``rollout.max_new_tokens``).
    """
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float64)
    if not algorithm.overlong_buffer:
        return rewards, torch.zeros_like(rewards)
    budget = algorithm.overlong_max_tokens or max_response_tokens
    if budget is None:
        raise ValueError("the overlong penalty needs a response budget (max_response_tokens)")
    lengths = torch.tensor([t.completion_tokens for t in trajectories], dtype=torch.int64)
    penalties = overlong_penalties(
        lengths, budget, algorithm.overlong_buffer, algorithm.overlong_penalty
    )
    return rewards + penalties, penalties


def group_has_signal(
    group: Sequence[Trajectory],
    algorithm: AlgorithmConfig,
    max_response_tokens: int | None = None,
) -> bool:
    """Whether the group's valid samples differ in (shaped) reward: a group-relative advantage
    is 0 for all of them otherwise (dynamic sampling filters such groups out)."""
    valid = [t for t in group if _valid(t)]
    if len(valid) < 2:
        return False
    rewards, _ = shaped_rewards(valid, algorithm, max_response_tokens)
    return bool((rewards != rewards[0]).any())


def build_batch(
    groups: Sequence[Sequence[Trajectory]],
    algorithm: AlgorithmConfig,
    stream: StreamConfig,
    current_version: int,
    *,
    max_response_tokens: int | None = None,
) -> TrainingBatch:
    """The sequences and metrics of one step (see the module docstring); ``max_response_tokens``
    is the overlong penalty's default budget (see :func:`shaped_rewards`)."""
    episodes = [t for group in groups for t in group]
    metrics = _episode_metrics(episodes, len(groups))
    small = 0
    ok: list[Trajectory] = []
    for group in groups:
        valid = [t for t in group if _valid(t)]
        if len(group) >= 2 and len(valid) < 2:
            small += 1
            if algorithm.small_groups == "drop":
                continue
        ok.extend(valid)
    metrics["batch/small_groups"] = float(small)
    if not ok:
        return TrainingBatch([], {**metrics, "batch/sequences": 0.0, "batch/loss_tokens": 0.0})
    # one row per sequence: a trajectory's earlier segments, then its tokens
    rows = [(i, tokens) for i, t in enumerate(ok) for tokens in [*t.earlier, t.tokens]]
    owner = torch.tensor([i for i, _ in rows], dtype=torch.int64)  # (R,) each row's trajectory
    masks = [torch.tensor(tokens.loss_mask, dtype=torch.int64) for _, tokens in rows]
    versions = [torch.tensor(tokens.versions, dtype=torch.int64) for _, tokens in rows]
    decision = staleness_policy(
        pad_sequence(versions, batch_first=True, padding_value=-1),
        pad_sequence(masks, batch_first=True),
        current_version,
        max_staleness=stream.max_staleness,
        mode=stream.staleness_mode,
    )
    loss_masks = decision.loss_mask
    if stream.staleness_mode == "drop":
        stale_groups = {
            ok[i].group
            for (i, _), keep in zip(rows, decision.keep.tolist(), strict=True)
            if not keep
        }
        in_stale_group = torch.tensor([ok[i].group in stale_groups for i, _ in rows])
        loss_masks = loss_masks * (~in_stale_group)[:, None]
        metrics["staleness/dropped_groups"] = float(len(stale_groups))
    for name, value in decision.metrics.items():
        metrics[f"staleness/{name}"] = float(value)
    rewards, penalties = shaped_rewards(ok, algorithm, max_response_tokens)
    if algorithm.overlong_buffer:
        metrics["reward/overlong_penalty_mean"] = float(penalties.mean())
        metrics["reward/overlong_fraction"] = float((penalties < 0).to(torch.float64).mean())
    group_ids = torch.tensor([t.group for t in ok], dtype=torch.int64)
    # (N,) what each trajectory trains on after staleness, over all its rows
    per_row = loss_masks.sum(-1).to(torch.int64)
    token_counts = torch.zeros(len(ok), dtype=torch.int64).index_add_(0, owner, per_row)
    critic = (
        algorithm.advantage == CRITIC_ADVANTAGE
    )  # per-token advantages come later, from the critic
    if critic:
        advantages = torch.zeros_like(rewards)
    else:
        advantages = advantages_for(rewards, group_ids, algorithm.advantage, token_counts)

    sequences: list[dict[str, Any]] = []
    for row, (i, tokens) in enumerate(rows):
        mask = loss_masks[row, : len(tokens)].tolist()
        if not any(mask):
            continue
        end = max(j for j, m in enumerate(mask) if m) + 1  # trim trailing tokens off the mask
        sequence = {
            "input_ids": tokens.input_ids[:end],
            "loss_mask": mask[:end],
            "logprobs": tokens.logprobs[:end],
            "versions": tokens.versions[:end],
            "advantages": float(advantages[i]),
        }
        if critic:  # the (shaped) reward on the last loss token (of each segment), for the GAE
            sequence[TOKEN_REWARDS] = [0.0] * (end - 1) + [float(rewards[i])]
        sequences.append(sequence)
    if not critic:
        trained = advantages[token_counts > 0]  # (n,) the trajectories trained on
        metrics.update(
            {
                "advantage/mean": float(trained.mean()) if trained.numel() else 0.0,
                "advantage/abs_mean": float(trained.abs().mean()) if trained.numel() else 0.0,
                "batch/zero_advantage_groups": float(_zero_advantage_groups(ok, advantages)),
            }
        )
    metrics.update(
        {
            "batch/sequences": float(len(sequences)),
            "batch/loss_tokens": float(sum(sum(s["loss_mask"]) for s in sequences)),
            "batch/tokens": float(sum(len(s["input_ids"]) for s in sequences)),
        }
    )
    return TrainingBatch(sequences, metrics)


def _by_environment(episodes: Sequence[Trajectory]) -> dict[str, list[Trajectory]]:
    """Episodes by environment name (the env id without its namespace), in name order."""
    named: dict[str, list[Trajectory]] = {}
    for t in episodes:
        named.setdefault(t.env_id.rsplit("/", 1)[-1] or "env", []).append(t)
    return dict(sorted(named.items()))


def _valid(trajectory: Trajectory) -> bool:
    """Judged and free of errors, with tokens to train on."""
    return (
        trajectory.error is None and trajectory.infra_error is None and len(trajectory.tokens) > 0
    )


def _zero_advantage_groups(ok: Sequence[Trajectory], advantages: torch.Tensor) -> int:
    by_group: dict[int, list[float]] = {}
    for trajectory, advantage in zip(ok, advantages.tolist(), strict=True):
        by_group.setdefault(trajectory.group, []).append(advantage)
    return sum(all(a == 0 for a in values) for values in by_group.values())


def _episode_metrics(episodes: Sequence[Trajectory], groups: int) -> dict[str, float]:
    n = max(len(episodes), 1)
    # Reward statistics over the judged episodes: an error or an infrastructure fault is no
    # verdict (counted apart in episodes/errors and episodes/infra_errors).
    judged = [t for t in episodes if t.judged]
    rewards = torch.tensor([t.reward for t in judged] or [float("nan")], dtype=torch.float64)
    lengths = torch.tensor([t.completion_tokens for t in episodes] or [0], dtype=torch.float64)
    metrics = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(judged) > 1 else 0.0,
        "reward/max": float(rewards.max()),
        "episodes/count": float(len(episodes)),
        "episodes/judged": float(len(judged)),
        "episodes/groups": float(groups),
        "episodes/errors": float(sum(t.error is not None for t in episodes)),
        "episodes/infra_errors": float(
            sum(t.infra_error is not None and t.error is None for t in episodes)
        ),
        "episodes/truncated": float(sum(t.truncated for t in episodes)) / n,
        "episodes/turns_mean": sum(len(t.turns) for t in episodes) / n,
        "episodes/tool_calls_mean": sum(t.tool_calls for t in episodes) / n,
        "episodes/tool_use_fraction": sum(t.tool_calls > 0 for t in episodes) / n,
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        # token seams re-encoded by TrajectoryBuilder(seams="reencode"): ids that differ from what
        # the engine was fed, and engine-sampled ids whose loss was dropped there
        "mismatch/seam_edits": float(sum(len(t.tokens.seams) for t in episodes)),
        "mismatch/seam_engine_tokens": float(
            sum(e.engine_tokens for t in episodes for e in t.tokens.seams)
        ),
        "response_length/clip_fraction": sum(
            bool(t.turns) and t.turns[-1].finish_reason == "length" for t in episodes
        )
        / n,
    }
    for name, own in _by_environment(episodes).items():
        n_own = len(own)
        metrics[f"env/{name}/episodes"] = float(n_own)
        own_judged = [t.reward for t in own if t.judged]
        metrics[f"env/{name}/reward_mean"] = (
            sum(own_judged) / len(own_judged) if own_judged else float("nan")
        )
        metrics[f"env/{name}/turns_mean"] = sum(len(t.turns) for t in own) / n_own
        metrics[f"env/{name}/errors"] = float(sum(t.error is not None for t in own))
        metrics[f"env/{name}/infra_errors"] = float(
            sum(t.infra_error is not None and t.error is None for t in own)
        )
    components = sorted({key for t in episodes for key in t.reward_components})
    for key in components:
        values = [t.reward_components.get(key, 0.0) for t in judged]
        metrics[f"reward/{key}"] = sum(values) / len(values) if values else float("nan")
    return metrics
