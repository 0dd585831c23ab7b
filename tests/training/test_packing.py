"""Packed micro batches: columns round-trip, and a packed forward equals separate forwards.

The model tests run a small random Llama under sdpa and eager attention, each with a negative
control (position ids that do not restart, or a KV cache) showing that the comparison can fail;
one slow test does the same on SmolLM2. Two float32 evaluations (packed, separate) are compared
within the tolerance the model's float32 error against float64 gives on this CPU (`rounding`;
tests/float_tolerance.py), and the negative controls exceed that tolerance.
"""

from __future__ import annotations

import copy
import functools
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from float_tolerance import float32_tolerance, logprob_error_with, tolerance
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.engine_pool.sampling import temperature_logprobs
from agentrl.tokenization.trajectory import TokenTrajectory
from agentrl.training.logprobs import token_logprobs
from agentrl.training.packing import (
    FILLER,
    PackedMicroBatch,
    pack,
    pack_for_rank,
    packed_logprobs,
    packed_scores,
)

MAX_TOKENS = 48


@st.composite
def sequence_st(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, MAX_TOKENS))
    return {
        "input_ids": draw(st.lists(st.integers(0, 63), min_size=n, max_size=n)),
        "loss_mask": [0, *draw(st.lists(st.integers(0, 1), min_size=n - 1, max_size=n - 1))],
        "logprobs": draw(st.lists(st.floats(-20, 0, width=32), min_size=n, max_size=n)),
        "advantage": draw(st.floats(-2, 2, width=32)),  # a scalar: repeated over the tokens
    }


@settings(deadline=None, max_examples=50)
@given(st.lists(sequence_st(), min_size=1, max_size=12))
def test_every_column_round_trips_through_pack_and_unpack(sequences: list[dict]) -> None:
    batches = pack(sequences, MAX_TOKENS)
    assert sorted(i for b in batches for i in b.sequence_index) == list(range(len(sequences)))
    for batch in batches:
        assert batch.n_tokens == batch.input_ids.shape[1] <= MAX_TOKENS
        assert batch.cu_seqlens.tolist() == [0, *torch.tensor(batch.seq_lens).cumsum(0).tolist()]
        assert batch.n_loss_tokens == int(batch.loss_mask.sum())
        assert batch.input_ids.dtype == torch.long and batch.loss_mask.dtype == torch.bool
        columns = {
            "input_ids": batch.input_ids,
            "loss_mask": batch.loss_mask,
            "position_ids": batch.position_ids,
            **batch.fields,
        }
        unpacked = {name: batch.unpack(value) for name, value in columns.items()}
        for k, index in enumerate(batch.sequence_index):
            seq, n = sequences[index], batch.seq_lens[k]
            assert unpacked["input_ids"][k].tolist() == seq["input_ids"]
            assert unpacked["loss_mask"][k].tolist() == [bool(m) for m in seq["loss_mask"]]
            assert unpacked["position_ids"][k].tolist() == list(range(n))
            assert unpacked["logprobs"][k].tolist() == seq["logprobs"]
            assert unpacked["advantage"][k].tolist() == [seq["advantage"]] * n


def test_token_trajectories_bring_their_logprobs_and_versions() -> None:
    trajectory = TokenTrajectory(
        input_ids=[4, 5, 6], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -1.5],
        versions=[-1, 3, 4], prompt_length=1,
    )  # fmt: skip
    (batch,) = pack([trajectory, trajectory], MAX_TOKENS)
    assert batch.input_ids.tolist() == [[4, 5, 6, 4, 5, 6]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    assert batch.fields["logprobs"].tolist() == [[0.0, -0.5, -1.5] * 2]
    assert batch.fields["versions"].tolist() == [[-1, 3, 4] * 2]
    assert batch.fields["versions"].dtype == torch.long
    assert batch.n_loss_tokens == 4


def test_unpack_of_a_shifted_tensor_drops_the_entries_across_boundaries() -> None:
    (batch,) = pack([{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}] * 2, MAX_TOKENS)
    shifted = torch.arange(5.0)[None]  # entry t scores token t + 1: entry 2 crosses a boundary
    assert [p.tolist() for p in batch.unpack(shifted)] == [[0.0, 1.0], [3.0, 4.0]]
    with pytest.raises(ValueError, match=r"\(1, 6, \.\.\.\) or \(1, 5, \.\.\.\)"):
        batch.unpack(torch.zeros(1, 4))


def test_as_rows_gives_one_padded_row_per_sequence() -> None:
    sequences = [
        {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]},
        {"input_ids": [7], "loss_mask": 0},
    ]
    (batch,) = pack(sequences, MAX_TOKENS)
    assert batch.as_rows(batch.input_ids, fill=-1).tolist() == [[1, 2, 3], [7, -1, -1]]
    assert batch.as_rows(batch.loss_mask).tolist() == [[False, True, True], [False] * 3]


