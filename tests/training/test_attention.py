"""The trainer's attention (agentrl.training.attention): transformers' sdpa with one float mask
per forward. What the backward keeps is read from autograd's saved tensors, so the test sees the
memory itself, not a counter."""

from __future__ import annotations

import torch
from sequence_parallel_worker import random_llama, whole_batch

from agentrl.training.attention import ATTENTION, use_trainer_attention
from agentrl.training.packing import packed_logprobs


def saved_tensors(model: torch.nn.Module, tokens: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The log-probs of a packed micro-batch of ``tokens`` tokens, and every 4-D tensor autograd
    saved for the backward."""
    batch = whole_batch([tokens // 2, tokens // 4, tokens - tokens // 2 - tokens // 4])
    saved: list[torch.Tensor] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 4:
            saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        logprobs = packed_logprobs(model, batch, 1.0)
    return logprobs, saved


def test_every_layer_keeps_the_same_float_mask_where_sdpa_keeps_one_each() -> None:
    plain_logprobs, plain_saved = saved_tensors(random_llama(4, 2), 96)
    model = use_trainer_attention(random_llama(4, 2))
    assert model.config._attn_implementation == ATTENTION
    logprobs, saved = saved_tensors(model, 96)
    plain = [t for t in plain_saved if t.shape[-2:] == (96, 96)]
    ours = [t for t in saved if t.shape[-2:] == (96, 96)]
    layers = model.config.num_hidden_layers
    # torch's CPU sdpa converts the boolean mask in each call and keeps each copy
    assert len(plain) == layers and len({m.data_ptr() for m in plain}) == layers
    # here one float copy, made by the first layer, is what every layer keeps
    assert len(ours) == layers and len({m.data_ptr() for m in ours}) == 1
    assert ours[0].dtype == torch.float32
    assert torch.equal(logprobs, plain_logprobs)  # the same conversion sdpa makes itself


def test_grouped_keys_and_values_are_kept_unrepeated_on_the_cpu() -> None:
    """4 query heads, 2 key/value heads: under a mask transformers' sdpa repeats the keys and
    values to 4 heads and the backward keeps those copies; the trainer's attention keeps the 2."""
    _, plain = saved_tensors(random_llama(4, 2), 96)
    _, ours = saved_tensors(use_trainer_attention(random_llama(4, 2)), 96)

    def heads(saved: list[torch.Tensor], count: int) -> int:
        return sum(1 for t in saved if t.shape[:3] == (1, count, 96) and t.shape[-1] == 16)

    layers = 2
    assert heads(plain, 4) == 4 * layers and heads(plain, 2) == 0  # query, key, value, output
    assert heads(ours, 4) == 2 * layers and heads(ours, 2) == 2 * layers  # query, output; k, v
