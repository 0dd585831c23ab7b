"""Admission on top of the prefix cache, on a small randomly initialised Llama.

Rows admitted from cached prefixes, in groups of different suffix lengths, must decode exactly as
full forward passes over their whole contexts (float32 rounding aside, derived from the float32
forward's own error against float64: engine_helpers.assert_logits_as_if_alone), in the row order
the admission reports.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from engine_helpers import assert_logits_as_if_alone
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaForCausalLM

from agentrl.engine_pool.admission import cache_rows, padding_groups, prefill_admission
from agentrl.engine_pool.kv_batch import DecodeBatch
from agentrl.engine_pool.prefix_cache import PrefixCache


@pytest.fixture(scope="module")
def tiny_llama(make_tiny_llama: Callable[..., LlamaForCausalLM]) -> LlamaForCausalLM:
    return make_tiny_llama()


def test_admitted_rows_decode_like_full_forwards_and_leave_reusable_kv(
    tiny_llama: LlamaForCausalLM,
) -> None:
    cache = PrefixCache(200)
    stored = [1, 2, 3, 4, 5, 6, 7, 8]
    cache.insert(stored, DecodeBatch.prefill(tiny_llama, [stored])[0].row_kv(0), "s")
    contexts = [
        [*stored, 9],  # the session's next turn: 8 tokens cached, 1 computed
        [1, 2, 3, 9, 9, 9],  # shares 3 tokens with the entry
        list(range(10, 50)),  # no hit and much longer: prefilled in its own group
        [60, 61],
    ]
    admission = prefill_admission(tiny_llama, cache, contexts, ["s", None, None, "s"])
    assert sorted(admission.order) == [0, 1, 2, 3] and admission.forwards >= 2
    assert (admission.cached_tokens, admission.computed_tokens) == (11, 57 - 11)
    rows = [contexts[i] for i in admission.order]
    assert admission.batch.lengths.tolist() == [len(r) for r in rows]
    assert_logits_as_if_alone(tiny_llama, admission.logits, rows)

    logits = admission.batch.step(tiny_llama, [7, 7, 7, 7])
    rows = [[*r, 7] for r in rows]
    assert_logits_as_if_alone(tiny_llama, logits, rows)
    cache_rows(cache, admission.batch, [0, 1, 2, 3], rows, [None] * 4)
    assert sorted(cache.sequences()) == sorted(tuple(r) for r in rows)  # `stored` is superseded
    again = prefill_admission(tiny_llama, cache, [[*r, 3] for r in rows], [None] * 4)
    assert (again.cached_tokens, again.computed_tokens) == (sum(map(len, rows)), 4)
    assert_logits_as_if_alone(tiny_llama, again.logits, [rows[i] + [3] for i in again.order])


@given(st.lists(st.integers(1, 300), min_size=1, max_size=20), st.sampled_from([0.0, 0.5, 1.0]))
def test_padding_groups_partition_rows_and_bound_padding(
    lengths: list[int], max_padding: float
) -> None:
    groups = padding_groups(lengths, max_padding)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        real = sum(lengths[i] for i in group)
        assert len(group) * max(lengths[i] for i in group) <= (1 + max_padding) * real
    assert len(padding_groups([7] * len(lengths), max_padding)) == 1
