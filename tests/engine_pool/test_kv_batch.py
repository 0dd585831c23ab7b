"""DecodeBatch against plain full forward passes, on a small randomly initialised Llama.

Whatever rows join, leave or step, each row's next-token logits must equal those of a full forward
pass over that row's sequence alone (float32 rounding aside).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaForCausalLM

from agentrl.engine_pool.kv_batch import DecodeBatch

VOCAB = 64


@pytest.fixture(scope="module")
def tiny_llama(make_tiny_llama: Callable[..., LlamaForCausalLM]) -> LlamaForCausalLM:
    return make_tiny_llama()


def reference_logits(model: LlamaForCausalLM, sequences: list[list[int]]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.stack([model(torch.tensor([s])).logits[0, -1] for s in sequences])


sequence = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12)
operation = st.one_of(
    st.tuples(st.just("step"), st.lists(st.integers(0, VOCAB - 1), min_size=24, max_size=24)),
    st.tuples(st.just("join"), st.lists(sequence, min_size=1, max_size=3)),
    st.tuples(st.just("leave"), st.lists(st.booleans(), min_size=24, max_size=24)),
)


@settings(max_examples=25, deadline=None)
@given(st.lists(sequence, min_size=1, max_size=3), st.lists(operation, max_size=6))
def test_rows_decode_as_if_alone(
    tiny_llama: LlamaForCausalLM, first: list[list[int]], operations: list
) -> None:
    sequences = [list(s) for s in first]
    batch, logits = DecodeBatch.prefill(tiny_llama, sequences)
    torch.testing.assert_close(
        logits, reference_logits(tiny_llama, sequences), atol=2e-5, rtol=1e-4
    )
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
        else:
            keep = [i for i in range(batch.size) if arg[i]] or [batch.size - 1]
            batch.select(keep)
            sequences = [sequences[i] for i in keep]
            logits = logits[keep]
        torch.testing.assert_close(
            logits, reference_logits(tiny_llama, sequences), atol=2e-5, rtol=1e-4
        )
        assert batch.lengths.tolist() == [len(s) for s in sequences]
        assert bool(batch.attention_mask[:, 0].any()), "a leading column no row attends to was kept"
        assert batch.attention_mask.sum(-1).tolist() == [len(s) for s in sequences]


def test_prefill_rejects_empty_contexts(tiny_llama: LlamaForCausalLM) -> None:
    with pytest.raises(ValueError, match="empty"):
        DecodeBatch.prefill(tiny_llama, [[1, 2], []])
