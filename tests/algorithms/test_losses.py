"""PPO-clip (with dual-clip), GSPO, CISPO, aggregation over micro-batches, KL estimators and
entropy."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentrl.algorithms.losses import (
    aggregate,
    entropy_from_logits,
    kl_penalty,
    loss_denominator,
    policy_loss,
)

AGGS = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@st.composite
def rollouts(draw, max_n: int = 6, max_t: int = 7):
    """Log-probs, old log-probs, advantages (N, T) float64 and a ragged 0/1 mask (N, T)."""
    n = draw(st.integers(1, max_n))
    t = draw(st.integers(1, max_t))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    old = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3
    spread = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    logprobs = old + spread * torch.randn(n, t, generator=g, dtype=torch.float64)
    if draw(st.booleans()):  # sequence-level advantages, as GRPO gives
        advantages = torch.randn(n, 1, generator=g, dtype=torch.float64).expand(n, t).clone()
    else:
        advantages = torch.randn(n, t, generator=g, dtype=torch.float64)
    mask = (torch.rand(n, t, generator=g) < draw(st.sampled_from([0.5, 0.9, 1.0]))).long()
    if draw(st.booleans()):
        mask[0] = 0  # a trajectory with nothing to train on (dropped, or all environment tokens)
    return logprobs, old, advantages, mask


def ppo_by_hand(
    logprobs, old, advantages, mask, clip_low, clip_high, agg, norm_length=None, clip_ratio_c=None
):
    """Token loop over the documented formulas."""
    n, t = logprobs.shape
    total, per_seq = 0.0, []
    for i in range(n):
        tokens = []
        for j in range(t):
            if not mask[i, j]:
                continue
            rho = math.exp(float(logprobs[i, j] - old[i, j]))
            a = float(advantages[i, j])
            clipped = min(max(rho, 1 - clip_low), 1 + clip_high)
            loss = max(-a * rho, -a * clipped)
            if clip_ratio_c is not None and a < 0:
                loss = min(loss, -a * clip_ratio_c)
            tokens.append(loss)
        total += sum(tokens)
        if tokens:
            per_seq.append(sum(tokens) / len(tokens))
    n_tokens, n_seqs = int(mask.sum()), len(per_seq)
    if agg == "token-mean":
        return total / max(n_tokens, 1)
    if agg == "seq-mean-token-sum":
        return total / max(n_seqs, 1)
    if agg == "seq-mean-token-mean":
        return sum(per_seq) / max(n_seqs, 1)
    return total / (n_seqs * norm_length) if n_seqs else 0.0


clips = st.tuples(st.sampled_from([0.0, 0.1, 0.2]), st.sampled_from([0.0, 0.2, 0.28, 1.0]))


@settings(max_examples=150, deadline=None)
@given(rollouts(), clips, st.sampled_from(AGGS), st.sampled_from([None, 1.5, 3.0]))
def test_ppo_matches_the_formula(data, clip, agg, clip_ratio_c) -> None:
    logprobs, old, advantages, mask = data
    loss, _ = policy_loss(
        logprobs,
        old,
        advantages,
        mask,
        clip_low=clip[0],
        clip_high=clip[1],
        clip_ratio_c=clip_ratio_c,
        agg=agg,
        norm_length=9,
    )
    expected = ppo_by_hand(
        logprobs, old, advantages, mask, *clip, agg, norm_length=9, clip_ratio_c=clip_ratio_c
    )
    assert loss.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    ("ratio", "advantage", "clip_high", "clipped"),
    [
        (1.25, 1.0, 0.2, True),  # PPO: pushing a likely token higher stops at 1.2
        (1.25, 1.0, 0.28, False),  # DAPO clip-higher: room up to 1.28
        (1.25, -1.0, 0.2, False),  # lowering a token whose ratio grew is never clipped
        (0.75, -1.0, 0.28, True),  # the low side clips at 1 - clip_low = 0.8
        (0.75, 1.0, 0.28, False),
    ],
)
def test_asymmetric_clip(ratio: float, advantage: float, clip_high: float, clipped: bool) -> None:
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    logprobs = (old + math.log(ratio)).requires_grad_()
    loss, metrics = policy_loss(
        logprobs, old, torch.tensor([[advantage]]).double(), torch.ones(1, 1), clip_high=clip_high
    )
    loss.backward()
    assert (logprobs.grad.abs().item() == 0) is clipped
    assert metrics["clip_fraction"].item() == float(clipped)
    side = "clip_high_fraction" if ratio > 1 else "clip_low_fraction"
    assert metrics[side].item() == float(clipped)


@pytest.mark.parametrize(
    ("ratio", "advantage", "clip_ratio_c", "loss", "grad"),
    [
        # A < 0, ratio 5 past clip_ratio_c 3: loss min(max(5, 5), 3) = 3, constant: no gradient
        (5.0, -1.0, 3.0, 3.0, 0.0),
        # without dual-clip: loss -A * r = 5, d/dlogp (-A * e^(logp - old)) = -A * r = 5
        (5.0, -1.0, None, 5.0, 5.0),
        # ratio 2 is below clip_ratio_c: loss 2, gradient 2, dual-clip or not
        (2.0, -1.0, 3.0, 2.0, 2.0),
        # A > 0 never dual-clips: ratio 5 is clipped at 1.28 as usual, loss -1.28, no gradient
        (5.0, 1.0, 3.0, -1.28, 0.0),
    ],
)
def test_dual_clip_bounds_negative_advantage_tokens(ratio, advantage, clip_ratio_c, loss, grad):
    old = torch.tensor([[-2.0]], dtype=torch.float64)
    logprobs = (old + math.log(ratio)).requires_grad_()
    got, metrics = policy_loss(
        logprobs,
        old,
        torch.tensor([[advantage]], dtype=torch.float64),
        torch.ones(1, 1),
        clip_high=0.28,
        clip_ratio_c=clip_ratio_c,
    )
    got.backward()
    assert got.item() == pytest.approx(loss)
    assert logprobs.grad.item() == pytest.approx(grad)
    assert metrics["clip_dual_fraction"].item() == float(grad == 0 and advantage < 0)


def test_cispo_by_hand() -> None:
    # Ratios 0.5, 1.0, 1.5 (to old), advantages 1, -1, 2, log-probs log 0.1, log 0.3, log 0.6.
    # No lower bound (clip_low = 1) and clip_high 0.28: weights sg(clip(r)) = 0.5, 1.0, 1.28.
    # Per token -w A logp: 0.5 * 2.302585 = 1.151293, -1 * -1 * -1.203973 = -1.203973,
    # -1.28 * 2 * -0.510826 = 1.307714; token-mean (1.151293 - 1.203973 + 1.307714) / 3 = 0.418344.
    # d loss / d logp_t = -w_t A_t / 3 = -0.5/3, 1/3, -2.56/3: the third token, which PPO would
    # clip out (r > 1.28 with A > 0), keeps a gradient.
    logprobs = torch.log(torch.tensor([[0.1, 0.3, 0.6]], dtype=torch.float64)).requires_grad_()
    old = logprobs.detach() - torch.log(torch.tensor([[0.5, 1.0, 1.5]], dtype=torch.float64))
    advantages = torch.tensor([[1.0, -1.0, 2.0]], dtype=torch.float64)
    mask = torch.ones(1, 3)
    loss, metrics = policy_loss(
        logprobs, old, advantages, mask, kind="cispo", clip_low=1.0, clip_high=0.28
    )
    loss.backward()
    assert loss.item() == pytest.approx(0.418344446, rel=1e-8)
    assert logprobs.grad[0].tolist() == pytest.approx([-0.5 / 3, 1 / 3, -2.56 / 3])
    assert metrics["clip_fraction"].item() == pytest.approx(1 / 3)  # only 1.5 is clipped
    assert metrics["clip_high_fraction"].item() == pytest.approx(1 / 3)
    # A lower bound of 1 - 0.2 = 0.8 lifts the first weight to 0.8: gradient -0.8 / 3 there.
    logprobs.grad = None
    loss, metrics = policy_loss(
        logprobs, old, advantages, mask, kind="cispo", clip_low=0.2, clip_high=0.28
    )
    loss.backward()
    assert logprobs.grad[0, 0].item() == pytest.approx(-0.8 / 3)
    assert metrics["clip_low_fraction"].item() == pytest.approx(1 / 3)
    # PPO on the same tokens: the third token is clipped and gets no gradient.
    logprobs.grad = None
    policy_loss(logprobs, old, advantages, mask, kind="ppo", clip_high=0.28)[0].backward()
    assert logprobs.grad[0, 2].item() == 0


@settings(max_examples=100, deadline=None)
@given(rollouts(), st.sampled_from(["ppo", "gspo", "cispo"]))
def test_on_policy_gradient_is_the_policy_gradient(data, kind) -> None:
    """At old == current the ratio is 1, nothing clips, and d loss / d logp = -A / D."""
    _, old, advantages, mask = data
    logprobs = old.clone().requires_grad_()
    loss, metrics = policy_loss(logprobs, old, advantages, mask, kind=kind, agg="token-mean")
    loss.backward()
    # GSPO too: s_i,t is 1 in value and its gradient reaches each token through its own log-prob.
    expected = -advantages * mask / max(int(mask.sum()), 1)
    torch.testing.assert_close(logprobs.grad, expected)
    assert metrics["clip_fraction"].item() == 0
    assert metrics["ratio_mean"].item() == pytest.approx(float(mask.any()))


@settings(max_examples=150, deadline=None)
@given(rollouts(), clips)
def test_gspo_gradient_is_the_sequence_objective_gradient(data, clip) -> None:
    """GSPO-token with sequence advantages == GSPO's own sequence-level objective, in value and grad."""
    logprobs, old, advantages, mask = data
    seq_adv = advantages[:, :1].expand_as(advantages)
    lp_token = logprobs.clone().requires_grad_()
    loss, metrics = policy_loss(
        lp_token,
        old,
        seq_adv,
        mask,
        kind="gspo",
        clip_low=clip[0],
        clip_high=clip[1],
        agg="seq-mean-token-mean",
    )
    loss.backward()

    lp_seq = logprobs.clone().requires_grad_()
    m = mask.double()
    lengths = m.sum(-1)
    s = torch.exp(((lp_seq - old) * m).sum(-1) / lengths.clamp(min=1))  # (N,)
    a = seq_adv[:, 0]
    objective = torch.maximum(-a * s, -a * s.clamp(1 - clip[0], 1 + clip[1]))
    has_tokens = lengths > 0
    reference = objective[has_tokens].sum() / max(int(has_tokens.sum()), 1)
    reference.backward()
    assert loss.item() == pytest.approx(reference.item(), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(lp_token.grad, lp_seq.grad)
    # Clipping is per sequence: a clipped sequence gets no gradient on any token.
    clipped = (lp_token.grad * m).abs().sum(-1) == 0
    assert float(metrics["clip_fraction"]) == pytest.approx(
        float((m.sum(-1) * (clipped & has_tokens & (a != 0))).sum() / m.sum().clamp(min=1))
    )


@settings(max_examples=100, deadline=None)
@given(
    rollouts(max_n=8), st.sampled_from(AGGS), st.sampled_from(["ppo", "gspo", "cispo"]), st.data()
)
def test_micro_batches_with_the_global_denominator_equal_one_batch(data, agg, kind, draw) -> None:
    logprobs, old, advantages, mask = data
    n = logprobs.shape[0]
    cuts = sorted(
        draw.draw(st.lists(st.integers(1, n - 1), max_size=3, unique=True)) if n > 1 else []
    )
    bounds = [0, *cuts, n]
    pieces = [slice(a, b) for a, b in itertools.pairwise(bounds)]
    weights = torch.rand(n, logprobs.shape[1], dtype=torch.float64) + 0.5

    full = logprobs.clone().requires_grad_()
    kwargs = {"kind": kind, "agg": agg, "norm_length": 11, "clip_high": 0.28}
    loss, _ = policy_loss(full, old, advantages, mask, token_weights=weights, **kwargs)
    loss.backward()

    denominator = sum(loss_denominator(mask[p], agg, norm_length=11) for p in pieces)
    split = logprobs.clone().requires_grad_()
    total, sums = 0.0, 0.0
    for p in pieces:
        # Each micro-batch is padded to its own width, as a data loader would.
        width = int(mask[p].nonzero()[:, 1].max()) + 1 if mask[p].any() else 1
        piece, _ = policy_loss(
            split[p, :width],
            old[p, :width],
            advantages[p, :width],
            mask[p, :width],
            token_weights=weights[p, :width],
            denominator=denominator,
            **kwargs,
        )
        piece.backward()
        total += piece.item()
        piece_sum, _ = policy_loss(  # the (loss_sum, denominator) form: sums, divided at the end
            logprobs[p],
            old[p],
            advantages[p],
            mask[p],
            token_weights=weights[p],
            denominator=1,
            **kwargs,
        )
        sums += piece_sum.item()
    assert total == pytest.approx(loss.item(), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(split.grad, full.grad)
    if denominator > 0:
        assert sums / denominator.item() == pytest.approx(loss.item(), rel=1e-9, abs=1e-12)


def test_aggregation_modes_on_a_hand_example() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(16 / 4)
    assert aggregate(values, mask, "seq-mean-token-sum").item() == pytest.approx(16 / 2)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 10) / 2)
    got = aggregate(values, mask, "seq-mean-token-sum-norm", norm_length=8)
    assert got.item() == pytest.approx(16 / (2 * 8))
    assert aggregate(values, mask, "token-mean", denominator=32).item() == pytest.approx(0.5)


