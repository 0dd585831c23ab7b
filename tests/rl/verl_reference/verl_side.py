"""verl's side of the reference check: verl 0.9.1's own functions on the batches it is given.

Run by the verl venv's interpreter (``.venv-verl/bin/python``, made by ``bench/setup_verl_env.sh``)
as ``verl_side.py INPUT OUTPUT``; ``tests/rl/test_verl_reference.py`` writes INPUT (a list of
cases, float64 tensors, with ``torch.save``) and compares OUTPUT with agentrl. It imports only
torch, numpy and verl, never agentrl. Where verl states a bound differently, the translation is
here, next to the call:

* rejection: verl's ``token_k1`` / ``seq_mean_k1`` statistic is ``-log ratio`` (per token, or its
  mean over the sequence), kept inside ``[log lower, log upper]``; a ratio band ``[low, high]`` is
  therefore verl's ``"{1/high}_{1/low}"``;
* MIS with bounds ``[lower, cap]`` is verl's IcePop spec ``"{lower}_{cap}"``; TIS is ``cap``;
* dual-clip is ``clip_ratio_c``; Dr.GRPO's constant length is ``loss_scale_factor``;
* the value loss and GAE take the case's numbers as values: ``logprobs`` as predictions, ``old`` as
  old values, ``advantages`` as returns; the GAE's rewards sit on each row's last loss token.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import (
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)
from verl.workers.config import ActorConfig

AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def loss_and_grad(name, case, config, agg):
    """verl's policy loss ``name`` and its gradient with respect to the log-probs."""
    logprobs = case["logprobs"].clone().requires_grad_()
    loss, _ = core_algos.get_policy_loss_fn(name)(
        old_log_prob=case["old"],
        log_prob=logprobs,
        advantages=case["advantages"],
        response_mask=case["mask"],
        loss_agg_mode=agg,
        config=config,
        rollout_is_weights=case["weights"],
    )
    loss.backward()
    return loss.detach(), logprobs.grad


def run(case):
    """Every quantity the test compares, computed by verl."""
    p = case["params"]
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size=2,
        clip_ratio=p["clip_low"],
        clip_ratio_low=p["clip_low"],
        clip_ratio_high=p["clip_high"],
        clip_ratio_c=p["clip_ratio_c"],
        global_batch_info={"loss_scale_factor": p["norm_length"]},
    )
    cispo = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size=2,
        clip_ratio=p["cispo_clip_low"],
        clip_ratio_low=p["cispo_clip_low"],
        clip_ratio_high=p["cispo_clip_high"],
        global_batch_info={"loss_scale_factor": p["norm_length"]},
    )
    out = {}
    for agg in AGGS:
        out[f"ppo/{agg}"] = loss_and_grad("vanilla", case, config, agg)
        out[f"gspo/{agg}"] = loss_and_grad("gspo", case, config, agg)
        out[f"cispo/{agg}"] = loss_and_grad("cispo", case, cispo, agg)
    for ours, theirs in (("k1", "k1"), ("k2", "mse"), ("k3", "low_var_kl")):
        out[f"kl/{ours}"] = core_algos.kl_penalty(case["logprobs"], case["reference"], theirs)
    mask = case["mask"]
    log_ratio = case["logprobs"] - case["engine"]
    for level in ("token", "sequence"):
        out[f"tis/{level}"] = compute_rollout_correction_weights(log_ratio, mask, level, p["cap"])[
            0
        ]
        icepop = f"{p['lower']}_{p['cap']}"
        out[f"mis/{level}"] = compute_rollout_correction_weights(log_ratio, mask, level, icepop)[0]
    for ours, theirs in (("token", "token_k1"), ("geometric", "seq_mean_k1")):
        low, high = p[f"{ours}_band"]
        spec = f"{1 / high!r}_{1 / low!r}"  # verl's k1 is -log ratio: the reciprocal band
        out[f"reject/{ours}"] = compute_rollout_rejection_mask(log_ratio, mask, theirs, spec)[0]
    index = np.array(case["group_ids"].tolist())
    rewards = torch.zeros_like(mask)  # the outcome reward sits on each row's last loss token
    last = (mask * torch.arange(mask.shape[1], dtype=mask.dtype)).argmax(-1)
    rewards[torch.arange(mask.shape[0]), last] = case["rewards"]
    out["grpo"] = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)[0]
    out["dr_grpo"] = core_algos.compute_grpo_outcome_advantage(
        rewards, mask, index, norm_adv_by_std_in_grpo=False
    )[0]
    out["reinforce_pp_baseline"] = (
        core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index)[0]
    )
    vpreds = case["logprobs"].clone().requires_grad_()  # values: the tensors are only numbers
    value_loss, _ = core_algos.compute_value_loss(
        vpreds, case["advantages"], case["old"], mask, p["value_clip"], "token-mean"
    )
    value_loss.backward()
    out["value_loss"] = (value_loss.detach(), vpreds.grad)
    out["gae"] = core_algos.compute_gae_advantage_return(
        rewards, case["old"], mask, p["gamma"], p["lam"]
    )
    return out


def main() -> None:
    cases = torch.load(sys.argv[1])
    torch.save([run(case) for case in cases], sys.argv[2])


if __name__ == "__main__":
    main()
