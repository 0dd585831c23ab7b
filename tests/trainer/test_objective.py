"""The packed-batch objective: the loss of the plain formulas, split-invariant, with its metrics."""

import math

import pytest
import torch

from agentrl.trainer.logprobs import token_logprobs
from agentrl.trainer.objective import Objective
from agentrl.trainer.packing import pack
from agentrl.trainer.train_config import AlgorithmConfig

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
    config = AlgorithmConfig(aggregation=agg, loss=kind, old_logprobs="engine")
    whole = run(Objective(config, temperature=1.0, norm_length=16), model, pack(seqs, 64))
    split = run(Objective(config, temperature=1.0, norm_length=16), model, pack(seqs, 12))
    assert len(pack(seqs, 12)) > 1
    assert float(split[0]) == pytest.approx(float(whole[0]), rel=1e-5)
    for key, value in whole[1].items():
        assert split[1][key] == pytest.approx(value, rel=1e-5, abs=1e-9), key


def test_engine_old_logprobs_put_the_mismatch_into_the_ratio(model):
    seqs = sequences(model, noise=0.5)  # ratios exp(-0.5 * (i + 1)): clipped for A < 0 ... etc.
    _, metrics = run(
        Objective(AlgorithmConfig(old_logprobs="engine"), temperature=1.0), model, pack(seqs, 64)
    )
    assert metrics["policy/ratio_min"] == pytest.approx(math.exp(-2.0), rel=1e-4)
    assert metrics["policy/clip_fraction"] > 0


def test_kl_to_an_identical_reference_is_zero_and_needs_a_reference(model, make_tiny_llama):
    config = AlgorithmConfig(kl_coef=0.1)
    with pytest.raises(ValueError, match="reference"):
        Objective(config, temperature=1.0)
    objective = Objective(config, temperature=1.0, reference=make_tiny_llama())
    _, metrics = run(objective, model, pack(sequences(model), 64))
    assert metrics["policy/kl_ref"] == pytest.approx(0.0, abs=1e-6)
