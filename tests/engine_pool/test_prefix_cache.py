"""PrefixCache on its own, without a model.

Entries carry a fake KV whose every value is the token id at that position, so a hit's tensor shows
which tokens it was computed for: it must be exactly the query's first ``length`` ids.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaForCausalLM

from agentrl.engine_pool.local_engine import LocalEngine
from agentrl.engine_pool.prefix_cache import PrefixCache, common_prefix_length


def fake_kv(tokens: list[int] | tuple[int, ...]) -> torch.Tensor:
    """``(layers=2, 2, H=1, n, D=3)`` with value ``tokens[j]`` at position j."""
    column = torch.tensor(tokens, dtype=torch.float32).view(1, 1, 1, -1, 1)
    return column.expand(2, 2, 1, len(tokens), 3)


def brute_common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# a tiny alphabet makes shared prefixes, and prefixes of prefixes, common
ids = st.lists(st.integers(0, 2), min_size=1, max_size=10)
operation = st.tuples(
    st.sampled_from(["insert", "lookup", "release"]), ids, st.sampled_from([None, "a", "b"])
)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 24), st.lists(operation, max_size=30))
def test_lookup_is_the_longest_common_prefix_and_the_budget_holds(
    budget: int, operations: list[tuple[str, list[int], str | None]]
) -> None:
    cache = PrefixCache(budget)
    for kind, tokens, session in operations:
        if kind == "insert":
            stored = cache.insert(tokens, fake_kv(tokens), session)
            assert not stored or cache.sequences()[-1] == tuple(tokens)
            if len(tokens) <= budget:  # stored now, or already covered by a longer entry
                assert any(s[: len(tokens)] == tuple(tokens) for s in cache.sequences())
            else:
                assert not stored
        elif kind == "release":
            before = cache.sequences()
            dropped = cache.release(session) if session is not None else 0
            gone = set(before) - set(cache.sequences())
            assert len(gone) <= 1 and dropped == sum(len(s) for s in gone)
            assert cache.sequences() == [s for s in before if s not in gone]  # order kept
        else:
            held = cache.sequences()
            hit = cache.lookup(tokens, session)
            query = tuple(tokens)
            best = max((brute_common_prefix(s, query) for s in held), default=0)
            expected = min(best, len(query) - 1)
            assert (hit.length if hit else 0) == expected
            if hit is not None:
                assert hit.kv.shape == (2, 2, 1, expected, 3)
                assert hit.kv[0, 1, 0, :, 2].tolist() == list(query[:expected])
        held = cache.sequences()
        assert cache.tokens == sum(len(s) for s in held) <= budget
        assert len(cache) == len(held)
        for s in held:  # no entry is a prefix of another
            assert not [t for t in held if t != s and t[: len(s)] == s]


def test_least_recently_used_entries_are_evicted_first() -> None:
    cache = PrefixCache(10)
    for tokens in ([1, 1, 1, 1], [2, 2, 2, 2]):
        assert cache.insert(tokens, fake_kv(tokens))
    assert cache.lookup([1, 1, 1, 1, 9]).length == 4  # 1111 is now the most recently used
    assert cache.insert([3, 3, 3, 3], fake_kv([3, 3, 3, 3]))
    assert cache.sequences() == [(1, 1, 1, 1), (3, 3, 3, 3)]
    assert cache.tokens == 8
    assert cache.nbytes == 8 * 2 * 2 * 1 * 3 * 4
    assert not cache.insert(list(range(11)), fake_kv(list(range(11))))  # over the budget


def test_a_turn_replaces_the_previous_turn_of_its_session() -> None:
    cache = PrefixCache(100)
    cache.insert([5, 6, 7], fake_kv([5, 6, 7]), "s")
    cache.insert([5, 6, 7, 8, 9], fake_kv([5, 6, 7, 8, 9]), "s")
    assert cache.sequences() == [(5, 6, 7, 8, 9)]
    assert not cache.insert([5, 6], fake_kv([5, 6]), "t")  # covered: only marked used
    assert cache.lookup([5, 6, 7, 8, 9, 10], "t").length == 5
    assert cache.lookup([5, 6, 7, 8, 9], "s").length == 4  # one token is always left to compute
    assert cache.lookup([5]) is None and cache.lookup([4, 5, 6]) is None
    cache.clear()
    assert (len(cache), cache.tokens, cache.lookup([5, 6, 7, 8, 9, 10], "s")) == (0, 0, None)


def test_a_released_session_drops_its_entry_unless_another_session_holds_it() -> None:
    cache = PrefixCache(100)
    prompt = [1, 2, 3]
    cache.insert([*prompt, 4, 5], fake_kv([*prompt, 4, 5]), "a")
    cache.insert([*prompt, 6], fake_kv([*prompt, 6]), "b")
    assert not cache.insert([*prompt, 6], fake_kv([*prompt, 6]), "c")  # b's entry, now c's too
    assert cache.release("a") == 5  # a's own entry goes; the prompt is still in b's
    assert cache.sequences() == [(*prompt, 6)]
    assert cache.lookup([*prompt, 9]).length == 3
    assert cache.release("b") == 0  # c's latest entry too: kept
    assert cache.release("c") == 4
    assert (len(cache), cache.tokens, cache.release("c"), cache.release("never")) == (0, 0, 0, 0)
    cache.insert([7, 8], fake_kv([7, 8]))  # an entry of no session is left to the LRU
    assert cache.release("a") == 0 and cache.sequences() == [(7, 8)]


def test_bad_arguments_are_rejected(make_tiny_llama: Callable[..., LlamaForCausalLM]) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        PrefixCache(-1)
    with pytest.raises(ValueError, match="kv holds 2 tokens"):
        PrefixCache(10).insert([1, 2, 3], fake_kv([1, 2]))
    with pytest.raises(ValueError, match="max_tokens"):
        LocalEngine(make_tiny_llama(), prefix_cache_tokens=-5)
    assert PrefixCache(0).insert([1], fake_kv([1])) is False  # 0 disables the cache


@given(ids, ids, st.integers(0, 12))
def test_common_prefix_length_matches_a_plain_loop(a: list[int], b: list[int], limit: int) -> None:
    a_long, b_long = tuple(a * 20), tuple(a * 19 + b)  # long enough to cross chunk boundaries
    assert common_prefix_length(a_long, b_long) == brute_common_prefix(a_long, b_long)
    assert common_prefix_length(tuple(a), tuple(b), limit) == min(
        brute_common_prefix(tuple(a), tuple(b)), limit
    )
