"""A batch of sequences decoding together over one left-padded KV cache (transformers' DynamicCache).

Rows can join (``extend``) and leave (``select``) between decode steps, which is what lets
`LocalEngine` admit a request at the next step instead of waiting for the whole batch to finish.

Layout. Every layer's keys and values are ``(B, H, L, D)``; ``attention_mask`` is ``(B, L)`` with 1
on real tokens and 0 on left padding; ``lengths[i]`` counts row i's real tokens in the cache. Rows
of different lengths are aligned on the right, and position ids are explicit (row i's next token
sits at position ``lengths[i]``), so padding never shifts a row's positions. The cache holds
exactly the tokens fed so far: ``prefill`` consumes whole contexts and returns the logits of each
row's next token; the caller samples it and feeds it with ``step``, which returns the logits after.

Padding is numerically inert up to float rounding: masked keys get zero attention weight, but a
padded batch runs different matmul shapes than a lone row, so logits can differ in the last bits
(about 1e-5 in float32 for SmolLM2-135M).

Supported: decoder-only transformers models whose cache is all full-attention ``DynamicLayer``s
(Llama, Qwen2, Mistral without sliding window, ...). Sliding-window and recurrent caches raise
``NotImplementedError``. All methods run under ``torch.inference_mode``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer


class DecodeBatch:
    """Rows sharing one KV cache; see the module docstring for the layout and its invariants."""

    def __init__(
        self, cache: DynamicCache, attention_mask: torch.Tensor, lengths: torch.Tensor
    ) -> None:
        self.cache = cache
        self.attention_mask = attention_mask  # (B, L) int64
        self.lengths = lengths  # (B,) int64

    @property
    def size(self) -> int:
        return int(self.attention_mask.shape[0])

    @classmethod
    @torch.inference_mode()
    def prefill(
        cls, model: PreTrainedModel, contexts: Sequence[Sequence[int]], pad_id: int = 0
    ) -> tuple[DecodeBatch, torch.Tensor]:
        """Run ``contexts`` (non-empty id lists) through ``model``; return the batch and the
        ``(B, V)`` logits of each row's next token."""
        if not contexts or not all(contexts):
            raise ValueError("prefill needs at least one context and no empty context")
        width = max(len(c) for c in contexts)
        input_ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)  # (B, L)
        attention_mask = torch.zeros((len(contexts), width), dtype=torch.long)  # (B, L)
        for row, context in enumerate(contexts):
            input_ids[row, width - len(context) :] = torch.tensor(context, dtype=torch.long)
            attention_mask[row, width - len(context) :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, L)
        cache = DynamicCache(config=model.config)
        unsupported = [type(layer).__name__ for layer in cache.layers if not _is_full(layer)]
        if unsupported:
            raise NotImplementedError(
                f"DecodeBatch supports full-attention caches only, got {unsupported}"
            )
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        lengths = attention_mask.sum(-1)  # (B,)
        return cls(out.past_key_values, attention_mask, lengths), out.logits[:, -1]

    @torch.inference_mode()
    def step(self, model: PreTrainedModel, token_ids: Sequence[int]) -> torch.Tensor:
        """Feed one token per row; return the ``(B, V)`` logits of the following token."""
        if len(token_ids) != self.size:
            raise ValueError(f"step got {len(token_ids)} tokens for {self.size} rows")
        input_ids = torch.tensor(token_ids, dtype=torch.long).unsqueeze(1)  # (B, 1)
        ones = torch.ones((self.size, 1), dtype=torch.long)
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)  # (B, L + 1)
        out = model(
            input_ids=input_ids,
            attention_mask=self.attention_mask,
            position_ids=self.lengths.unsqueeze(1),  # (B, 1)
            past_key_values=self.cache,
            use_cache=True,
        )
        self.lengths = self.lengths + 1
        return out.logits[:, -1]

    @torch.inference_mode()
    def select(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in that order) and drop the padding columns no kept row needs."""
        if not rows:
            raise ValueError("select needs at least one row; drop the batch instead")
        index = torch.tensor(rows, dtype=torch.long)
        mask = self.attention_mask[index]  # (B', L)
        start = int(mask.any(0).long().argmax())  # first column some kept row attends to
        self.attention_mask = mask[:, start:]
        self.lengths = self.lengths[index]
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, start:]
            layer.values = layer.values[index, :, start:]

    @torch.inference_mode()
    def extend(self, other: DecodeBatch) -> None:
        """Append ``other``'s rows after this batch's, left-padding the shorter cache."""
        width = max(self.attention_mask.shape[1], other.attention_mask.shape[1])
        self.attention_mask = torch.cat(
            [_left_pad(self.attention_mask, width, -1), _left_pad(other.attention_mask, width, -1)]
        )
        self.lengths = torch.cat([self.lengths, other.lengths])
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat(
                [_left_pad(mine.keys, width, -2), _left_pad(theirs.keys, width, -2)]
            )
            mine.values = torch.cat(
                [_left_pad(mine.values, width, -2), _left_pad(theirs.values, width, -2)]
            )


def _is_full(layer: object) -> bool:
    return type(layer) is DynamicLayer and not layer.is_sliding


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zero-pad ``tensor`` on the left of ``dim`` (a negative index) up to ``width``."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    pad = [0, 0] * (-dim - 1) + [missing, 0]  # F.pad lists (left, right) from the last dim back
    return F.pad(tensor, pad)
