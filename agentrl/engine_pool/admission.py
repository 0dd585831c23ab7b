"""Admitting requests into a decode batch on top of a prefix cache, and caching rows that leave.

`LocalEngine` calls :func:`prefill_admission` (in its worker thread) for the requests joining the
batch and :func:`cache_rows` for the rows about to leave it; both run under the engine's model
lock, so the `PrefixCache` is never touched concurrently.

Admission. Each context's longest cached prefix (`PrefixCache.lookup`) is reused and only the rest
of the context, its *suffix*, is computed, at positions continuing after the prefix and attending
to its cached keys (`DecodeBatch.prefill` with ``cached``). Rows are grouped by suffix length
(:func:`padding_groups`): a conversation's next turn has a short suffix (the last sampled token
and the new messages) while a new prompt has a long one, and padding the short ones up to the long
one in a single forward pass can spend more compute than the cache saves. Every group's rows are
then merged into one `DecodeBatch`, left-padded like any other, so that rows admitted from the
cache decode like rows prefilled from scratch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from agentrl.engine_pool.kv_batch import DecodeBatch
from agentrl.engine_pool.prefix_cache import PrefixCache


@dataclass
class Admission:
    """What :func:`prefill_admission` built: rows in ``order``, not in the order given."""

    batch: DecodeBatch
    """The admitted rows; row ``j`` is context ``order[j]``."""
    logits: torch.Tensor
    """``(B, V)`` next-token logits, row ``j`` for context ``order[j]``."""
    order: list[int]
    """Indices into the contexts given, in batch row order."""
    cached_tokens: int
    """Tokens whose KV came from the prefix cache."""
    computed_tokens: int
    """Tokens whose KV was computed (padding not counted)."""
    forwards: int
    """Prefill forward passes run."""


def prefill_admission(
    model: PreTrainedModel,
    cache: PrefixCache,
    contexts: Sequence[list[int]],
    session_ids: Sequence[str | None],
) -> Admission:
    """Prefill ``contexts`` (at least one, none empty), reusing cached prefixes (module docstring).

    ``session_ids[i]`` is only a lookup hint for ``contexts[i]`` (`PrefixCache.lookup`).
    """
    hits = [cache.lookup(c, s) for c, s in zip(contexts, session_ids, strict=True)]
    cached = [0 if hit is None else hit.length for hit in hits]
    groups = padding_groups([len(c) - n for c, n in zip(contexts, cached, strict=True)])
    parts: list[tuple[DecodeBatch, torch.Tensor]] = []
    for group in groups:
        suffixes = [contexts[i][cached[i] :] for i in group]
        kv = [None if (hit := hits[i]) is None else hit.kv for i in group]
        parts.append(DecodeBatch.prefill(model, suffixes, kv))
    batch = parts[0][0]
    for other, _ in parts[1:]:
        batch.extend(other)
    return Admission(
        batch=batch,
        logits=torch.cat([logits for _, logits in parts]),
        order=[i for group in groups for i in group],
        cached_tokens=sum(cached),
        computed_tokens=sum(len(c) for c in contexts) - sum(cached),
        forwards=len(groups),
    )


def cache_rows(
    cache: PrefixCache,
    batch: DecodeBatch,
    rows: Sequence[int],
    contexts: Sequence[list[int]],
    session_ids: Sequence[str | None],
) -> None:
    """Store each of ``batch``'s ``rows`` in ``cache``, under ``contexts[j]``'s first tokens.

    ``contexts[j]`` is everything row ``rows[j]`` has seen or produced; its KV covers the first
    ``batch.lengths[row]`` tokens of it (a token just sampled has not been fed yet). The caller
    guarantees that the batch's KV was computed by the current weights.
    """
    for row, context, session_id in zip(rows, contexts, session_ids, strict=True):
        length = int(batch.lengths[row])
        if length <= cache.max_tokens:  # skips the copy when the entry could not be stored
            cache.insert(context[:length], batch.row_kv(row), session_id)


def padding_groups(lengths: Sequence[int], max_padding: float = 1.0) -> list[list[int]]:
    """Split row indices into prefill groups so that padding stays bounded.

    Rows are taken longest first; a group grows while its padded size (rows x its longest row)
    stays within ``(1 + max_padding)`` times its real tokens.
    """
    groups: list[list[int]] = []
    real = 0  # real tokens in groups[-1]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups:
            group = groups[-1]
            padded = (len(group) + 1) * lengths[group[0]]  # the first row is the longest
            if padded <= (1 + max_padding) * (real + lengths[i]):
                group.append(i)
                real += lengths[i]
                continue
        groups.append([i])
        real = lengths[i]
    return groups
