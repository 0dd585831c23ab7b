"""agentrl's losses, advantages and importance weights against verl 0.9.1's own functions.

verl runs in a side virtualenv (``bench/setup_verl_env.sh``, ``.venv-verl``; the fixture runs the
script, which returns at once when the venv is up to date) through the harness
``verl_reference/verl_side.py``, on the same random float64 batches. Everything agrees to 1e-6
(absolute and relative), values and gradients:

* PPO-clip with dual-clip (verl's ``vanilla``), GSPO and CISPO, with importance weights, under the
  four aggregations: against ``compute_policy_loss_vanilla`` / ``_gspo`` / ``_cispo``;
* the k1, k2, k3 KL penalties (k3 clamped at 10): against ``kl_penalty`` ``k1`` / ``mse`` /
  ``low_var_kl``;
* TIS and MIS (two-sided; verl calls it IcePop) weights per token and per sequence: against
  ``compute_rollout_correction_weights``; token and geometric rejection: against
  ``compute_rollout_rejection_mask`` (``token_k1`` / ``seq_mean_k1``);
* GRPO, Dr.GRPO and REINFORCE++-baseline advantages: against ``compute_grpo_outcome_advantage`` and
  ``compute_reinforce_plus_plus_baseline_outcome_advantage``;
* the critic's clipped value loss and its gradient: against ``compute_value_loss``; GAE advantages
  (whitened over the loss tokens) and returns over masks with holes (multi-turn): against
  ``compute_gae_advantage_return``.

Conventions that differ, and how the comparison bridges them (nothing else is adjusted):

* REINFORCE++-baseline: verl whitens with the Bessel-corrected variance (and ``+1e-8`` under the
  root), agentrl with the population one (``eps=0`` here): over ``n`` tokens verl's advantages are
  agentrl's times ``sqrt((n - 1) / n)``.
* Groups of one sample: verl's GRPO keeps the raw reward (mean 0, std 1), agentrl gives 0. The
  batches have no such group.
* Every row has at least two loss tokens (verl's whitening refuses a single token).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from agentrl.algorithms.advantages import (
    broadcast_to_tokens,
    grpo_advantages,
    reinforce_pp_advantages,
)
from agentrl.algorithms.gae import gae
from agentrl.algorithms.losses import kl_penalty, policy_loss, value_loss
from agentrl.algorithms.off_policy import importance_weights, rejection_mask
from agentrl.rl.critic import whitening

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "bench" / "setup_verl_env.sh"
SIDE_PYTHON = ROOT / ".venv-verl" / "bin" / "python"
HARNESS = Path(__file__).parent / "verl_reference" / "verl_side.py"
AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
CASES = 12
PARAMS = {
    "clip_low": 0.2,
    "clip_high": 0.28,
    "clip_ratio_c": 3.0,
    "norm_length": 11,
    "cispo_clip_low": 1.0,
    "cispo_clip_high": 0.28,
    "cap": 2.0,
    "lower": 0.5,
    "token_band": (0.5, 5.0),
    "geometric_band": (0.999, 1.001),
    "value_clip": 0.5,
    "gamma": 0.9,
    "lam": 0.8,
}


def run_process(argv: list[str], hang_guard_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in its own process group, killed with anything it started on every exit path."""
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = process.communicate(timeout=hang_guard_s)
    except subprocess.TimeoutExpired:
        out = f"{argv[0]} did not finish within {hang_guard_s:g} s"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return subprocess.CompletedProcess(argv, process.returncode, out)