def test_norm_length_is_required_for_dr_grpo_aggregation() -> None:
    x = torch.ones(2, 3)
    with pytest.raises(ValueError, match="norm_length"):
        aggregate(x, x, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="norm_length"):
        aggregate(x, x, "seq-mean-token-sum-norm", denominator=4.0)
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(x, x, "sum")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["ppo", "gspo", "cispo"])
def test_garbage_at_padding_does_not_leak(kind: str) -> None:
    logprobs = torch.tensor([[-1.0, -0.5, -torch.inf], [-2.0, torch.nan, torch.inf]])
    logprobs.requires_grad_()
    old = torch.tensor([[-1.1, -0.4, torch.nan], [-2.0, -torch.inf, 5.0]])
    advantages = torch.tensor([[1.0, 1.0, torch.nan], [-1.0, torch.inf, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, metrics = policy_loss(logprobs, old, advantages, mask, kind=kind)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logprobs.grad).all()
    assert (logprobs.grad[mask == 0] == 0).all()
    assert all(torch.isfinite(v) for v in metrics.values())


def test_empty_mask_gives_zero_loss_with_a_graph() -> None:
    logprobs = torch.zeros(2, 3, requires_grad=True)
    for agg in AGGS:
        loss, metrics = policy_loss(
            logprobs, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3), agg=agg, norm_length=4
        )
        loss.backward()
        assert loss.item() == 0 and logprobs.grad.abs().sum() == 0
        assert all(v.item() == 0 for v in metrics.values())


def test_token_weights_scale_the_loss_and_get_no_gradient() -> None:
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.9]])
    adv = torch.tensor([[1.0, -0.5]])
    mask = torch.ones(1, 2)
    weights = torch.tensor([[2.0, 0.0]], requires_grad=True)
    plain, _ = policy_loss(logprobs, old, adv, mask, agg="seq-mean-token-sum")
    weighted, _ = policy_loss(
        logprobs, old, adv, mask, agg="seq-mean-token-sum", token_weights=weights
    )
    first_token = -1.0 * math.exp(0.1)  # ratio 1.105: not clipped
    assert weighted.item() == pytest.approx(2 * first_token)
    assert plain.item() != pytest.approx(weighted.item())
    weighted.backward()
    assert weights.grad is None


