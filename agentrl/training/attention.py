"""The trainer's attention: transformers' ``"sdpa"``, with one mask per forward, and the key/value
gather of sequence parallelism.

Registered with transformers as :data:`ATTENTION` (:func:`use_trainer_attention`), it is
``"sdpa"`` (the same mask function, the same call) with two differences:

* **One float mask per forward.** For packed micro-batches transformers builds a boolean ``T x T``
  mask once and passes it to every layer. Torch's CPU sdpa turns a boolean mask into a float one
  in every call and keeps that copy for the backward: ``4 T^2`` bytes per layer (SmolLM2's 30
  layers at 3,871 tokens: 1.8 GB; measured, 64 MB per call at 4,096 tokens, none with a float
  mask). Here the first layer makes the additive form (0 where allowed, ``-inf`` elsewhere, in
  the query's dtype) and caches it on the mask, so every layer, and activation checkpointing's
  recompute, share one copy. Same numbers: sdpa makes the same conversion itself.
* **Grouped-query attention under a mask, on the CPU.** With a mask, transformers repeats the key
  and value heads to the query heads before sdpa (the masked CUDA kernels lack GQA), and the
  backward keeps the repeated copies: for SmolLM2 (9 query, 3 key/value heads) three times the
  keys' and values' memory in every layer. Torch's CPU flash kernel takes the groups as they are
  (``enable_gqa``), so on the CPU they are passed unrepeated. Same numbers (tested).
* **Sequence parallelism.** Given a process group (the :data:`GROUP_KWARG` forward keyword,
  :mod:`agentrl.training.sequence_parallel`), the keys and values of this rank's slice are
  all-gathered along the sequence first (torch's differentiable ``all_gather_single``: a
  reduce-scatter of their gradients in the backward; before torch 2.13, which the lent GPU
  machines run, the same collective is ``all_gather_tensor_autograd``), and the queries attend
  to all of them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import _functional_collectives
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

ATTENTION = "agentrl_sdpa"
"""The attention implementation name of a model the trainer runs (:func:`use_trainer_attention`)."""
GROUP_KWARG = "sequence_parallel_group"
"""The forward keyword that carries a sequence-parallel group down to the attention layers."""
CACHE = "_agentrl_additive_mask"
all_gather = getattr(
    _functional_collectives,
    "all_gather_single",  # torch >= 2.13, where all_gather_tensor_autograd is deprecated
    _functional_collectives.all_gather_tensor_autograd,
)


def trainer_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Transformers' sdpa attention (``query`` ``(B, H, Tq, D)``, ``key`` and ``value`` ``(B,
    KV, Tk, D)``), its boolean mask made additive once per mask, over the whole sequence's keys
    and values when a sequence-parallel group is passed."""
    group = kwargs.pop(GROUP_KWARG, None)
    if group is not None:
        key = all_gather(key.contiguous(), 2, group)  # torch 2.11 gathers contiguous inputs only
        value = all_gather(value.contiguous(), 2, group)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = additive_mask(attention_mask, query.dtype)
    grouped = key.shape[1] < query.shape[1] and kwargs.get("position_bias") is None
    if attention_mask is not None and query.device.type == "cpu" and grouped:
        # grouped-query attention under a mask: transformers repeats the keys and values to every
        # head (the masked CUDA kernels lack GQA), and the backward keeps the repeated copies;
        # torch's CPU flash kernel takes the groups as they are
        output = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=kwargs.get("dropout", 0.0),
            scale=kwargs.get("scaling"),
            enable_gqa=True,
        )
        return output.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` (True: may attend) as 0 / ``-inf`` in ``dtype``, made once per mask object and
    dtype and kept on the mask (the object every layer of one forward receives)."""
    cached = getattr(mask, CACHE, None)
    if cached is None or cached.dtype != dtype:
        cached = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        cached.masked_fill_(~mask, float("-inf"))
        setattr(mask, CACHE, cached)
    return cached


def use_trainer_attention(model: PreTrainedModel) -> PreTrainedModel:
    """Switch ``model`` to :data:`ATTENTION` (in place; returns it). Only models that run
    attention through transformers' attention interface with a ``"sdpa"`` option qualify
    (Llama, Qwen, Mistral, ...)."""
    AttentionInterface.register(ATTENTION, trainer_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)
    if not getattr(model, "_supports_sdpa", False):
        raise ValueError(f"{type(model).__name__} has no sdpa attention, which the trainer's wraps")
    model.set_attn_implementation(ATTENTION)
    return model
