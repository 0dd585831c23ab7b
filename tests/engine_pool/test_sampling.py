"""SamplingParams validation and the sampler's rules, on synthetic logits (no model)."""

from __future__ import annotations

import pytest
import torch
from float_tolerance import tolerance
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sglang_conformance import side, side_python  # noqa: F401

from agentrl.engine_pool.engine import SamplingParams
from agentrl.engine_pool.sampling import (
    filtered_probs,
    logprob_temperature,
    sample_next_tokens,
    temperature_logprobs,
)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"stop_token_ids": (3, -1)}, "stop_token_ids"),
        ({"stop_token_ids": ("2",)}, "stop_token_ids"),
        ({"seed": -5}, "seed"),
        ({"seed": 2**63}, "seed"),
    ],
)
def test_invalid_sampling_params_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_valid_sampling_params() -> None:
    params = SamplingParams(temperature=0, top_p=0.5, top_k=3, stop_token_ids=[7, 8], seed=0)
    assert params.greedy
    assert params.stop_token_ids == (7, 8)  # normalised to a tuple, so the params stay hashable
    assert hash(params) == hash(
        SamplingParams(temperature=0, top_p=0.5, top_k=3, stop_token_ids=(7, 8), seed=0)
    )


def test_temperature_logprobs_is_log_softmax_of_scaled_logits() -> None:
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(1))
    for temperature in (0.0, 0.5, 1.0, 2.0):
        expected = torch.log_softmax(logits / logprob_temperature(temperature), -1)
        expected = expected.gather(-1, tokens[..., None])[..., 0]
        torch.testing.assert_close(temperature_logprobs(logits, tokens, temperature), expected)
    assert logprob_temperature(0.0) == 1.0


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert filtered_probs(logits, 0, 0.45).nonzero().flatten().tolist() == [0]
    assert filtered_probs(logits, 0, 0.6).nonzero().flatten().tolist() == [0, 1]
    assert filtered_probs(logits, 0, 0.81).nonzero().flatten().tolist() == [0, 1, 2]
    torch.testing.assert_close(filtered_probs(logits, 2, 1.0), torch.tensor([0.625, 0.375, 0, 0]))
    # top_p = 1 filters nothing, even where float32's cumulative mass reaches 1 early
    saturated = torch.tensor([30.0, 0.0, -5.0, -9.0])
    assert filtered_probs(saturated, 3, 1.0).nonzero().flatten().tolist() == [0, 1, 2]


def test_min_p_keeps_tokens_at_least_min_p_times_the_most_likely_after_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert filtered_probs(logits, 0, 1.0, 0.35).nonzero().flatten().tolist() == [0, 1]
    assert filtered_probs(logits, 0, 1.0, 0.2).nonzero().flatten().tolist() == [0, 1, 2]
    torch.testing.assert_close(
        filtered_probs(logits, 0, 1.0, 0.35), torch.tensor([0.625, 0.375, 0, 0])
    )
    # after top-k's renormalisation the ratio to the most likely token is unchanged: 0.3 / 0.5
    assert filtered_probs(logits, 2, 1.0, 0.59).nonzero().flatten().tolist() == [0, 1]
    assert filtered_probs(logits, 2, 1.0, 0.61).nonzero().flatten().tolist() == [0]
    assert filtered_probs(logits, 0, 1.0, 1.0).nonzero().flatten().tolist() == [0]
    with pytest.raises(ValueError, match="min_p must be in \\[0, 1\\]"):
        SamplingParams(min_p=1.5)


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(top_k=3), SamplingParams(min_p=0.45)],  # min_p: keeps p >= 0.18
    ids=["top_k", "min_p"],
)
def test_samples_follow_the_filtered_distribution(sampling: SamplingParams) -> None:
    """4000 draws at T=1 keeping the top 3: frequencies within 0.03 of their renormalised
    probabilities."""
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(4000):
        (token,), _ = sample_next_tokens(logits, [sampling], [generator])
        counts[token] += 1
    torch.testing.assert_close(
        counts / 4000, torch.tensor([4 / 9, 3 / 9, 2 / 9, 0]), atol=0.03, rtol=0
    )


rows = st.tuples(
    st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5]),  # temperature
    st.sampled_from([0.05, 0.5, 0.9, 1.0]),  # top_p
    st.sampled_from([0, 1, 5, 40]),  # top_k
    st.integers(0, 2**32),  # seed
)