def test_ratio_metrics() -> None:
    old = torch.zeros(2, 3)
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.0], [2.0, 9.0, 1.0]]))
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    _, m = policy_loss(logprobs, old, torch.ones(2, 3), mask)
    assert m["ratio_max"].item() == pytest.approx(2.0)  # 9.0 is padding
    assert m["ratio_min"].item() == pytest.approx(0.5)
    assert m["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 1 + 2 + 1) / 5)
    assert m["clip_fraction"].item() == pytest.approx(2 / 5)  # 1.5 and 2.0 with A > 0
    expected_kl = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 1, 2, 1)) / 5
    assert m["approx_kl"].item() == pytest.approx(expected_kl, rel=1e-5)


def test_rejects_bad_arguments() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(x, x, torch.zeros(2, 4), x)
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss(x, x, x, x, clip_low=1.0)
    policy_loss(x, x, x, x, kind="cispo", clip_low=1.0)  # CISPO: no lower bound is allowed
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(x, x, x, x, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="kind"):
        policy_loss(x, x, x, x, kind="trpo")  # type: ignore[arg-type]


# --- KL estimators -------------------------------------------------------------------------------


@st.composite
def categorical_pairs(draw, max_shift: float = 3.0):
    """Policy and reference log-probs (V,) float64 over a small vocabulary."""
    v = draw(st.integers(2, 12))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    policy = torch.randn(v, generator=g, dtype=torch.float64) * draw(st.floats(0.0, 3.0))
    shift = torch.randn(v, generator=g, dtype=torch.float64) * draw(st.floats(0.0, max_shift))
    return policy, policy + shift


