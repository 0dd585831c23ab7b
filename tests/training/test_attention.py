"""The trainer's attention (agentrl.training.attention): transformers' sdpa with one float mask
per forward. What the backward keeps is read from autograd's saved tensors, so the test sees the
memory itself, not a counter."""

from __future__ import annotations

import torch
from sequence_parallel_worker import random_llama, whole_batch

from agentrl.training.attention import ATTENTION, use_trainer_attention
from agentrl.training.packing import packed_logprobs


def saved_masks(model: torch.nn.Module, tokens: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The log-probs of a packed micro-batch of ``tokens`` tokens, and every ``(1, 1, T, T)``
    tensor autograd saved for the backward."""
    batch = whole_batch([tokens // 2, tokens // 4, tokens - tokens // 2 - tokens // 4])
    masks: list[torch.Tensor] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 4 and tensor.shape[-2:] == (tokens, tokens):
            masks.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        logprobs = packed_logprobs(model, batch, 1.0)
    return logprobs, masks


def test_every_layer_keeps_the_same_float_mask_where_sdpa_keeps_one_each() -> None:
    plain_logprobs, plain = saved_masks(random_llama(4, 2), 96)
    model = use_trainer_attention(random_llama(4, 2))
    assert model.config._attn_implementation == ATTENTION
    logprobs, ours = saved_masks(model, 96)
    layers = model.config.num_hidden_layers
    # torch's CPU sdpa converts the boolean mask in each call and keeps each copy
    assert len(plain) == layers and len({m.data_ptr() for m in plain}) == layers
    # here one float copy, made by the first layer, is what every layer keeps
    assert len(ours) == layers and len({m.data_ptr() for m in ours}) == 1
    assert ours[0].dtype == torch.float32
    assert torch.equal(logprobs, plain_logprobs)  # the same conversion sdpa makes itself
