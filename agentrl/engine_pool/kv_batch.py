"""A batch of sequences decoding together over one left-padded KV cache (transformers' DynamicCache).

Rows can join (``extend``) and leave (``select``) between decode steps, which is what lets
`LocalEngine` admit a request at the next step instead of waiting for the whole batch to finish.
A row's keys and values can be copied out (``row_kv``) and given back to a later ``prefill`` as the
cached KV of a prefix, so that only the tokens after it are computed (prefix caching).

Layout. Every layer's keys and values are ``(B, H, L, D)``; ``attention_mask`` is ``(B, L)`` with 1
on real tokens and 0 on left padding; ``lengths[i]`` counts row i's real tokens in the cache. Rows
of different lengths are aligned on the right, and position ids are explicit (row i's next token
sits at position ``lengths[i]``), so padding never shifts a row's positions. The cache holds
exactly the tokens fed so far: ``prefill`` consumes whole contexts (or the rest of a context after
a cached prefix) and returns the logits of each row's next token; the caller samples it and feeds
it with ``step``, which returns the logits after. One row's KV on its own (``row_kv``) is a
``(layers, 2, H, n, D)`` tensor: keys at index 0 and values at index 1 of the second dimension.
A prefill on top of cached KV runs with a gap of padding between each row's cached and new
tokens, then closes it (``_align_right``), so the layout above holds after every method.

Padding is numerically inert up to float rounding: masked keys get zero attention weight, but a
padded batch runs different matmul shapes than a lone row, so logits can differ in the last bits
(about 1e-5 in float32 for SmolLM2-135M).

Supported: decoder-only transformers models whose cache is all full-attention ``DynamicLayer``s
(Llama, Qwen2, Mistral without sliding window, ...). Sliding-window and recurrent caches raise
``NotImplementedError``. All methods run under ``torch.inference_mode``.
"""

from __future__ import annotations

