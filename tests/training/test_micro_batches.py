"""Micro-batch plans: token budgets, coverage, determinism and rank balance, for all inputs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.training.micro_batches import balance_across_ranks, plan_micro_batches, plan_tokens

MAX_TOKENS = 64

lengths_st = st.lists(st.integers(1, MAX_TOKENS), max_size=60)


def assert_valid_plan(plan: list[list[int]], lengths: list[int]) -> None:
    """Within budget, indices increasing, largest micro batch first."""
    tokens = plan_tokens(plan, lengths)
    assert all(t <= MAX_TOKENS for t in tokens)
    assert all(mb == sorted(mb) for mb in plan)
    assert tokens == sorted(tokens, reverse=True)


@settings(deadline=None)
@given(lengths_st)
def test_plan_holds_every_sequence_once_within_budget(lengths: list[int]) -> None:
    plan = plan_micro_batches(lengths, MAX_TOKENS)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    assert all(plan)  # no empty micro batch on a single rank
    assert_valid_plan(plan, lengths)
    assert plan == plan_micro_batches(list(lengths), MAX_TOKENS)  # deterministic


@settings(deadline=None)
@given(lengths_st)
def test_plan_leaves_no_two_micro_batches_that_fit_together(lengths: list[int]) -> None:
    tokens = plan_tokens(plan_micro_batches(lengths, MAX_TOKENS), lengths)
    for i, a in enumerate(tokens):
        for b in tokens[i + 1 :]:
            assert a + b > MAX_TOKENS


def test_plan_finds_the_perfect_fit() -> None:
    assert plan_micro_batches([3, 6, 2, 4, 3, 2], 10) == [[0, 2, 4, 5], [1, 3]]


@settings(deadline=None)
@given(lengths_st, st.integers(1, 5))
def test_ranks_share_every_sequence_in_lockstep_and_balanced(
    lengths: list[int], world_size: int
) -> None:
    plans = balance_across_ranks(lengths, world_size, MAX_TOKENS)
    assert len(plans) == world_size
    assert sorted(i for plan in plans for mb in plan for i in mb) == list(range(len(lengths)))
    assert len({len(plan) for plan in plans}) == 1  # FSDP collectives run in lockstep
    totals = [sum(plan_tokens(plan, lengths)) for plan in plans]
    assert max(totals) - min(totals) <= max(lengths, default=0)
    for plan in plans:
        assert_valid_plan(plan, lengths)
        if [] in plan:  # a filler only where no micro batch could be split instead
            assert all(len(mb) <= 1 for mb in plan)
            assert plan.index([]) == len([mb for mb in plan if mb])  # fillers last
    assert plans == balance_across_ranks(list(lengths), world_size, MAX_TOKENS)


def test_a_rank_splits_a_micro_batch_to_keep_step_with_the_others() -> None:
    # Rank 0 gets 9, 7, 1 (two micro batches: 9+1 and 7), rank 1 gets 8, 7, 5 (three).
    plans = balance_across_ranks([7, 1, 5, 9, 8, 7], 2, 10)
    assert plans == [[[3], [5], [1]], [[4], [0], [2]]]


def test_a_rank_with_too_few_sequences_gets_fillers() -> None:
    assert balance_across_ranks([10, 10, 10], 2, 10) == [[[0], [2]], [[1], []]]
    assert balance_across_ranks([5], 3, 10) == [[[0]], [[]], [[]]]
    assert balance_across_ranks([], 2, 10) == [[], []]


def test_one_rank_is_the_single_rank_plan() -> None:
    lengths = [5, 9, 1, 30, 12, 7, 7]
    assert balance_across_ranks(lengths, 1, 32) == [plan_micro_batches(lengths, 32)]


@pytest.mark.parametrize(
    ("lengths", "max_tokens", "message"),
    [
        ([3, 11, 2], 10, "sequence 1 has 11 tokens, more than max_tokens=10"),
        ([3, 0], 10, "sequence 1 has 0 tokens"),
        ([3], 0, "max_tokens must be >= 1"),
    ],
)
def test_bad_lengths_are_refused(lengths: list[int], max_tokens: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_micro_batches(lengths, max_tokens)
    with pytest.raises(ValueError, match=message):
        balance_across_ranks(lengths, 2, max_tokens)


def test_world_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="world_size"):
        balance_across_ranks([1], 0, 10)
