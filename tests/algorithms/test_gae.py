"""GAE: the reference loop against hand-computed values, the chunked scan against the reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algorithms.gae import discounted_reverse_cumsum, gae, gae_reference

unit = st.floats(0.0, 1.0)
coefficients = st.one_of(st.sampled_from([0.0, 1.0, 0.5, 0.99]), unit)


def test_reference_matches_hand_computed_values() -> None:
    # Three steps, gamma 0.9, lam 0.5, terminal after the last step.
    r, v = [1.0, 0.0, 2.0], [0.5, 1.0, 1.5]
    d2 = 2.0 + 0.9 * 0.0 - 1.5
    d1 = 0.0 + 0.9 * 1.5 - 1.0
    d0 = 1.0 + 0.9 * 1.0 - 0.5
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    advantages, returns = gae_reference(r, v, gamma=0.9, lam=0.5)
    assert advantages == pytest.approx([a0, a1, a2])
    assert returns == pytest.approx([a0 + 0.5, a1 + 1.0, a2 + 1.5])


def test_reference_limits_are_td_and_monte_carlo() -> None:
    r, v = [1.0, -2.0, 3.0, 0.5], [0.3, -0.1, 0.7, 0.2]
    td, _ = gae_reference(r, v, gamma=0.8, lam=0.0)
    next_v = [*v[1:], 0.0]
    assert td == pytest.approx([r[t] + 0.8 * next_v[t] - v[t] for t in range(4)])
    mc, returns = gae_reference(r, v, gamma=0.8, lam=1.0)
    to_go = [sum(0.8 ** (k - t) * r[k] for k in range(t, 4)) for t in range(4)]
    assert returns == pytest.approx(to_go)
    assert mc == pytest.approx([g - v[t] for t, g in enumerate(to_go)])


def test_reference_skips_mask_zero_positions_and_bootstraps() -> None:
    # Steps at positions 0, 3 and 4; positions 1-2 are a tool result, 5 is padding.
    r = [1.0, 99.0, 99.0, 0.0, 2.0, 99.0]
    v = [0.5, 99.0, 99.0, 1.0, 1.5, 99.0]
    mask = [1, 0, 0, 1, 1, 0]
    got, returns = gae_reference(r, v, gamma=0.9, lam=0.5, mask=mask, last_value=4.0)
    dense, dense_returns = gae_reference(
        [1.0, 0.0, 2.0], [0.5, 1.0, 1.5], gamma=0.9, lam=0.5, last_value=4.0
    )
    assert [got[i] for i in (0, 3, 4)] == pytest.approx(dense)
    assert [returns[i] for i in (0, 3, 4)] == pytest.approx(dense_returns)
    assert [got[i] for i in (1, 2, 5)] == [0.0, 0.0, 0.0]


@st.composite
def batches(draw):
    """A float64 batch with ragged rows, holes in the mask, and edge-case coefficients."""
    b = draw(st.integers(1, 4))
    t = draw(st.integers(0, 70))
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(b, t, generator=g, dtype=torch.float64)
    values = torch.randn(b, t, generator=g, dtype=torch.float64)
    density = draw(st.sampled_from([0.0, 0.3, 0.8, 1.0]))
    mask = torch.rand(b, t, generator=g) < density
    lengths = [draw(st.integers(0, t)) for _ in range(b)]
    for row, n in enumerate(lengths):
        mask[row, n:] = False  # right padding of a different length per row
    last_values = torch.randn(b, generator=g, dtype=torch.float64)
    return rewards, values, mask, last_values


@settings(max_examples=150, deadline=None)
@given(batches(), coefficients, coefficients, st.integers(2, 9), st.booleans())
def test_chunked_scan_matches_reference(batch, gamma, lam, chunk, bootstrap) -> None:
    rewards, values, mask, last_values = batch
    advantages, returns = gae(
        rewards,
        values,
        mask,
        gamma=gamma,
        lam=lam,
        chunk=chunk,
        last_values=last_values if bootstrap else None,
    )
    assert advantages.dtype == returns.dtype == torch.float64
    for row in range(rewards.shape[0]):
        ref_adv, ref_ret = gae_reference(
            rewards[row].tolist(),
            values[row].tolist(),
            gamma=gamma,
            lam=lam,
            mask=mask[row].int().tolist(),
            last_value=float(last_values[row]) if bootstrap else 0.0,
        )
        expected = torch.tensor([ref_adv, ref_ret], dtype=torch.float64).reshape(2, -1)
        got = torch.stack([advantages[row], returns[row]])
        torch.testing.assert_close(got, expected, atol=1e-9, rtol=1e-9)


@settings(max_examples=50, deadline=None)
@given(batches(), coefficients, coefficients, st.data())
def test_mask_zero_tokens_do_not_change_advantages(batch, gamma, lam, data) -> None:
    """Inserting environment tokens (mask 0, any reward and value) changes nothing for the steps."""
    rewards, values, mask, _ = batch
    extra = data.draw(st.integers(1, 5))
    at = data.draw(st.integers(0, rewards.shape[1]))
    junk = torch.full((rewards.shape[0], extra), 1e3, dtype=torch.float64)

    def insert(x: torch.Tensor, filler: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, :at], filler, x[:, at:]], dim=1)

    base_adv, base_ret = gae(rewards, values, mask, gamma=gamma, lam=lam, chunk=4)
    adv, ret = gae(
        insert(rewards, junk),
        insert(values, -junk),
        insert(mask, torch.zeros_like(junk, dtype=torch.bool)),
        gamma=gamma,
        lam=lam,
        chunk=4,
    )
    keep = torch.ones(adv.shape[1], dtype=torch.bool)
    keep[at : at + extra] = False
    torch.testing.assert_close(adv[:, keep], base_adv, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(ret[:, keep], base_ret, atol=1e-9, rtol=1e-9)
    assert (adv[:, ~keep] == 0).all() and (ret[:, ~keep] == 0).all()


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (1.0, 0.95), (0.99, 0.95), (0.5, 0.0)])
def test_float32_long_sequences_stay_close_to_float64_reference(gamma: float, lam: float) -> None:
    g = torch.Generator().manual_seed(0)
    t = 5000
    rewards = torch.zeros(2, t)
    rewards[:, torch.randint(0, t, (40,), generator=g)] = 1.0  # sparse turn rewards
    values = torch.rand(2, t, generator=g)
    mask = torch.rand(2, t, generator=g) < 0.7
    mask[1, 3000:] = False
    advantages, returns = gae(
        rewards, values, mask, gamma=gamma, lam=lam
    )  # default chunk: 2 levels
    assert advantages.dtype == torch.float32
    for row in range(2):
        ref_adv, ref_ret = gae_reference(
            rewards[row].double().tolist(),
            values[row].double().tolist(),
            gamma=gamma,
            lam=lam,
            mask=mask[row].int().tolist(),
        )
        scale = max(1.0, max(abs(x) for x in ref_ret))
        tol = 1e-5 * scale
        assert (advantages[row].double() - torch.tensor(ref_adv)).abs().max() < tol
        assert (returns[row].double() - torch.tensor(ref_ret)).abs().max() < tol


def test_outputs_have_no_gradient_and_bf16_is_scored_in_float32() -> None:
    values = torch.randn(2, 10, requires_grad=True)
    rewards = torch.randn(2, 10)
    advantages, returns = gae(
        rewards.bfloat16(), values.bfloat16(), torch.ones(2, 10), gamma=1.0, lam=1.0
    )
    assert advantages.dtype == returns.dtype == torch.float32
    assert not advantages.requires_grad and not returns.requires_grad


def test_empty_and_fully_masked_batches() -> None:
    for shape in [(0, 5), (3, 0), (2, 7)]:
        advantages, returns = gae(
            torch.ones(shape), torch.ones(shape), torch.zeros(shape), gamma=1.0, lam=1.0
        )
        assert advantages.shape == returns.shape == shape
        assert (advantages == 0).all() and (returns == 0).all()


def test_rejects_bad_arguments() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="gamma"):
        gae(x, x, x, gamma=1.1, lam=0.5)
    with pytest.raises(ValueError, match="lam"):
        gae(x, x, x, gamma=0.9, lam=-0.1)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        gae(x, torch.zeros(2, 4), x, gamma=0.9, lam=0.5)
    with pytest.raises(ValueError, match="last_values"):
        gae(x, x, x, gamma=0.9, lam=0.5, last_values=torch.zeros(3))
    with pytest.raises(ValueError, match="chunk"):
        gae(x, x, x, gamma=0.9, lam=0.5, chunk=1)
    with pytest.raises(ValueError, match="rewards"):
        gae_reference([1.0], [1.0, 2.0], gamma=1.0, lam=1.0)


def reverse_loop(x: torch.Tensor, c: float) -> torch.Tensor:
    out, running = torch.zeros_like(x), x.new_zeros(x.shape[0])
    for t in reversed(range(x.shape[1])):
        running = x[:, t] + c * running
        out[:, t] = running
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 300), unit, st.integers(2, 17), st.integers(0, 2**31))
def test_discounted_reverse_cumsum_matches_definition(length, c, chunk, seed) -> None:
    x = torch.randn(3, length, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(discounted_reverse_cumsum(x, c, chunk), reverse_loop(x, c))


@pytest.mark.parametrize("c", [1e-3, 1e-200, 0.0])
def test_discount_powers_that_underflow_stay_exact(c: float) -> None:
    # c^256 underflows to 0 (float64 and float32); carries across chunks must then vanish cleanly.
    x = torch.randn(2, 2000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(discounted_reverse_cumsum(x, c, 256), reverse_loop(x, c))
    got32 = discounted_reverse_cumsum(x.float(), c, 256)
    torch.testing.assert_close(got32, reverse_loop(x, c).float())
