"""DecodeBatch against plain full forward passes, on a small randomly initialised Llama.

Whatever rows join, leave or step, each row's next-token logits must equal those of a full forward
pass over that row's sequence alone (float32 rounding aside, derived from the float32 forward's
own error against float64: engine_helpers.assert_logits_as_if_alone). Rows may join on top of
cached KV: copied out of a running row (``fork``) or from a separately prefilled prefix
(``join_cached``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from engine_helpers import assert_logits_as_if_alone
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaForCausalLM

from agentrl.engine_pool.kv_batch import DecodeBatch

VOCAB = 64


@pytest.fixture(scope="module")
def tiny_llama(make_tiny_llama: Callable[..., LlamaForCausalLM]) -> LlamaForCausalLM:
    return make_tiny_llama()


sequence = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12)
operation = st.one_of(
    st.tuples(st.just("step"), st.lists(st.integers(0, VOCAB - 1), min_size=24, max_size=24)),
    st.tuples(st.just("join"), st.lists(sequence, min_size=1, max_size=3)),
    st.tuples(st.just("leave"), st.lists(st.booleans(), min_size=24, max_size=24)),
    st.tuples(st.just("fork"), st.tuples(st.integers(0, 23), sequence)),
    st.tuples(
        st.just("join_cached"),
        st.lists(st.tuples(sequence, st.integers(0, 12)), min_size=1, max_size=3),
    ),
)


def join_cached(
    model: LlamaForCausalLM, rows: list[tuple[list[int], int]]
) -> tuple[DecodeBatch, torch.Tensor, list[list[int]]]:
    """Prefill each sequence's first ``split`` tokens alone, then the rest on top of their KV."""
    splits = [min(split, len(s) - 1) for s, split in rows]
    cached = [
        DecodeBatch.prefill(model, [s[:k]])[0].row_kv(0) if k else None
        for (s, _), k in zip(rows, splits, strict=True)
    ]
    suffixes = [s[k:] for (s, _), k in zip(rows, splits, strict=True)]
    batch, logits = DecodeBatch.prefill(model, suffixes, cached)
    return batch, logits, [list(s) for s, _ in rows]


@settings(max_examples=25, deadline=None)
@given(st.lists(sequence, min_size=1, max_size=3), st.lists(operation, max_size=6))
def test_rows_decode_as_if_alone(
    tiny_llama: LlamaForCausalLM, first: list[list[int]], operations: list
) -> None:
    sequences = [list(s) for s in first]
    batch, logits = DecodeBatch.prefill(tiny_llama, sequences)
    assert_logits_as_if_alone(tiny_llama, logits, sequences)
    for kind, arg in operations:
        if kind == "step":
            tokens = arg[: batch.size]
            logits = batch.step(tiny_llama, tokens)
            for s, token in zip(sequences, tokens, strict=True):
                s.append(token)
        elif kind == "join":
            joined, new_logits = DecodeBatch.prefill(tiny_llama, arg)
            batch.extend(joined)
            sequences += [list(s) for s in arg]
            logits = torch.cat([logits, new_logits])
        elif kind == "fork":  # a new row continues row `source` from a copy of its KV
            source, extra = arg[0] % batch.size, arg[1]
            kv = batch.row_kv(source)
            assert kv.shape[-2] == len(sequences[source])
            joined, new_logits = DecodeBatch.prefill(tiny_llama, [extra], [kv])
            batch.extend(joined)
            sequences.append(sequences[source] + extra)
            logits = torch.cat([logits, new_logits])
        elif kind == "join_cached":
            joined, new_logits, joined_sequences = join_cached(tiny_llama, arg)
            batch.extend(joined)
            sequences += joined_sequences
            logits = torch.cat([logits, new_logits])
        else:
            keep = [i for i in range(batch.size) if arg[i]] or [batch.size - 1]
            batch.select(keep)
            sequences = [sequences[i] for i in keep]
            logits = logits[keep]
        assert_logits_as_if_alone(tiny_llama, logits, sequences)
        assert batch.lengths.tolist() == [len(s) for s in sequences]
        assert bool(batch.attention_mask[:, 0].any()), "a leading column no row attends to was kept"
        assert batch.attention_mask.sum(-1).tolist() == [len(s) for s in sequences]


def test_prefill_rejects_empty_contexts(tiny_llama: LlamaForCausalLM) -> None:
    with pytest.raises(ValueError, match="empty"):
        DecodeBatch.prefill(tiny_llama, [[1, 2], []])
