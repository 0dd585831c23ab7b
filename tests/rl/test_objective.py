"""The packed-batch objective: the loss of the plain formulas, split-invariant, with its metrics."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from agentrl.rl.config import AlgorithmConfig
from agentrl.rl.objective import Objective
from agentrl.training.logprobs import token_logprobs
from agentrl.training.packing import pack

LENGTHS = [7, 5, 9, 4]


@pytest.fixture
def model(make_tiny_llama):
    return make_tiny_llama()


def sequences(model, noise=0.01):
    """Sequences whose engine log-probs are the model's own plus known noise."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for i, n in enumerate(LENGTHS):
        ids = torch.randint(0, 64, (n,), generator=generator)
        with torch.no_grad():
            own = token_logprobs(model, ids[None], temperature=1.0)[0]  # (n - 1,) scores ids[1:]
        mask = [0, 0, *[1] * (n - 2)]
        engine = [0.0, *(own + noise * (i + 1)).tolist()]
        out.append(
            {
                "input_ids": ids.tolist(),
                "loss_mask": mask,
                "logprobs": [e if m else 0.0 for e, m in zip(engine, mask, strict=True)],
                "versions": [0 if m else -1 for m in mask],
                "advantages": [1.0, -1.0, 0.5, 2.0][i],
            }
        )
    return out


def run(objective, model, micro_batches):
    """What Actor.train_step does with a loss_fn: sums, one denominator, then finish()."""
    losses, denominators, sums = [], [], {}
    for mb in micro_batches:
        loss, denominator, metrics = objective(model, mb)
        losses.append(loss)
        denominators.append(denominator)
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    d = float(sum(denominators))
    total = sum(losses) / d
    reported = {k: v / d for k, v in sums.items()}
    return total, objective.finish(reported, torch.device("cpu"))


def reference_loss(model, seqs, clip_high=0.28, cap=2.0):
    """Token-mean PPO with trainer old log-probs and token TIS, one sequence at a time."""
    total, count = 0.0, 0
    for s in seqs:
        ids = torch.tensor(s["input_ids"])[None]
        lp = token_logprobs(model, ids, temperature=1.0)[0]  # (n - 1,)
        mask = torch.tensor(s["loss_mask"][1:], dtype=torch.bool)
        engine = torch.tensor(s["logprobs"][1:])
        weight = (lp.detach() - engine).exp().clamp(max=cap)
        ratio = (lp - lp.detach()).exp()  # 1 in value, the policy gradient in grad
        per_token = -s["advantages"] * ratio * weight
        total = total + per_token[mask].sum()
        count += int(mask.sum())
    return total / count


def test_loss_and_gradient_match_the_plain_formulas(model):
    seqs = sequences(model)
    objective = Objective(AlgorithmConfig(), temperature=1.0)
    loss, metrics = run(objective, model, pack(seqs, max_tokens=64))
    loss.backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = reference_loss(model, seqs)
    expected.backward()
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-5)
    for a, p in zip(ours, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)
    assert metrics["mismatch/max_abs"] == pytest.approx(0.04, rel=1e-3)  # the 4th's noise
    assert metrics["mismatch/mean_abs"] == pytest.approx(
        (5 * 0.01 + 3 * 0.02 + 7 * 0.03 + 2 * 0.04) / 17, rel=1e-3
    )
    assert metrics["policy/ratio_max"] == pytest.approx(1.0)
    assert metrics["policy/clip_fraction"] == 0.0
    assert metrics["policy/entropy"] > 0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("kind", ["ppo", "gspo"])
def test_micro_batch_splits_do_not_change_the_loss_or_metrics(model, agg, kind):
    seqs = sequences(model)
    config = AlgorithmConfig(
        aggregation=agg, loss=kind, old_logprobs="engine", importance_correction="none"
    )
    whole = run(Objective(config, temperature=1.0, norm_length=16), model, pack(seqs, 64))
    split = run(Objective(config, temperature=1.0, norm_length=16), model, pack(seqs, 12))
    assert len(pack(seqs, 12)) > 1
    assert float(split[0]) == pytest.approx(float(whole[0]), rel=1e-5)
    for key, value in whole[1].items():
        assert split[1][key] == pytest.approx(value, rel=1e-5, abs=1e-9), key


