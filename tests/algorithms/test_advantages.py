"""GRPO, Dr.GRPO and REINFORCE++ advantages against per-group loops, and the rules they keep."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentrl.algorithms.advantages import (
    broadcast_to_tokens,
    grpo_advantages,
    reinforce_pp_advantages,
)

rewards_st = st.floats(-10, 10, allow_nan=False, width=32)


@st.composite
def grouped_rewards(draw, min_size: int = 1):
    """Rewards (N,) float64 and arbitrary, unsorted int64 group ids (N,)."""
    n = draw(st.integers(min_size, 24))
    rewards = draw(st.lists(rewards_st, min_size=n, max_size=n))
    # Few distinct rewards too: binary verifiers give many ties and constant groups.
    if draw(st.booleans()):
        rewards = [float(round(r) % 2) for r in rewards]
    ids = draw(st.lists(st.integers(-5, 1000), min_size=n, max_size=n))
    ids = [ids[draw(st.integers(0, min(i, 3)))] for i in range(n)]  # repeat earlier ids: groups
    return torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids, dtype=torch.int64)


def loop_grpo(rewards: torch.Tensor, ids: torch.Tensor, scale: bool, eps: float) -> list[float]:
    out = []
    for r, g in zip(rewards.tolist(), ids.tolist(), strict=True):
        group = [x for x, h in zip(rewards.tolist(), ids.tolist(), strict=True) if h == g]
        mean = statistics.fmean(group)
        std = statistics.stdev(group) if len(group) > 1 else 0.0
        out.append((r - mean) / (std + eps) if scale else r - mean)
    return out


@settings(max_examples=200, deadline=None)
@given(grouped_rewards(), st.booleans())
def test_grpo_matches_per_group_loop(data, scale_by_std: bool) -> None:
    rewards, ids = data
    got = grpo_advantages(rewards, ids, scale_by_std=scale_by_std, eps=1e-6)
    expected = torch.tensor(loop_grpo(rewards, ids, scale_by_std, 1e-6), dtype=torch.float64)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


@settings(max_examples=200, deadline=None)
@given(grouped_rewards(), st.booleans())
def test_grpo_groups_are_centred_and_never_nan(data, scale_by_std: bool) -> None:
    rewards, ids = data
    adv = grpo_advantages(rewards, ids, scale_by_std=scale_by_std)
    assert torch.isfinite(adv).all()
    for g in ids.unique():
        members = adv[ids == g]
        assert abs(float(members.sum())) < 1e-6 * max(1.0, float(members.abs().max()))
        if members.numel() == 1 or (rewards[ids == g] == rewards[ids == g][0]).all():
            assert (members == 0).all()  # no signal in a group without reward variation


@settings(max_examples=100, deadline=None)
@given(grouped_rewards(min_size=2), st.floats(0.1, 10), st.floats(-5, 5))
def test_grpo_is_affine_invariant_and_dr_grpo_scale_equivariant(data, a, b) -> None:
    rewards, ids = data
    for g in ids.unique():  # spreads that a shift would round away are not what this is about
        spread = float(rewards[ids == g].max() - rewards[ids == g].min())
        assume(spread == 0 or spread > 1e-6)
    std_adv = grpo_advantages(rewards, ids, eps=0.0)
    std_shifted = grpo_advantages(a * rewards + b, ids, eps=0.0)
    finite = torch.isfinite(std_adv)  # eps=0: constant groups and groups of one give 0/0
    torch.testing.assert_close(std_shifted[finite], std_adv[finite], atol=1e-6, rtol=1e-6)
    dr = grpo_advantages(rewards, ids, scale_by_std=False)
    torch.testing.assert_close(
        grpo_advantages(a * rewards + b, ids, scale_by_std=False), a * dr, atol=1e-9, rtol=1e-9
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_constant_groups_get_exactly_zero(dtype: torch.dtype) -> None:
    # The mean of seven 0.7s rounds to 0.7 + 1 ulp in float32; dividing that residue by a std of
    # the same size would give every token of the group an advantage of about 0.06.
    rewards = torch.tensor([0.1] * 3 + [0.7] * 7 + [0.2, 0.9], dtype=dtype)
    ids = torch.tensor([0] * 3 + [1] * 7 + [2, 2])
    for scale_by_std in (True, False):
        adv = grpo_advantages(rewards, ids, scale_by_std=scale_by_std)
        assert adv.dtype == dtype
        assert (adv[:10] == 0).all() and (adv[10:] != 0).all()


def test_grpo_unit_std_within_groups() -> None:
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0, 3.0, 5.0, 9.0])
    ids = torch.tensor([7, 7, 7, 7, 2, 2, 2])
    adv = grpo_advantages(rewards, ids, eps=0.0)
    for g in (7, 2):
        assert float(adv[ids == g].std()) == pytest.approx(1.0)  # unbiased, as computed


@settings(max_examples=100, deadline=None)
@given(grouped_rewards(), st.randoms(use_true_random=False))
def test_grpo_is_permutation_equivariant(data, rng) -> None:
    rewards, ids = data
    perm = list(range(rewards.numel()))
    rng.shuffle(perm)
    perm_t = torch.tensor(perm, dtype=torch.int64)
    adv = grpo_advantages(rewards, ids)
    torch.testing.assert_close(grpo_advantages(rewards[perm_t], ids[perm_t]), adv[perm_t])


@settings(max_examples=200, deadline=None)
@given(grouped_rewards(min_size=2), st.booleans())
def test_reinforce_pp_whitens_the_batch(data, baseline: bool) -> None:
    rewards, ids = data
    adv = reinforce_pp_advantages(rewards, ids if baseline else None, eps=0.0)
    centred = (
        torch.tensor(loop_grpo(rewards, ids, False, 0.0), dtype=torch.float64)
        if baseline
        else rewards
    )
    spread = float(centred.std(unbiased=False))
    if spread < 1e-6:
        return  # a constant batch has nothing to whiten (eps=0 would divide by 0)
    expected = (centred - centred.mean()) / spread
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=1e-6)
    assert abs(float(adv.mean())) < 1e-6
    assert float(adv.std(unbiased=False)) == pytest.approx(1.0, abs=1e-5)


@settings(max_examples=100, deadline=None)
@given(grouped_rewards(min_size=2), st.data())
def test_reinforce_pp_token_counts_equal_whitening_over_tokens(data, draw) -> None:
    """OpenRLHF's form: broadcast to tokens, then whiten over all loss tokens of the batch."""
    rewards, ids = data
    n = rewards.numel()
    lengths = torch.tensor(draw.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)))
    mask = (torch.arange(6)[None, :] < lengths[:, None]).double()  # (N, 6)
    if mask.sum() < 2:
        return
    centred = torch.tensor(loop_grpo(rewards, ids, False, 0.0), dtype=torch.float64)
    tokens = centred[:, None] * mask
    mean = tokens.sum() / mask.sum()
    std = (((tokens - mean) * mask).square().sum() / mask.sum()).sqrt()
    if std < 1e-6:
        return
    expected = (tokens - mean) / (std + 1e-6) * mask
    adv = reinforce_pp_advantages(rewards, ids, token_counts=lengths)
    torch.testing.assert_close(broadcast_to_tokens(adv, mask), expected, atol=1e-6, rtol=1e-6)