def make_case(seed: int) -> dict:
    """A random batch (float64): 6 rows of up to 9 tokens, each with at least 2 loss tokens."""
    g = torch.Generator().manual_seed(seed)
    n, t = 6, 9
    lengths = torch.randint(2, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()
    holes = (torch.rand(n, t, generator=g) < 0.15) & (torch.arange(t)[None, :] >= 2)
    mask = mask * ~holes
    old = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3
    spread = [0.05, 0.3, 1.0][seed % 3]  # 1.0: ratios past clip_ratio_c = 3 occur
    logprobs = old + spread * torch.randn(n, t, generator=g, dtype=torch.float64)
    # engine gaps per row: tiny (geometric ratios inside [0.999, 1.001]) or large (outside it,
    # and tokens outside TIS's cap, MIS's and the token rejection's bands)
    row_gap = torch.tensor([1e-4, 3e-4, 0.3, 0.6, 1e-4, 0.9], dtype=torch.float64)
    engine = logprobs - row_gap[:, None] * torch.randn(n, t, generator=g, dtype=torch.float64)
    reference = logprobs + 4.0 * torch.randn(n, t, generator=g, dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1, 2, 2] if seed % 2 else [0, 0, 0, 1, 1, 1])  # none of one
    return {
        "mask": mask,
        "old": old,
        "logprobs": logprobs,
        "engine": engine,
        "reference": reference,
        "advantages": torch.randn(n, t, generator=g, dtype=torch.float64),
        "weights": torch.rand(n, t, generator=g, dtype=torch.float64) + 0.5,
        "rewards": torch.randn(n, generator=g, dtype=torch.float64),
        "group_ids": groups[torch.randperm(n, generator=g)],
        "params": PARAMS,
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[tuple[dict, dict]]:
    """(case, verl's outputs) pairs; skipped only when the verl venv cannot be made."""
    made = run_process(["bash", str(SETUP)], hang_guard_s=1800)
    if made.returncode != 0:
        pytest.skip(
            f"bench/setup_verl_env.sh could not make the verl venv (exit {made.returncode}):\n"
            f"{made.stdout[-2000:]}"
        )
    cases = [make_case(seed) for seed in range(CASES)]
    directory = tmp_path_factory.mktemp("verl")
    inputs, outputs = directory / "cases.pt", directory / "verl.pt"
    torch.save(cases, inputs)
    side = run_process([str(SIDE_PYTHON), str(HARNESS), str(inputs), str(outputs)], 600)
    if side.returncode != 0:
        pytest.fail(f"verl_side.py exited {side.returncode}:\n{side.stdout[-4000:]}")
    return list(zip(cases, torch.load(outputs), strict=True))


def close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(
        ours.double(), theirs.double(), rtol=1e-6, atol=1e-6, msg=lambda m: f"{what}: {m}"
    )


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("kind", ["ppo", "gspo", "cispo"])
def test_policy_losses_and_gradients(results, kind, agg) -> None:
    for seed, (case, verl) in enumerate(results):
        logprobs = case["logprobs"].clone().requires_grad_()
        low, high = (
            (PARAMS["cispo_clip_low"], PARAMS["cispo_clip_high"])
            if kind == "cispo"
            else (PARAMS["clip_low"], PARAMS["clip_high"])
        )
        loss, _ = policy_loss(
            logprobs,
            case["old"],
            case["advantages"],
            case["mask"],
            kind=kind,
            clip_low=low,
            clip_high=high,
            clip_ratio_c=PARAMS["clip_ratio_c"],
            agg=agg,
            norm_length=PARAMS["norm_length"],
            token_weights=case["weights"],
        )
        loss.backward()
        their_loss, their_grad = verl[f"{kind}/{agg}"]
        close(loss.detach(), their_loss, f"case {seed} {kind} {agg} loss")
        close(logprobs.grad, their_grad, f"case {seed} {kind} {agg} gradient")


def test_the_batches_exercise_the_dual_clip_and_the_kl_clamp(results) -> None:
    """Without these the agreement above would not cover the dual-clip or the k3 clamp."""
    dual = kl_clamped = 0
    for case, _ in results:
        ratio = (case["logprobs"] - case["old"]).exp()
        on = case["mask"] > 0
        dual += int((on & (case["advantages"] < 0) & (ratio > PARAMS["clip_ratio_c"])).sum())
        kl_clamped += int((on & (kl_penalty(case["logprobs"], case["reference"]) == 10)).sum())
    assert dual > 0 and kl_clamped > 0


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_penalties(results, kind) -> None:
    for seed, (case, verl) in enumerate(results):
        ours = kl_penalty(case["logprobs"], case["reference"], kind)
        close(ours * case["mask"], verl[f"kl/{kind}"] * case["mask"], f"case {seed} {kind}")


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_importance_weights(results, mode, level) -> None:
    truncated_or_masked = 0
    for seed, (case, verl) in enumerate(results):
        weights, metrics = importance_weights(
            case["logprobs"],
            case["engine"],
            case["mask"],
            mode=mode,
            level=level,
            cap=PARAMS["cap"],
            lower=PARAMS["lower"],
        )
        close(weights, verl[f"{mode}/{level}"] * case["mask"], f"case {seed} {mode} {level}")
        truncated_or_masked += float(metrics["truncated_fraction"] + metrics["masked_fraction"])
    assert truncated_or_masked > 0  # the bounds were reached somewhere


@pytest.mark.parametrize("level", ["token", "geometric"])
def test_rejection(results, level) -> None:
    accepted_total = rejected_total = 0
    for seed, (case, verl) in enumerate(results):
        low, high = PARAMS[f"{level}_band"]
        accepted, _ = rejection_mask(
            case["logprobs"], case["engine"], case["mask"], level=level, low=low, high=high
        )
        on = case["mask"] > 0
        theirs = (verl[f"reject/{level}"] > 0) & on
        assert torch.equal(accepted, theirs), f"case {seed} {level}"
        accepted_total += int(accepted.sum())
        rejected_total += int((on & ~accepted).sum())
    assert accepted_total > 0 and rejected_total > 0


def test_grpo_and_dr_grpo_advantages(results) -> None:
    for seed, (case, verl) in enumerate(results):
        for name, scale in (("grpo", True), ("dr_grpo", False)):
            ours = grpo_advantages(case["rewards"], case["group_ids"], scale_by_std=scale)
            close(broadcast_to_tokens(ours, case["mask"]), verl[name], f"case {seed} {name}")


def test_reinforce_pp_baseline_advantages(results) -> None:
    for seed, (case, verl) in enumerate(results):
        counts = case["mask"].sum(-1)
        ours = reinforce_pp_advantages(
            case["rewards"], case["group_ids"], token_counts=counts, eps=0.0
        )
        n = float(counts.sum())
        bessel = math.sqrt((n - 1) / n)  # verl's variance is the Bessel-corrected one
        close(
            broadcast_to_tokens(ours, case["mask"]) * bessel,
            verl["reinforce_pp_baseline"],
            f"case {seed} reinforce_pp_baseline",
        )


def test_value_loss_and_gradient(results) -> None:
    clipped = 0.0
    for seed, (case, verl) in enumerate(results):
        values = case["logprobs"].clone().requires_grad_()
        loss, metrics = value_loss(
            values, case["old"], case["advantages"], case["mask"], clip=PARAMS["value_clip"]
        )
        loss.backward()
        their_loss, their_grad = verl["value_loss"]
        close(loss.detach(), their_loss, f"case {seed} value loss")
        close(values.grad, their_grad, f"case {seed} value loss gradient")
        clipped += float(metrics["clip_fraction"])
    assert clipped > 0  # the clip acted somewhere


def test_gae_advantages_and_returns(results) -> None:
    for seed, (case, verl) in enumerate(results):
        mask = case["mask"]
        rewards = torch.zeros_like(mask)
        last = (mask * torch.arange(mask.shape[1], dtype=mask.dtype)).argmax(-1)
        rewards[torch.arange(mask.shape[0]), last] = case["rewards"]
        advantages, returns = gae(
            rewards, case["old"], mask, gamma=PARAMS["gamma"], lam=PARAMS["lam"]
        )
        mean, scale = whitening([advantages], [mask])
        their_advantages, their_returns = verl["gae"]
        close((advantages - mean) * scale * mask, their_advantages * mask, f"case {seed} A")
        close(returns, their_returns * mask, f"case {seed} returns")