@settings(max_examples=60, deadline=None)
@given(st.lists(rows, min_size=1, max_size=5), st.integers(0, 2**32))
def test_sampled_tokens_respect_filters_and_report_full_vocab_logprobs(
    specs: list[tuple[float, float, int, int]], logits_seed: int
) -> None:
    logits = 3 * torch.randn(len(specs), 40, generator=torch.Generator().manual_seed(logits_seed))
    params = [SamplingParams(temperature=t, top_p=p, top_k=k, seed=s) for t, p, k, s in specs]
    generators = [torch.Generator().manual_seed(s) for *_, s in specs]
    tokens, logprobs = sample_next_tokens(logits, params, generators)
    for row, sampling, token, logprob in zip(logits, params, tokens, logprobs, strict=True):
        scaled = row / logprob_temperature(sampling.temperature)
        expected = torch.log_softmax(scaled.double(), -1)[token]  # exact, for float32's purposes
        # another float32 evaluation (log_softmax) shows float32's error on this row; the
        # log-prob is a difference of values as large as the largest scaled logit, whose
        # spacing bounds how exactly float32 can give it
        error = abs(float(torch.log_softmax(scaled, -1)[token]) - float(expected))
        atol = tolerance(error, float(scaled.abs().max()))
        assert logprob == pytest.approx(float(expected), abs=atol)
        if sampling.greedy:
            assert token == int(row.argmax())
            continue
        probs = torch.softmax(row / sampling.temperature, -1)
        if sampling.top_k:
            assert token in torch.topk(probs, sampling.top_k).indices.tolist()
        else:  # the nucleus: tokens more likely than this one hold less than top_p of the mass
            assert float(probs[probs > probs[token]].sum()) < sampling.top_p + 1e-6


@settings(max_examples=30, deadline=None)
@given(st.lists(rows, min_size=2, max_size=6), st.integers(0, 5), st.integers(0, 2**32))
def test_a_rows_token_does_not_depend_on_the_other_rows(
    specs: list[tuple[float, float, int, int]], pick: int, logits_seed: int
) -> None:
    pick %= len(specs)
    logits = 2 * torch.randn(len(specs), 40, generator=torch.Generator().manual_seed(logits_seed))
    params = [SamplingParams(temperature=t, top_p=p, top_k=k, seed=s) for t, p, k, s in specs]
    batched, _ = sample_next_tokens(
        logits, params, [torch.Generator().manual_seed(s) for *_, s in specs]
    )
    alone, _ = sample_next_tokens(
        logits[pick : pick + 1], [params[pick]], [torch.Generator().manual_seed(specs[pick][3])]
    )
    assert alone == [batched[pick]]


def test_sampled_rows_need_a_generator() -> None:
    with pytest.raises(ValueError, match="Generator"):
        sample_next_tokens(torch.zeros(1, 4), [SamplingParams()], [None])
    assert sample_next_tokens(
        torch.tensor([[0.0, 2.0, 1.0]]), [SamplingParams(temperature=0)], [None]
    )[0] == [1]


@pytest.mark.slow
def test_top_k_and_top_p_keep_the_tokens_sglangs_sampler_keeps(side_python):  # noqa: F811
    """Without min-p, SGLang filters top-k and top-p jointly (each on the whole distribution):
    its own PyTorch sampler, in the side venv, keeps the same tokens as ``filtered_probs``."""
    generator = torch.Generator().manual_seed(0)
    cases = []
    for top_k, top_p in [(3, 0.5), (5, 0.9), (40, 0.3), (2, 1.0), (0, 0.7), (10, 0.95)]:
        for scale in (0.5, 2.0, 4.0):
            logits = scale * torch.randn(64, generator=generator)
            probs = torch.softmax(logits, -1)
            cases.append({"probs": probs.tolist(), "top_k": top_k or 64, "top_p": top_p})
    judged = side(side_python, "filters", {"cases": cases})
    ours = [
        filtered_probs(torch.log(torch.tensor(c["probs"])), c["top_k"], c["top_p"])
        .nonzero()
        .flatten()
        .tolist()
        for c in cases
    ]
    assert ours == judged
    # where joint and one-after-the-other differ: top-2 holds 0.8 of the mass; renormalised,
    # its first token alone (0.625) would pass top_p = 0.6
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert filtered_probs(logits, 2, 0.6).nonzero().flatten().tolist() == [0, 1]
