"""token_logprobs and logprob_mismatch on a small randomly initialised Llama (no model load).

The engine-vs-trainer check on SmolLM2 lives in tests/engine_pool/test_logprob_consistency.py,
which shares that directory's single model load. Two float32 evaluations are compared within the
tolerance the model's float32 error against float64 gives on this CPU (tests/float_tolerance.py).
"""

from __future__ import annotations

import pytest
import torch
from float_tolerance import logprob_error, tolerance
from transformers import LlamaForCausalLM

from agentrl.training.logprobs import logprob_mismatch, token_logprobs


@pytest.fixture(scope="module")
def tiny_llama(make_tiny_llama) -> LlamaForCausalLM:
    return make_tiny_llama()


IDS = [5, 17, 3, 42, 42, 8, 60, 1]


def rounding(model: LlamaForCausalLM, temperature: float) -> float:
    """How far two float32 evaluations of ``IDS``'s log-probs may differ on this CPU."""
    error, _, magnitude = logprob_error(model, IDS, temperature)
    return tolerance(error, magnitude)


def prefix_by_prefix(model: LlamaForCausalLM, ids: list[int], temperature: float) -> torch.Tensor:
    """Independent reference: one forward per prefix, scored at the effective temperature."""
    t_eff = temperature if temperature > 0 else 1.0
    out = []
    with torch.no_grad():
        for t in range(1, len(ids)):
            logits = model(torch.tensor([ids[:t]])).logits[0, -1]
            out.append(torch.log_softmax(logits / t_eff, -1)[ids[t]])
    return torch.stack(out)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_token_logprobs_scores_each_next_token(
    tiny_llama: LlamaForCausalLM, temperature: float
) -> None:
    with torch.no_grad():
        got = token_logprobs(tiny_llama, torch.tensor([IDS]), temperature)
    assert got.shape == (1, len(IDS) - 1) and got.dtype == torch.float32
    expected = prefix_by_prefix(tiny_llama, IDS, temperature)
    torch.testing.assert_close(got[0], expected, atol=rounding(tiny_llama, temperature), rtol=0)


def test_padding_does_not_change_real_positions(tiny_llama: LlamaForCausalLM) -> None:
    short = IDS[:5]
    ids = torch.tensor([IDS, [0, 0, 0, *short], [*short, 0, 0, 0]])
    mask = torch.tensor([[1] * 8, [0, 0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0, 0]])
    with torch.no_grad():
        got = token_logprobs(tiny_llama, ids, 1.0, attention_mask=mask)
        alone = token_logprobs(tiny_llama, torch.tensor([short]), 1.0)[0]
    atol = rounding(tiny_llama, 1.0)
    torch.testing.assert_close(got[1, 3:], alone, atol=atol, rtol=0)  # left padding
    torch.testing.assert_close(got[2, :4], alone, atol=atol, rtol=0)  # right padding


def test_token_logprobs_is_differentiable(tiny_llama: LlamaForCausalLM) -> None:
    tiny_llama.zero_grad()
    token_logprobs(tiny_llama, torch.tensor([IDS]), 1.0).sum().backward()
    assert tiny_llama.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0
    tiny_llama.zero_grad()


def test_mismatch_compares_only_masked_positions_and_restores_mode(
    tiny_llama: LlamaForCausalLM,
) -> None:
    exact = [0.0, *prefix_by_prefix(tiny_llama, IDS, 0.7).tolist()]
    mask = [0, 0, 0, 1, 1, 1, 0, 1]
    engine = list(exact)
    engine[5] += 0.5  # a compared position
    engine[1] = 99.0  # a prompt position: ignored
    tiny_llama.eval()
    report = logprob_mismatch(tiny_llama, IDS, engine, mask, 0.7)
    assert not tiny_llama.training
    assert report["n_tokens"] == 4
    atol = rounding(tiny_llama, 0.7)  # the full forward against one forward per prefix
    assert report["max_abs"] == pytest.approx(0.5, abs=atol)
    assert report["mean_abs"] == pytest.approx(0.5 / 4, abs=atol)


@pytest.mark.parametrize(
    ("ids", "logprobs", "mask", "message"),
    [
        ([1, 2, 3], [0.0, 0.0], [0, 1, 1], "misaligned"),
        ([1, 2, 3], [0.0, 0.0, 0.0], [1, 1, 1], "first token"),
        ([1, 2, 3], [0.0, 0.0, 0.0], [0, 0, 0], "no tokens"),
    ],
)
def test_mismatch_rejects_malformed_trajectories(
    tiny_llama: LlamaForCausalLM,
    ids: list[int],
    logprobs: list[float],
    mask: list[int],
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        logprob_mismatch(tiny_llama, ids, logprobs, mask, 1.0)