def expectation_under(policy_logits: torch.Tensor, per_token: torch.Tensor) -> torch.Tensor:
    """Exact E_{x ~ policy}[k(x)] by enumerating the vocabulary (no sampling error)."""
    return (policy_logits.log_softmax(-1).exp().detach() * per_token).sum()


def k3_is_unclamped(logp: torch.Tensor, ref: torch.Tensor) -> bool:
    """No token's k3 reaches the clamp at 10 (r = ref - logp < 2.6 and > -11)."""
    r = ref - logp
    return bool(((r < 2.6) & (r > -11)).all())


@settings(max_examples=200, deadline=None)
@given(categorical_pairs(max_shift=1.0))
def test_k1_and_k3_are_unbiased_and_k2_is_second_order(pair) -> None:
    policy_logits, ref_logits = pair
    logp, ref = policy_logits.log_softmax(-1), ref_logits.log_softmax(-1)
    assume(k3_is_unclamped(logp, ref))  # the clamp makes k3 biased beyond it, on purpose
    exact = float((logp.exp() * (logp - ref)).sum())  # KL(policy || ref)
    k = {kind: kl_penalty(logp[None], ref[None], kind)[0] for kind in ("k1", "k2", "k3")}
    assert float(expectation_under(policy_logits, k["k1"])) == pytest.approx(exact, abs=1e-9)
    assert float(expectation_under(policy_logits, k["k3"])) == pytest.approx(exact, abs=1e-9)
    # k2 - k3 = -(r^3 / 6) e^xi with |xi| <= |r|: the bias is third order in the log-ratio.
    r = ref - logp
    bound = float(expectation_under(policy_logits, r.abs() ** 3 * r.abs().exp() / 6))
    assert abs(float(expectation_under(policy_logits, k["k2"])) - exact) <= bound + 1e-9