def test_engine_old_logprobs_put_the_mismatch_into_the_ratio(model):
    seqs = sequences(model, noise=0.5)  # ratios exp(-0.5 * (i + 1)): clipped for A < 0 ... etc.
    _, metrics = run(
        Objective(
            AlgorithmConfig(old_logprobs="engine", importance_correction="none"), temperature=1.0
        ),
        model,
        pack(seqs, 64),
    )
    assert metrics["policy/ratio_min"] == pytest.approx(math.exp(-2.0), rel=1e-4)
    assert metrics["policy/clip_fraction"] > 0


@pytest.mark.parametrize("max_tokens", [64, 12])
def test_on_policy_mismatch_leaves_out_tokens_of_older_weights(model, max_tokens):
    seqs = sequences(model)  # noise 0.01 * (i + 1) on 5, 3, 7 and 2 loss tokens
    for i, seq in enumerate(seqs):  # the 2nd and 4th were sampled by version 3, the others by 4
        seq["versions"] = [(3 if i % 2 else 4) if m else -1 for m in seq["loss_mask"]]
    objective = Objective(AlgorithmConfig(), temperature=1.0)
    objective.policy_version = 4
    _, metrics = run(objective, model, pack(seqs, max_tokens=max_tokens))
    assert metrics["mismatch/on_policy_fraction"] == pytest.approx(12 / 17)
    assert metrics["mismatch/on_policy_mean_abs"] == pytest.approx(
        (5 * 0.01 + 7 * 0.03) / 12, rel=1e-3
    )
    assert metrics["mismatch/on_policy_max_abs"] == pytest.approx(0.03, rel=1e-3)
    assert metrics["mismatch/max_abs"] == pytest.approx(0.04, rel=1e-3)  # stale tokens included
    objective.policy_version = 5  # nothing sampled by the weights trained on
    _, metrics = run(objective, model, pack(seqs, max_tokens=max_tokens))
    assert metrics["mismatch/on_policy_fraction"] == 0.0
    assert math.isnan(metrics["mismatch/on_policy_mean_abs"])
    assert math.isnan(metrics["mismatch/on_policy_max_abs"])
    objective.policy_version = None  # not in a training loop: not measured
    _, metrics = run(objective, model, pack(seqs, max_tokens=max_tokens))
    assert not [key for key in metrics if "on_policy" in key]


def test_kl_to_an_identical_reference_is_zero_and_needs_a_reference(model, make_tiny_llama):
    config = AlgorithmConfig(kl_coef=0.1)
    with pytest.raises(ValueError, match="reference"):
        Objective(config, temperature=1.0)
    objective = Objective(config, temperature=1.0, reference=make_tiny_llama())
    _, metrics = run(objective, model, pack(sequences(model), 64))
    assert metrics["policy/kl_ref"] == pytest.approx(0.0, abs=1e-6)


# --- a model whose every prediction is the logits (2, 0, 0): log-probs known by hand --------------
#
# At T = 1: Z = e^2 + 2, log Z = 2.239545; log p(0) = 2 - 2.239545 = -0.239545 and
# log p(1) = log p(2) = -2.239545. At T = 0.5 (logits (4, 0, 0)): log Z = 4.035976.
LOGP0, LOGP1 = 2 - math.log(math.e**2 + 2), -math.log(math.e**2 + 2)


class FixedLogits(nn.Module):
    """Predicts logits (2, 0, 0) at every kept position, whatever the input."""

    config = SimpleNamespace(_attn_implementation="sdpa")

    def __init__(self) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor([2.0, 0.0, 0.0]))

    def forward(self, input_ids, position_ids, use_cache, logits_to_keep):
        return SimpleNamespace(logits=self.logits.expand(1, len(logits_to_keep), 3))


def fixed_sequences():
    """A (advantage 1): ids 0 0 0 0, 3 loss tokens of log-prob LOGP0 at T = 1; B (advantage 2):
    ids 0 1 1, 2 loss tokens of LOGP1. Engine log-probs are those minus a gap, so trainer -
    engine is 0.1, -0.1, 0 on A's tokens and 0.3, 0.3 on B's (at T = 1)."""
    return [
        {
            "input_ids": [0, 0, 0, 0],
            "loss_mask": [0, 1, 1, 1],
            "logprobs": [0.0, LOGP0 - 0.1, LOGP0 + 0.1, LOGP0],
            "versions": [-1, 0, 0, 0],
            "advantages": 1.0,
        },
        {
            "input_ids": [0, 1, 1],
            "loss_mask": [0, 1, 1],
            "logprobs": [0.0, LOGP1 - 0.3, LOGP1 - 0.3],
            "versions": [-1, 0, 0],
            "advantages": 2.0,
        },
    ]