def test_reinforce_pp_token_weighting_by_hand() -> None:
    # Rewards 1 and 0 on 1 and 3 loss tokens: over the 4 tokens the mean is 1/4 and the variance
    # (1 * (3/4)^2 + 3 * (1/4)^2) / 4 = 3/16, std 0.433013; advantages 0.75 / 0.433013 = 1.732051
    # and -0.25 / 0.433013 = -0.577350. Per trajectory (no counts) they would be +1 and -1.
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    adv = reinforce_pp_advantages(rewards, token_counts=torch.tensor([1, 3]), eps=0.0)
    assert adv.tolist() == pytest.approx([math.sqrt(3), -1 / math.sqrt(3)])
    assert reinforce_pp_advantages(rewards, eps=0.0).tolist() == pytest.approx([1.0, -1.0])


def test_reinforce_pp_ignores_trajectories_without_tokens() -> None:
    rewards = torch.tensor([1.0, 0.0, 1000.0])
    counts = torch.tensor([3, 3, 0])
    adv = reinforce_pp_advantages(rewards, token_counts=counts, eps=0.0)
    torch.testing.assert_close(adv[:2], torch.tensor([1.0, -1.0]))


def test_broadcast_to_tokens() -> None:
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    got = broadcast_to_tokens(torch.tensor([2.0, -1.0, 5.0]), mask)
    expected = torch.tensor([[0, 2, 2, 0], [-1, -1, -1, -1], [0, 0, 0, 0]], dtype=torch.float32)
    assert torch.equal(got, expected)


def test_integer_rewards_are_scored_as_float() -> None:
    adv = grpo_advantages(torch.tensor([0, 1, 1, 0]), torch.tensor([0, 0, 1, 1]))
    assert adv.dtype == torch.float32
    assert adv.tolist() == pytest.approx([-0.7071, 0.7071, 0.7071, -0.7071], abs=1e-3)


def test_rejects_misshapen_inputs() -> None:
    with pytest.raises(ValueError, match="rewards"):
        grpo_advantages(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="group_ids"):
        grpo_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="integer"):
        grpo_advantages(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="token_counts"):
        reinforce_pp_advantages(torch.zeros(3), token_counts=torch.ones(2))
    with pytest.raises(ValueError, match="trajectories"):
        broadcast_to_tokens(torch.zeros(3), torch.ones(2, 4))