@settings(max_examples=300, deadline=None)
@given(
    st.floats(-30, 5, allow_nan=False),
    st.floats(-30, 5, allow_nan=False),
    st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)
def test_k2_and_k3_are_nonnegative(logp: float, ref: float, dtype: torch.dtype) -> None:
    a, b = torch.tensor([[logp]], dtype=dtype), torch.tensor([[ref]], dtype=dtype)
    assert kl_penalty(a, b, "k2").item() >= 0
    assert kl_penalty(a, b, "k3").item() >= 0
    assert math.isfinite(kl_penalty(a, b, "k3").item())


@settings(max_examples=100, deadline=None)
@given(categorical_pairs(max_shift=1.0))
def test_kl_estimator_gradients(pair) -> None:
    """As loss terms: E[grad k1] = 0, E[grad k2] = grad KL(pi||ref), E[grad k3] = grad KL(ref||pi)."""
    policy_logits, ref_logits = pair
    ref = ref_logits.log_softmax(-1)
    assume(k3_is_unclamped(policy_logits.log_softmax(-1), ref))

    def grad_of(fn) -> torch.Tensor:
        theta = policy_logits.clone().requires_grad_()
        fn(theta).backward()
        return theta.grad

    def expected_estimator(kind):
        return lambda th: expectation_under(
            th, kl_penalty(th.log_softmax(-1)[None], ref[None], kind)[0]
        )

    def reverse_kl(th):
        lp = th.log_softmax(-1)
        return (lp.exp() * (lp - ref)).sum()

    def forward_kl(th):
        return (ref.exp() * (ref - th.log_softmax(-1))).sum()

    torch.testing.assert_close(grad_of(expected_estimator("k1")), torch.zeros_like(policy_logits))
    torch.testing.assert_close(grad_of(expected_estimator("k2")), grad_of(reverse_kl))
    torch.testing.assert_close(grad_of(expected_estimator("k3")), grad_of(forward_kl))