def test_entropy_metric_is_that_of_the_sampling_temperature():
    # Every prediction is softmax((2, 0, 0) / T). T = 0.5: log(e^4 + 2) - 4 e^4 / (e^4 + 2)
    # = 4.035976 - 3.858653 = 0.177324 (at T = 1 it would be 0.665573).
    objective = Objective(AlgorithmConfig(), temperature=0.5)
    _, metrics = run(objective, FixedLogits(), pack(fixed_sequences(), 64))
    assert metrics["policy/entropy"] == pytest.approx(0.177324, abs=1e-6)


def test_geometric_rejection_with_token_tis():
    # trainer - engine: A's tokens 0.1, -0.1, 0 (geometric mean 0: accepted), B's 0.3, 0.3
    # (geometric ratio e^0.3 = 1.35: rejected). Old log-probs are the trainer's: ratio 1, so the
    # per-token loss is -A * w. Token TIS weights of A: e^0.1 = 1.105171, e^-0.1 = 0.904837, 1.
    # Token-mean over all 5 loss tokens: -(1.105171 + 0.904837 + 1) * 1 / 5 = -0.602002.
    # Without rejection B adds -2 * 2 * e^0.3 = -5.399435: (-3.010008 - 5.399435) / 5 = -1.681889.
    config = AlgorithmConfig(rejection="geometric")
    loss, metrics = run(
        Objective(config, temperature=1.0), FixedLogits(), pack(fixed_sequences(), 64)
    )
    assert float(loss.detach()) == pytest.approx(-0.602002, abs=1e-6)
    assert metrics["rejection/rejected_fraction"] == pytest.approx(2 / 5)
    assert metrics["rejection/rejected_high_fraction"] == pytest.approx(2 / 5)
    # The importance statistics are those of every loss token: ratios 1.105171, 0.904837, 1,
    # 1.349859, 1.349859, mean 5.709726 / 5 = 1.141945.
    assert metrics["importance/ratio_mean"] == pytest.approx(1.141945, abs=1e-6)
    loss, _ = run(
        Objective(AlgorithmConfig(), temperature=1.0), FixedLogits(), pack(fixed_sequences(), 64)
    )
    assert float(loss.detach()) == pytest.approx(-1.681889, abs=1e-6)


def test_cispo_against_the_engine():
    # old = engine: ratios e^0.1, e^-0.1, 1 (A) and e^0.3 = 1.349859 (B, cut to 1 + 0.28).
    # Per token -w A logp. A: 0.239545 * (1.105171 + 0.904837 + 1) = 0.721033.
    # B: -1.28 * 2 * -2.239545 = 5.733235 per token, twice. (0.721033 + 11.466470) / 5 = 2.437501.
    config = AlgorithmConfig(loss="cispo", old_logprobs="engine", importance_correction="none")
    loss, metrics = run(
        Objective(config, temperature=1.0), FixedLogits(), pack(fixed_sequences(), 64)
    )
    assert float(loss.detach()) == pytest.approx(2.437501, abs=1e-6)
    assert metrics["policy/clip_fraction"] == pytest.approx(2 / 5)


@pytest.mark.parametrize(("clip_ratio_c", "expected"), [(3.0, 3.0), (None, 5.0)])
def test_dual_clip_is_wired(clip_ratio_c, expected):
    # One sequence, one loss token with engine ratio 5 and A = -1, old = engine. PPO: max(5, 5)
    # = 5; dual-clip at 3: min(5, 3) = 3.
    seq = [
        {
            "input_ids": [0, 1],
            "loss_mask": [0, 1],
            "logprobs": [0.0, LOGP1 - math.log(5.0)],
            "versions": [-1, 0],
            "advantages": -1.0,
        }
    ]
    config = AlgorithmConfig(
        old_logprobs="engine", importance_correction="none", clip_ratio_c=clip_ratio_c
    )
    loss, metrics = run(Objective(config, temperature=1.0), FixedLogits(), pack(seq, 64))
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    assert metrics["policy/clip_dual_fraction"] == float(clip_ratio_c is not None)
