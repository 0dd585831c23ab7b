"""Importance weights (TIS/MIS, token and sequence), rejection (token and geometric), mismatch
metrics, staleness bounds."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algorithms.off_policy import (
    importance_weights,
    mismatch_metrics,
    rejection_mask,
    staleness,
    staleness_policy,
)


@st.composite
def logprob_pairs(draw):
    """Trainer and engine log-probs (N, T) float32 and a ragged 0/1 mask (N, T) int64."""
    n, t = draw(st.integers(1, 5)), draw(st.integers(1, 8))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    engine = -torch.rand(n, t, generator=g) * 4
    gap = draw(st.sampled_from([0.0, 0.01, 0.3, 2.0, 40.0]))
    trainer = engine + gap * torch.randn(n, t, generator=g)
    mask = (torch.rand(n, t, generator=g) < draw(st.sampled_from([0.0, 0.6, 1.0]))).long()
    return trainer, engine, mask


caps = st.sampled_from([1.0, 1.5, 2.0, 10.0])


def per_level_log_ratio(trainer, engine, mask, level):
    """(N, T) float64 log-ratio at the requested level, by row loops."""
    d = ((trainer.double() - engine.double()) * mask).tolist()
    out = []
    for row, m in zip(d, mask.tolist(), strict=True):
        if level == "token":
            out.append(row)
        else:
            total = sum(row)
            if level == "geometric":
                total /= max(sum(m), 1)
            out.append([total] * len(row))
    return torch.tensor(out, dtype=torch.float64)


@settings(max_examples=200, deadline=None)
@given(logprob_pairs(), caps, st.sampled_from(["token", "sequence"]))
def test_tis_is_the_ratio_truncated_at_cap(data, cap, level) -> None:
    trainer, engine, mask = data
    weights, metrics = importance_weights(trainer, engine, mask, mode="tis", level=level, cap=cap)
    rho = per_level_log_ratio(trainer, engine, mask, level).clamp(-20, 20).exp()
    expected = torch.minimum(rho, torch.tensor(cap, dtype=torch.float64)) * mask
    torch.testing.assert_close(weights.double(), expected, rtol=1e-5, atol=1e-6)
    assert ((weights > 0) == (mask > 0)).all()  # truncated, never zeroed
    assert (weights <= cap * (1 + 1e-6)).all()
    truncated = float(((rho > cap) & (mask > 0)).sum()) / max(int(mask.sum()), 1)
    assert metrics["truncated_fraction"].item() == pytest.approx(truncated, abs=1e-6)
    assert metrics["masked_fraction"].item() == 0


@settings(max_examples=200, deadline=None)
@given(logprob_pairs(), caps, st.sampled_from(["token", "sequence"]), st.booleans())
def test_mis_keeps_the_ratio_inside_the_band_and_zeroes_the_rest(data, cap, level, two_sided):
    trainer, engine, mask = data
    lower = 1 / cap if two_sided else 0.0
    weights, metrics = importance_weights(
        trainer, engine, mask, mode="mis", level=level, cap=cap, lower=lower
    )
    rho = per_level_log_ratio(trainer, engine, mask, level).clamp(-20, 20).exp()
    # Leave ratios within float32 rounding of the band's edges out of the comparison.
    near_edge = ((rho - cap).abs() < 1e-4 * cap) | ((rho - lower).abs() < 1e-4)
    inside = (rho <= cap) & (rho >= lower)
    expected = torch.where(inside, rho, 0.0) * mask
    torch.testing.assert_close(
        weights.double()[~near_edge], expected[~near_edge], rtol=1e-5, atol=1e-6
    )
    on = weights > 0
    assert (weights[on] <= cap * (1 + 1e-6)).all() and (weights[on] >= lower * (1 - 1e-6)).all()
    if level != "token":  # a sequence is kept or masked as a whole
        for row in range(weights.shape[0]):
            kept = weights[row][mask[row] > 0] > 0
            assert kept.all() or not kept.any()
    assert metrics["truncated_fraction"].item() == 0


def test_sequence_weight_is_the_product_of_token_ratios() -> None:
    engine = torch.log(torch.tensor([[0.5, 0.5, 0.9, 0.1]]))
    trainer = torch.log(torch.tensor([[0.6, 0.4, 0.9, 0.7]]))
    mask = torch.tensor([[1, 1, 1, 0]])
    product = (0.6 / 0.5) * (0.4 / 0.5) * 1.0  # = 0.96; the masked 7x is not part of it
    weights, _ = importance_weights(trainer, engine, mask, mode="tis", level="sequence", cap=5)
    assert weights[0].tolist() == pytest.approx([product] * 3 + [0.0], rel=1e-5)


def test_mis_is_two_sided_by_default() -> None:
    # Token ratios 0.4, 1.0, 1.9, 2.5 against the default band [0.5, 2]: 0.4 is below the lower
    # bound and 2.5 above the cap, so both weigh 0; the others keep their ratio.
    engine = torch.zeros(1, 4)
    trainer = torch.log(torch.tensor([[0.4, 1.0, 1.9, 2.5]]))
    mask = torch.ones(1, 4)
    weights, metrics = importance_weights(trainer, engine, mask, mode="mis")
    assert weights[0].tolist() == pytest.approx([0.0, 1.0, 1.9, 0.0], rel=1e-6)
    assert metrics["masked_fraction"].item() == pytest.approx(2 / 4)
    # lower=0 is the one-sided (Liu et al.) form: 0.4 is kept, 2.5 still masked.
    weights, _ = importance_weights(trainer, engine, mask, mode="mis", lower=0.0)
    assert weights[0].tolist() == pytest.approx([0.4, 1.0, 1.9, 0.0], rel=1e-6)


def test_geometric_level_is_no_importance_weight() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="rejection_mask"):
        importance_weights(x, x, x, level="geometric")  # type: ignore[arg-type]


def test_long_sequences_do_not_overflow() -> None:
    # 10k tokens each 0.05 nats apart: the sequence ratio is e^500, the geometric one e^0.05.
    engine = torch.full((2, 10_000), -1.0)
    trainer = engine + 0.05
    mask = torch.ones(2, 10_000)
    for mode in ("tis", "mis", "none"):
        for level in ("token", "sequence"):
            weights, metrics = importance_weights(trainer, engine, mask, mode=mode, level=level)
            assert torch.isfinite(weights).all()
            assert all(torch.isfinite(v) for v in metrics.values())
    weights, _ = importance_weights(trainer, engine, mask, mode="mis", level="sequence")
    assert (weights == 0).all()
    # e^0.05 = 1.051: outside the default geometric band [0.999, 1.001], inside [0.5, 2].
    accepted, _ = rejection_mask(trainer, engine, mask, level="geometric")
    assert not accepted.any()
    accepted, _ = rejection_mask(trainer, engine, mask, level="geometric", low=0.5, high=2.0)
    assert accepted.all()


# --- rejection -----------------------------------------------------------------------------------


def test_geometric_rejection_accepts_or_rejects_whole_sequences() -> None:
    # Per-token log-ratios (trainer - engine) of four sequences, 3 loss tokens each:
    #   0: log 0.5 on each token   -> geometric ratio exactly 0.5  -> rejected (low); a TIS or
    #      MIS weight at the geometric level would have kept it at weight 0.5
    #   1: +0.002, -0.001, -0.001  -> mean 0, ratio 1              -> accepted, although two of
    #      its token ratios (e^0.002 = 1.002, e^-0.001 = 0.9990005) are outside [0.999, 1.001]
    #   2: +0.006, 0, 0            -> mean 0.002, ratio 1.002 > 1.001 -> rejected (high)
    #   3: +0.0006, 0, 0 and a 4th token off the mask at +5 -> mean 0.0002 over its 3 loss tokens,
    #      ratio 1.0002                                        -> accepted
    half = math.log(0.5)
    d = torch.tensor(
        [
            [half, half, half, 0.0],
            [0.002, -0.001, -0.001, 0.0],
            [0.006, 0.0, 0.0, 0.0],
            [0.0006, 0.0, 0.0, 5.0],
        ],
        dtype=torch.float64,
    )
    engine = torch.full((4, 4), -2.0, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]] * 4)
    accepted, metrics = rejection_mask(engine + d, engine, mask, level="geometric")
    assert accepted.tolist() == [
        [False] * 4,
        [True] * 3 + [False],
        [False] * 4,
        [True] * 3 + [False],
    ]
    assert metrics["rejected_fraction"].item() == pytest.approx(6 / 12)
    assert metrics["rejected_low_fraction"].item() == pytest.approx(3 / 12)
    assert metrics["rejected_high_fraction"].item() == pytest.approx(3 / 12)
    # Bounds wide enough for 0.5: [0.4, 1.001] keeps sequence 0, still rejects sequence 2.
    accepted, _ = rejection_mask(engine + d, engine, mask, level="geometric", low=0.4)
    assert accepted[:, 0].tolist() == [True, True, False, True]


def test_token_rejection_uses_icepop_bounds() -> None:
    # Token ratios 0.4, 0.5, 1.0, 4.9, 5.2 against the default token band [0.5, 5]: the first
    # and the last leave it. A 6th token off the mask (ratio 100) is neither accepted nor counted.
    engine = torch.zeros(1, 6)
    trainer = torch.log(torch.tensor([[0.4, 0.5, 1.0, 4.9, 5.2, 100.0]]))
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    accepted, metrics = rejection_mask(trainer, engine, mask, level="token")
    assert accepted[0].tolist() == [False, True, True, True, False, False]
    assert metrics["rejected_fraction"].item() == pytest.approx(2 / 5)
    assert metrics["rejected_low_fraction"].item() == pytest.approx(1 / 5)


def test_rejection_rejects_bad_bounds_and_levels() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"low <= 1 <= high"):
        rejection_mask(x, x, x, level="token", low=1.2)
    with pytest.raises(ValueError, match=r"low <= 1 <= high"):
        rejection_mask(x, x, x, level="geometric", low=1.0, high=1.0)
    with pytest.raises(ValueError, match="rejection level"):
        rejection_mask(x, x, x, level="sequence")  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(logprob_pairs(), st.sampled_from(["tis", "mis", "none"]))
def test_identical_log_probs_give_the_mask(data, mode) -> None:
    _, engine, mask = data
    weights, metrics = importance_weights(engine.clone(), engine, mask, mode=mode, level="sequence")
    assert torch.equal(weights, mask.float())
    assert metrics["ess"].item() == pytest.approx(1.0 if mask.any() else 0.0)


def test_weights_carry_no_gradient_and_padding_garbage_is_ignored() -> None:
    trainer = torch.tensor([[-1.0, torch.nan, -torch.inf]], requires_grad=True)
    engine = torch.tensor([[-1.2, -torch.inf, torch.inf]])
    mask = torch.tensor([[1, 0, 0]])
    weights, metrics = importance_weights(trainer, engine, mask, mode="tis")
    assert not weights.requires_grad
    assert weights.tolist()[0] == pytest.approx([math.exp(0.2), 0.0, 0.0], rel=1e-6)
    assert all(torch.isfinite(v) for v in metrics.values())
    assert all(torch.isfinite(v) for v in mismatch_metrics(trainer, engine, mask).values())


def test_ess_reflects_weight_spread() -> None:
    engine = torch.zeros(1, 4)
    trainer = torch.log(torch.tensor([[1.0, 1.0, 1.0, 4.0]]))
    _, metrics = importance_weights(trainer, engine, torch.ones(1, 4), mode="tis", cap=10)
    assert metrics["ess"].item() == pytest.approx(7**2 / (4 * 19))
    assert metrics["ratio_max"].item() == pytest.approx(4.0)
    assert metrics["weight_mean"].item() == pytest.approx(7 / 4)


def test_rejects_bad_arguments() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="cap"):
        importance_weights(x, x, x, cap=0.5)
    with pytest.raises(ValueError, match="lower"):
        importance_weights(x, x, x, mode="mis", lower=2.0)
    with pytest.raises(ValueError, match="mode"):
        importance_weights(x, x, x, mode="is")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="level"):
        importance_weights(x, x, x, level="turn")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one shape"):
        importance_weights(x, torch.zeros(2, 4), x)


# --- mismatch metrics ------------------------------------------------------------------------------


def test_mismatch_metrics_by_hand() -> None:
    engine = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    trainer = torch.tensor([[-1.1, -1.8, -3.0], [-0.5, -0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    m = mismatch_metrics(trainer, engine, mask)
    diffs = [-0.1, 0.2, 0.0, 0.0, 0.3]
    assert m["mean_abs"].item() == pytest.approx(sum(abs(d) for d in diffs) / 5, rel=1e-5)
    assert m["max_abs"].item() == pytest.approx(0.3, rel=1e-5)
    assert m["kl"].item() == pytest.approx(sum(math.exp(d) - 1 - d for d in diffs) / 5, rel=1e-4)
    assert m["n_tokens"].item() == 5


@settings(max_examples=100, deadline=None)
@given(logprob_pairs())
def test_mismatch_metrics_are_nonnegative_and_zero_only_without_a_gap(data) -> None:
    trainer, engine, mask = data
    m = mismatch_metrics(trainer, engine, mask)
    assert m["kl"].item() >= 0 and m["mean_abs"].item() >= 0
    assert m["max_abs"].item() >= m["mean_abs"].item() - 1e-6
    same = mismatch_metrics(engine, engine, mask)
    assert all(same[k].item() == 0 for k in ("mean_abs", "max_abs", "kl"))


def test_kl_metric_estimates_the_exact_kl_from_engine_samples() -> None:
    g = torch.Generator().manual_seed(0)
    engine = torch.randn(40, generator=g, dtype=torch.float64).log_softmax(-1)
    trainer = (engine + 0.2 * torch.randn(40, generator=g, dtype=torch.float64)).log_softmax(-1)
    exact = float((engine.exp() * (engine - trainer)).sum())  # KL(engine || trainer)
    samples = torch.multinomial(engine.exp(), 100_000, replacement=True, generator=g)
    got = mismatch_metrics(trainer[samples][None], engine[samples][None], torch.ones(1, 100_000))
    assert got["kl"].item() == pytest.approx(exact, rel=0.05)


# --- staleness -------------------------------------------------------------------------------------


def test_staleness_counts_versions_behind() -> None:
    versions = torch.tensor([[-1, -1, 3, 3, 5], [-1, 0, 1, 2, -1]])
    assert staleness(versions, 5).tolist() == [[0, 0, 2, 2, 0], [0, 5, 4, 3, 0]]
    with pytest.raises(ValueError, match=r"\[-1, 4\]"):
        staleness(versions, 4)  # a token from weights the trainer has not made
    with pytest.raises(ValueError, match=r"\[-1, 5\]"):
        staleness(torch.tensor([[-2]]), 5)


# Row 0: prompt then tokens of version 7 (current). Row 1: a partial rollout across 5 -> 6 -> 7.
# Row 2: all version 4. Row 3: padding only.
VERSIONS = torch.tensor(
    [[-1, -1, 7, 7, 7], [-1, 5, 5, 6, 7], [-1, -1, 4, 4, -1], [-1, -1, -1, -1, -1]]
)
MASK = (VERSIONS >= 0).long()


@pytest.mark.parametrize(
    ("mode", "bound", "keep", "expected_mask"),
    [
        ("drop", 0, [1, 0, 0, 1], [[0, 0, 1, 1, 1], [0] * 5, [0] * 5, [0] * 5]),
        ("drop", 2, [1, 1, 0, 1], [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [0] * 5, [0] * 5]),
        ("drop", 3, [1, 1, 1, 1], MASK.tolist()),
        ("mask", 1, [1, 1, 1, 1], [[0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [0] * 5, [0] * 5]),
        ("importance", 0, [1, 1, 1, 1], MASK.tolist()),
    ],
)
def test_staleness_policy_modes(mode, bound, keep, expected_mask) -> None:
    decision = staleness_policy(VERSIONS, MASK, 7, max_staleness=bound, mode=mode)
    assert decision.loss_mask.tolist() == expected_mask
    assert decision.loss_mask.dtype == MASK.dtype
    assert decision.keep.tolist() == [bool(k) for k in keep]
    lag = 7 - VERSIONS
    stale = (lag > bound) & (MASK > 0)
    assert torch.equal(decision.stale, stale)
    assert decision.metrics["masked_tokens"].item() == int((MASK - decision.loss_mask).sum())
    assert decision.metrics["dropped_trajectories"].item() == int((~decision.keep).sum())
    assert decision.metrics["staleness_max"].item() == 3
    assert decision.metrics["stale_token_fraction"].item() == pytest.approx(
        int(stale.sum()) / int(MASK.sum())
    )


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 8),
    st.integers(0, 2**31),
    st.integers(0, 4),
    st.sampled_from(["drop", "mask", "importance"]),
)
def test_staleness_policy_rules(n, t, seed, bound, mode) -> None:
    g = torch.Generator().manual_seed(seed)
    current = 6
    versions = torch.randint(-1, current + 1, (n, t), generator=g)
    mask = ((versions >= 0) & (torch.rand(n, t, generator=g) < 0.9)).long()
    d = staleness_policy(versions, mask, current, max_staleness=bound, mode=mode)
    assert (d.loss_mask <= mask).all()  # never adds tokens
    kept = d.loss_mask > 0
    assert (current - versions[kept] <= bound).all() or mode == "importance"
    if mode == "drop":
        for row in range(n):
            assert torch.equal(d.loss_mask[row], mask[row]) == bool(d.keep[row])
    if bound >= current:  # nothing can be stale
        assert torch.equal(d.loss_mask, mask) and not d.stale.any()


def test_staleness_policy_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="version -1"):
        staleness_policy(torch.tensor([[-1, 3]]), torch.tensor([[1, 1]]), 3, max_staleness=1)
    with pytest.raises(ValueError, match="max_staleness"):
        staleness_policy(VERSIONS, MASK, 7, max_staleness=-1)
    with pytest.raises(ValueError, match="mode"):
        staleness_policy(VERSIONS, MASK, 7, max_staleness=1, mode="skip")  # type: ignore[arg-type]