def test_sampled_estimates_agree_with_exact_kl_and_k3_has_lower_variance() -> None:
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(50, generator=g, dtype=torch.float64).log_softmax(-1)
    ref = (logp + 0.3 * torch.randn(50, generator=g, dtype=torch.float64)).log_softmax(-1)
    exact = float((logp.exp() * (logp - ref)).sum())
    samples = torch.multinomial(logp.exp(), 200_000, replacement=True, generator=g)
    for kind in ("k1", "k3"):
        k = kl_penalty(logp[samples][None], ref[samples][None], kind)[0]
        stderr = float(k.std()) / math.sqrt(k.numel())
        assert abs(float(k.mean()) - exact) < 4 * stderr
    k1 = kl_penalty(logp[samples][None], ref[samples][None], "k1")[0]
    k3 = kl_penalty(logp[samples][None], ref[samples][None], "k3")[0]
    assert float(k3.var()) < float(k1.var())


def test_k3_is_clamped_at_10_like_verls_low_var_kl() -> None:
    # r = ref - logp. r = 1: k3 = e - 1 - 1 = 0.718282, d k3 / d logp = -(e^r - 1) = -1.718282.
    # r = -15: e^-15 + 14 = 14.0000003 -> 10; r = 12: e^12 - 13 = 162741.8 -> 10; both without
    # gradient (the clamp is flat there).
    logp = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[1.0, -15.0, 12.0]], dtype=torch.float64)
    k3 = kl_penalty(logp, ref, "k3")
    assert k3[0].tolist() == pytest.approx([math.e - 2, 10.0, 10.0])
    k3.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-(math.e - 1), 0.0, 0.0])


def test_kl_penalty_is_zero_against_itself_and_reference_gets_no_gradient() -> None:
    logp = torch.randn(2, 5).log_softmax(-1).requires_grad_()
    ref = logp.detach().clone().requires_grad_()
    for kind in ("k1", "k2", "k3"):
        assert (kl_penalty(logp, ref, kind) == 0).all()  # type: ignore[arg-type]
    kl_penalty(logp, ref, "k2").sum().backward()
    assert ref.grad is None
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(logp, ref, "k4")  # type: ignore[arg-type]


# --- entropy ---------------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(0, 9),
    st.integers(1, 40),
    st.integers(1, 12),
    st.integers(0, 2**31),
)
def test_entropy_matches_categorical_for_any_chunking(n, t, v, chunk, seed) -> None:
    logits = torch.randn(n, t, v, generator=torch.Generator().manual_seed(seed)) * 4
    expected = torch.distributions.Categorical(logits=logits).entropy() if t else torch.zeros(n, 0)
    got = entropy_from_logits(logits, chunk_size=chunk)
    assert got.shape == (n, t) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_entropy_edge_cases() -> None:
    uniform = torch.zeros(1, 2, 16)
    assert entropy_from_logits(uniform)[0].tolist() == pytest.approx([math.log(16)] * 2)
    masked = torch.tensor([[[0.0, 0.0, -torch.inf, -torch.inf]]], requires_grad=True)
    h = entropy_from_logits(masked)
    assert h.item() == pytest.approx(math.log(2))
    h.sum().backward()
    assert torch.isfinite(masked.grad).all()
    bf16 = torch.randn(2, 3, 7).bfloat16()
    torch.testing.assert_close(entropy_from_logits(bf16), entropy_from_logits(bf16.float()))
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(uniform, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(uniform, temperature=0.0)


def test_entropy_is_that_of_the_tempered_distribution() -> None:
    # logits (2, 0, 0): H = log Z - sum p z, Z = e^z0 + 2.
    # T = 1: log(e^2 + 2) - 2 e^2 / (e^2 + 2) = 2.239545 - 2 * 0.786986 = 0.665573.
    # T = 0.5, i.e. logits (4, 0, 0): log(e^4 + 2) - 4 e^4 / (e^4 + 2) = 4.035976 - 3.858653
    # = 0.177324: the distribution tokens were sampled from is much sharper.
    logits = torch.tensor([[[2.0, 0.0, 0.0]]])
    assert entropy_from_logits(logits).item() == pytest.approx(0.665573, abs=1e-6)
    assert entropy_from_logits(logits, temperature=0.5).item() == pytest.approx(0.177324, abs=1e-6)
