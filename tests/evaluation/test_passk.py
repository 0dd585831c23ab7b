"""The pass@k estimator against hand-computed values and against counting every draw."""

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl.evaluation.passk import mean_and_stderr, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 0, 5, 0.0),
        (3, 3, 2, 1.0),
        (4, 1, 4, 1.0),  # every draw of 4 holds the one passing sample
        (200, 13, 10, 1 - math.comb(187, 10) / math.comb(200, 10)),
    ],
)
def test_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@given(
    st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n)))
)
def test_it_is_the_share_of_k_draws_that_hold_a_pass(case):
    n, c, k = case
    samples = [True] * c + [False] * (n - c)
    draws = list(itertools.combinations(range(n), k))
    share = sum(any(samples[i] for i in draw) for draw in draws) / len(draws)
    assert pass_at_k(n, c, k) == pytest.approx(share, abs=1e-12)


def test_bad_counts_are_refused():
    for n, c, k in ((3, 4, 1), (3, 1, 0), (3, 1, 4)):
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(n, c, k)


def test_mean_and_standard_error():
    assert mean_and_stderr([1.0, 0.0, 1.0, 0.0]) == pytest.approx((0.5, math.sqrt(1 / 3 / 4)))
    assert mean_and_stderr([0.25]) == (0.25, 0.0)
    assert all(math.isnan(x) for x in mean_and_stderr([]))