import inspect
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
        cls,
        model: PreTrainedModel,
        contexts: Sequence[Sequence[int]],
        cached: Sequence[torch.Tensor | None] | None = None,
        pad_id: int = 0,
    ) -> tuple[DecodeBatch, torch.Tensor]:
        """Run ``contexts`` (non-empty id lists) through ``model``; return the batch and the
        ``(B, V)`` logits of each row's next token.

        ``cached[i]``, when given and not None, is the ``(layers, 2, H, c, D)`` KV of the ``c``
        tokens that precede ``contexts[i]`` (as ``row_kv`` returns it): only ``contexts[i]`` is
        computed, at positions ``c, c + 1, ...``, attending to the cached keys, and the row holds
        ``c + len(contexts[i])`` tokens. ``cached`` is copied, never modified.
        """
        if not contexts or not all(contexts):
            raise ValueError("prefill needs at least one context and no empty context")
        past_kv = list(cached) if cached is not None else [None] * len(contexts)
        if len(past_kv) != len(contexts):
            raise ValueError(f"{len(contexts)} contexts but {len(past_kv)} cached prefixes")
        past = [0 if kv is None else kv.shape[-2] for kv in past_kv]
        rows, depth, width = len(contexts), max(past), max(len(c) for c in contexts)
        input_ids = torch.full((rows, width), pad_id, dtype=torch.long)  # (B, S)
        # (B, P + S): row i is [pad, its c_i cached tokens | pad, its new tokens]
        attention_mask = torch.zeros((rows, depth + width), dtype=torch.long)
        for row, (context, n_past) in enumerate(zip(contexts, past, strict=True)):
            input_ids[row, width - len(context) :] = torch.tensor(context, dtype=torch.long)
            attention_mask[row, depth - n_past : depth] = 1
            attention_mask[row, depth + width - len(context) :] = 1
        new_mask = attention_mask[:, depth:]  # (B, S)
        position_ids = (new_mask.cumsum(-1) - 1).clamp(min=0) + torch.tensor(past).unsqueeze(1)
        device = model.device  # built on the CPU, moved once
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        position_ids = position_ids.to(device)
        cache = DynamicCache(config=model.config)
        unsupported = [type(layer).__name__ for layer in cache.layers if not _is_full(layer)]
        if unsupported:
            raise NotImplementedError(
                f"DecodeBatch supports full-attention caches only, got {unsupported}"
            )
        if depth:
            kv = _stack_left_padded(past_kv, depth)  # (layers, 2, B, H, P, D)
            for layer, (keys, values) in zip(_full_layers(cache), kv, strict=True):
                layer.update(keys, values)
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{_cache_argument(model): cache},
        )
        batch = cls(cache, attention_mask, attention_mask.sum(-1))  # the forward filled it in place
        if depth:
            batch._align_right()
        return batch, out.logits[:, -1]

    @torch.inference_mode()
    def step(self, model: PreTrainedModel, token_ids: Sequence[int]) -> torch.Tensor:
        """Feed one token per row; return the ``(B, V)`` logits of the following token."""
        if len(token_ids) != self.size:
            raise ValueError(f"step got {len(token_ids)} tokens for {self.size} rows")
        device = self.attention_mask.device
        input_ids = torch.tensor(token_ids, dtype=torch.long, device=device).unsqueeze(1)  # (B, 1)
        ones = torch.ones((self.size, 1), dtype=torch.long, device=device)
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)  # (B, L + 1)
        out = model(
            input_ids=input_ids,
            attention_mask=self.attention_mask,
            position_ids=self.lengths.unsqueeze(1),  # (B, 1)
            use_cache=True,
            **{_cache_argument(model): self.cache},
        )
        self.lengths = self.lengths + 1
        return out.logits[:, -1]

    @torch.inference_mode()
    def row_kv(self, row: int) -> torch.Tensor:
        """A copy of ``row``'s keys and values, real tokens only: ``(layers, 2, H, n, D)``."""
        n = int(self.lengths[row])
        return torch.stack(
            [
                torch.stack([keys[row, :, -n:], values[row, :, -n:]])
                for keys, values in map(_kv, _full_layers(self.cache))
            ]
        )

    @torch.inference_mode()
    def select(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in that order) and drop the padding columns no kept row needs."""
        if not rows:
            raise ValueError("select needs at least one row; drop the batch instead")
        index = torch.tensor(rows, dtype=torch.long, device=self.attention_mask.device)
        mask = self.attention_mask[index]  # (B', L)
        start = int(mask.any(0).long().argmax())  # first column some kept row attends to
        self.attention_mask = mask[:, start:]
        self.lengths = self.lengths[index]
        for layer in _full_layers(self.cache):
            keys, values = _kv(layer)
            layer.keys = keys[index, :, start:]
            layer.values = values[index, :, start:]

    @torch.inference_mode()
    def extend(self, other: DecodeBatch) -> None:
        """Append ``other``'s rows after this batch's, left-padding the shorter cache."""
        width = max(self.attention_mask.shape[1], other.attention_mask.shape[1])
        self.attention_mask = torch.cat(
            [_left_pad(self.attention_mask, width, -1), _left_pad(other.attention_mask, width, -1)]
        )
        self.lengths = torch.cat([self.lengths, other.lengths])
        for mine, theirs in zip(_full_layers(self.cache), _full_layers(other.cache), strict=True):
            (my_keys, my_values), (their_keys, their_values) = _kv(mine), _kv(theirs)
            mine.keys = torch.cat([_left_pad(my_keys, width, -2), _left_pad(their_keys, width, -2)])
            mine.values = torch.cat(
                [_left_pad(my_values, width, -2), _left_pad(their_values, width, -2)]
            )

    def _align_right(self) -> None:
        """Move every row's real tokens (in order) to the right end, dropping the gaps between
        them and the columns no row needs, so that the layout invariant holds again."""
        width = int(self.lengths.max())
        # a stable sort of the 0/1 mask puts padding first and keeps the real columns in order
        index = torch.sort(self.attention_mask, dim=-1, stable=True).indices[:, -width:]  # (B, W)
        self.attention_mask = self.attention_mask.gather(1, index)
        for layer in _full_layers(self.cache):
            keys, values = _kv(layer)
            heads, dim = keys.shape[1], keys.shape[3]
            expanded = index[:, None, :, None].expand(-1, heads, -1, dim)  # (B, H, W, D)
            layer.keys = keys.gather(2, expanded)
            layer.values = values.gather(2, expanded)


def _stack_left_padded(kv: Sequence[torch.Tensor | None], depth: int) -> torch.Tensor:
    """Per-row ``(layers, 2, H, c, D)`` KV (None for c = 0), zero-padded on the left to ``depth``
    tokens and stacked on a batch dimension: ``(layers, 2, B, H, depth, D)``."""
    template = next(t for t in kv if t is not None)
    empty = template.new_zeros((*template.shape[:-2], 0, template.shape[-1]))
    rows = [_left_pad(empty if t is None else t, depth, -2) for t in kv]
    return torch.stack(rows, dim=2)


def _is_full(layer: object) -> bool:
    return type(layer) is DynamicLayer and not layer.is_sliding


def _full_layers(cache: DynamicCache) -> list[DynamicLayer]:
    """``cache``'s layers, typed as what ``prefill`` checked they are: full-attention
    ``DynamicLayer``s."""
    layers = [layer for layer in cache.layers if isinstance(layer, DynamicLayer)]
    if len(layers) != len(cache.layers):
        raise NotImplementedError("DecodeBatch supports full-attention caches only")
    return layers


def _kv(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """A filled layer's keys and values (every layer is once the batch's prefill ran)."""
    if layer.keys is None or layer.values is None:
        raise RuntimeError("the KV cache layer holds no keys or values yet")
    return layer.keys, layer.values


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zero-pad ``tensor`` on the left of ``dim`` (a negative index) up to ``width``."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    pad = [0, 0] * (-dim - 1) + [missing, 0]  # F.pad lists (left, right) from the last dim back
    return F.pad(tensor, pad)


_CACHE_ARGUMENTS: dict[type[torch.nn.Module], str] = {}


def _cache_argument(model: torch.nn.Module) -> str:
    """The forward's name for the KV cache: ``cache`` in transformers 5.x, which deprecates (and
    will drop) the ``past_key_values`` that older versions take. Looked up once per model class."""
    model_class = type(model)
    name = _CACHE_ARGUMENTS.get(model_class)
    if name is None:
        parameters = inspect.signature(model_class.forward).parameters
        name = _CACHE_ARGUMENTS[model_class] = (
            "cache" if "cache" in parameters else "past_key_values"
        )
    return name