def test_filler_micro_batches_carry_every_column_and_no_loss() -> None:
    sequences = [
        {"input_ids": [1] * 10, "loss_mask": [0] + [1] * 9, "advantage": 1.0, "version": 2}
    ] * 3
    ranks = [pack_for_rank(sequences, rank, 2, 10) for rank in range(2)]
    assert [len(batches) for batches in ranks] == [2, 2]
    filler = ranks[1][1]
    assert filler.sequence_index == [FILLER] and filler.seq_lens == [1]
    assert filler.n_loss_tokens == 0 and not filler.loss_mask.any()
    assert filler.fields["advantage"].dtype == torch.float32
    assert filler.fields["version"].dtype == torch.long
    assert filler.to("meta").input_ids.device.type == "meta"
    with pytest.raises(ValueError, match="rank 2"):
        pack_for_rank(sequences, 2, 2, 10)


@pytest.mark.parametrize(
    ("sequences", "message"),
    [
        ([{"input_ids": [1, 2], "loss_mask": [1, 1]}], "loss_mask\\[0\\] is 1"),
        ([{"input_ids": [1, 2]}], "lacks \\['loss_mask'\\]"),
        ([{"input_ids": [1, 2], "loss_mask": [0, 1], "adv": [1.0]}], "'adv' has shape \\(1,\\)"),
        ([{"input_ids": [], "loss_mask": []}], "sequence 0 has 0 tokens"),
        (
            [{"input_ids": [1], "loss_mask": [0]}, {"input_ids": [1], "loss_mask": [0], "x": 1}],
            "sequence 1 has columns",
        ),
    ],
)
def test_malformed_sequences_are_refused(sequences: list[dict], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pack(sequences, MAX_TOKENS)


# --- packed forwards ---------------------------------------------------------------------------

SEQUENCES = [[5, 17, 3, 42, 42, 8, 60, 1, 9], [7, 7, 30, 2], [11], [50, 4, 4, 23, 19, 2, 8]]


def tiny_llama(attention: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attn_implementation=attention,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


@functools.cache
def rounding(attention: str) -> dict[str, float]:
    """Tolerances for comparing two float32 evaluations of the tiny Llama's logits, log-probs
    (at T = 0.7 and 1) and q_proj gradient over ``SEQUENCES`` on this CPU: each from the float32
    separate forwards' own error against float64 (`float_tolerance.float32_tolerance`)."""
    model = tiny_llama(attention)
    model64 = copy.deepcopy(model).double()
    found = {"logits": 0.0, 0.7: 0.0, 1.0: 0.0, "grad": 0.0}
    with torch.no_grad():
        for ids in SEQUENCES:
            ids_t = torch.tensor([ids])
            logits = model(input_ids=ids_t, use_cache=False).logits
            exact = model64(input_ids=ids_t, use_cache=False).logits
            found["logits"] = max(found["logits"], float32_tolerance(logits, exact))
            for temperature in (0.7, 1.0):
                if len(ids) > 1:
                    error, _, magnitude = logprob_error_with(model, model64, ids, temperature)
                    found[temperature] = max(found[temperature], tolerance(error, magnitude))
    grads = []
    for m in (model, model64):
        m.zero_grad()
        sum(lp.sum() for lp in separate_logprobs(m, SEQUENCES, 1.0)).backward()
        grads.append(m.model.layers[0].self_attn.q_proj.weight.grad.clone())
        m.zero_grad()
    found["grad"] = float32_tolerance(*grads)
    return found


def packed_batch(sequences: list[list[int]]) -> PackedMicroBatch:
    rows = [{"input_ids": ids, "loss_mask": [0] + [1] * (len(ids) - 1)} for ids in sequences]
    (batch,) = pack(rows, sum(map(len, sequences)))
    return batch


def separate_logprobs(model: LlamaForCausalLM, sequences: list[list[int]], temperature: float):
    """Reference: each sequence alone, unpadded, as the trainer scores one trajectory."""
    return [
        torch.cat([torch.zeros(1), token_logprobs(model, torch.tensor([ids]), temperature)[0]])
        for ids in sequences
    ]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_forward_equals_separate_forwards(attention: str) -> None:
    model, tol = tiny_llama(attention), rounding(attention)
    batch = packed_batch(SEQUENCES)
    order = [SEQUENCES[i] for i in batch.sequence_index]
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False
        ).logits
        got = batch.unpack(packed_logprobs(model, batch, 0.7))
        want = separate_logprobs(model, order, 0.7)
        for k, ids in enumerate(order):
            alone = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
            torch.testing.assert_close(batch.unpack(logits)[k], alone, atol=tol["logits"], rtol=0)
            torch.testing.assert_close(got[k], want[k], atol=tol[0.7], rtol=0)


def test_scoring_only_loss_tokens_gives_the_same_logprobs_and_gradients() -> None:
    model, tol = tiny_llama("sdpa"), rounding("sdpa")
    rows = [
        {"input_ids": ids, "loss_mask": [0] * min(3, len(ids)) + [1] * (len(ids) - 3)}  # prompt: 3
        for ids in SEQUENCES
    ]
    (batch,) = pack(rows, sum(map(len, SEQUENCES)))
    weight = model.model.layers[0].self_attn.q_proj.weight
    model.zero_grad()
    full_scores = packed_scores(model, batch, 0.7)
    full = full_scores.logprobs
    (full * batch.loss_mask).sum().backward()
    want_grad = weight.grad.clone()
    model.zero_grad()
    head_rows: list[int] = []  # the rows the LM head runs on
    hook = model.lm_head.register_forward_hook(
        lambda _m, args, _o: head_rows.append(args[0].shape[1])
    )
    only_scores = packed_scores(model, batch, 0.7, loss_tokens_only=True)
    hook.remove()
    only = only_scores.logprobs
    only.sum().backward()
    loss_positions = batch.loss_mask[0].nonzero().squeeze(-1)
    torch.testing.assert_close(only_scores.scored, loss_positions)
    assert head_rows == [len(loss_positions)] and len(loss_positions) < len(full_scores.scored)
    torch.testing.assert_close(only, full.detach() * batch.loss_mask, atol=tol[0.7], rtol=0)
    torch.testing.assert_close(weight.grad, want_grad, atol=tol["grad"], rtol=0)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_without_packing_detection_sequences_attend_across_boundaries(attention: str) -> None:
    """Negative controls: the comparison above fails when transformers cannot see the packing."""
    model, tol = tiny_llama(attention), rounding(attention)
    batch = packed_batch(SEQUENCES)
    later = slice(batch.seq_lens[0], None)  # every segment after the first
    with torch.no_grad():
        packed = model(
            input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False
        ).logits
        running = model(  # position ids that do not restart: one long sequence
            input_ids=batch.input_ids,
            position_ids=torch.arange(batch.n_tokens)[None],
            use_cache=False,
        ).logits
        cached = model(  # a KV cache makes transformers skip packing detection
            input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=True
        ).logits
    for wrong in (running, cached):
        assert (wrong[0, later] - packed[0, later]).abs().max() > tol["logits"]


def test_packed_gradients_equal_the_sum_of_separate_gradients() -> None:
    model, tol = tiny_llama("sdpa"), rounding("sdpa")
    batch = packed_batch(SEQUENCES)
    weight = model.model.layers[0].self_attn.q_proj.weight
    model.zero_grad()
    packed_logprobs(model, batch, 1.0).sum().backward()
    packed = weight.grad.clone()
    model.zero_grad()
    sum(lp.sum() for lp in separate_logprobs(model, SEQUENCES, 1.0)).backward()
    torch.testing.assert_close(packed, weight.grad, atol=tol["grad"], rtol=0)
    model.zero_grad()


def test_a_filler_micro_batch_runs_a_full_backward_that_changes_nothing() -> None:
    """Its backward must reach every layer (FSDP's per-layer collectives run in lockstep)."""
    model = tiny_llama("sdpa")
    sequences = [{"input_ids": [3, 4], "loss_mask": [0, 1]}]
    filler = pack_for_rank(sequences, 1, 2, 8)[0]
    model.zero_grad(set_to_none=True)
    logprobs = packed_logprobs(model, filler, 1.0)
    assert logprobs.tolist() == [[0.0]]
    (logprobs * filler.loss_mask).sum().backward()
    first_layer = model.model.layers[0].self_attn.q_proj.weight.grad
    assert first_layer is not None and not first_layer.any()
    model.zero_grad()


def test_padding_to_a_multiple_adds_a_filler_and_keeps_every_real_score() -> None:
    """actor.fp8 pads micro-batches to a multiple of 16 tokens (torch._scaled_mm's rule)."""
    model, tol = tiny_llama("sdpa"), rounding("sdpa")
    batch = packed_batch(SEQUENCES)  # 21 tokens
    padded = batch.padded_to(16)
    assert (batch.n_tokens, padded.n_tokens) == (21, 32)
    assert padded.sequence_index == [*batch.sequence_index, FILLER]
    assert padded.seq_lens[-1] == 11 and padded.position_ids[0, 21:].tolist() == list(range(11))
    assert padded.n_loss_tokens == batch.n_loss_tokens and not padded.loss_mask[0, 21:].any()
    with torch.no_grad():
        plain, longer = (packed_logprobs(model, b, 1.0) for b in (batch, padded))
    torch.testing.assert_close(longer[:, :21], plain, atol=tol[1.0], rtol=0)
    assert padded.padded_to(16) is padded and batch.padded_to(1) is batch
    with pytest.raises(ValueError, match="multiple must be >= 1"):
        batch.padded_to(0)


def test_unknown_attention_implementations_are_refused() -> None:
    model = SimpleNamespace(config=SimpleNamespace(_attn_implementation="paged|sdpa"))
    with pytest.raises(ValueError, match="'paged\\|sdpa' is not known"):
        packed_logprobs(model, packed_batch([[1, 2]]), 1.0)


@pytest.mark.slow
def test_smollm2_packed_logprobs_equal_separate_ones(smollm2, tokenizer, smollm2_rounding) -> None:
    texts = [
        "The capital of France is Paris, and the capital of Italy is Rome.",
        "def add(a, b):\n    return a + b\n",
        "Tool result: 42",
    ]
    sequences = [tokenizer(text)["input_ids"] for text in texts]
    batch = packed_batch(sequences)
    order = [sequences[i] for i in batch.sequence_index]
    with torch.no_grad():
        got = batch.unpack(packed_logprobs(smollm2, batch, 1.0))
        want = separate_logprobs(smollm2, order, 1.0)
        running = batch.unpack(
            temperature_shifted(smollm2, batch.input_ids, torch.arange(batch.n_tokens)[None])
        )
    atol = tolerance(smollm2_rounding[0], smollm2_rounding[2])  # at T = 1
    for k in range(len(order)):
        torch.testing.assert_close(got[k], want[k], atol=atol, rtol=0)
    assert (running[-1] - got[-1][1:]).abs().max() > atol  # negative control: later segment


def temperature_shifted(model, input_ids: torch.Tensor, position_ids: torch.Tensor):
    """Shifted ``(1, T - 1)`` log-probs from a forward with the given position ids."""
    logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
    return temperature_logprobs(logits[:, :-1], input_ids[:, 1:], 1.0)
