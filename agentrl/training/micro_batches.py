"""Which sequences share a micro batch, and which rank trains them: plans over lengths, no tensors.

A *plan* is a list of micro batches, each a list of sequence indices. :func:`plan_micro_batches`
fills micro batches up to a token budget (dynamic micro-batch size: many short sequences or a few
long ones); :func:`balance_across_ranks` first splits the sequences between data-parallel ranks
with balanced token totals, then plans each rank. :mod:`agentrl.training.packing` turns a plan into
packed tensors.

Guaranteed, for every input:

* Every sequence index appears exactly once in a plan (in exactly one rank's plan), and every micro
  batch holds at most ``max_tokens`` tokens. A sequence longer than ``max_tokens`` is an error,
  never a silently oversized or truncated micro batch: a trajectory cannot be split (its tokens
  need their whole prefix), so the budget must be at least the rollout's maximum sequence length.
* Plans are deterministic: a function of the lengths and arguments only (ties broken by index),
  so every rank can compute the same plan locally and take its own part.
* :func:`plan_micro_batches` never leaves two micro batches that would fit together in the budget
  (best-fit decreasing also stays within 11/9 of the fewest possible micro batches, plus one).
* Under :func:`balance_across_ranks` every rank gets the same number of micro batches, because
  FSDP's collectives run in lockstep, one round per micro batch. Token totals differ between ranks
  by at most the longest sequence (greedy longest-first assignment).

Not guaranteed: balanced compute. Attention cost grows with the square of each sequence's length,
and a packed micro batch run with a dense block-diagonal mask (sdpa, eager) still pays for the
whole ``T x T`` score matrix; only varlen kernels (flash attention, flex attention) skip it.

Work is ``O(n log n)`` in the number of sequences (sorting and heaps, plus ``O(n)`` memory moves
in C for the sorted free-space list).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Sequence

Plan = list[list[int]]
"""Micro batches, each a list of sequence indices in increasing order."""


def plan_micro_batches(lengths: Sequence[int], max_tokens: int) -> Plan:
    """Pack sequence indices into micro batches of at most ``max_tokens`` tokens.

    Best-fit decreasing: longest sequence first, each into the fullest micro batch it still fits,
    or a new one. Micro batches come out largest first (ties: lowest first index), their indices
    in increasing order. Raises ``ValueError`` on a length below 1 or above ``max_tokens``.
    """
    _check_lengths(lengths, max_tokens)
    micro_batches: Plan = []
    free: list[tuple[int, int]] = []  # (tokens still free, micro batch), sorted
    for index in _longest_first(lengths):
        size = lengths[index]
        slot = bisect_left(free, (size, -1))  # the tightest micro batch with room for it
        if slot == len(free):
            micro_batches.append([index])
            insort(free, (max_tokens - size, len(micro_batches) - 1))
        else:
            room, target = free.pop(slot)
            micro_batches[target].append(index)
            insort(free, (room - size, target))
    return _ordered(micro_batches, lengths)


def balance_across_ranks(lengths: Sequence[int], world_size: int, max_tokens: int) -> list[Plan]:
    """One plan per rank: token totals balanced, the same number of micro batches on every rank.

    Sequences go longest first to the rank with the fewest tokens so far (ties: lowest rank), then
    each rank is planned with :func:`plan_micro_batches`. A rank with fewer micro batches than the
    busiest one splits its largest multi-sequence micro batches in two (which keeps every micro
    batch within budget); a rank that still has too few (it holds only a few long sequences, or
    none) gets empty micro batches at the end, which the packer turns into one-token filler
    batches with no loss. Micro batches on each rank are ordered largest first, so micro batch
    ``j`` is of similar size on every rank.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    _check_lengths(lengths, max_tokens)
    parts: list[list[int]] = [[] for _ in range(world_size)]
    loads = [(0, rank) for rank in range(world_size)]  # (tokens, rank), a heap
    for index in _longest_first(lengths):
        tokens, rank = heapq.heappop(loads)
        parts[rank].append(index)
        heapq.heappush(loads, (tokens + lengths[index], rank))
    plans = []
    for part in parts:
        part.sort()
        local = plan_micro_batches([lengths[i] for i in part], max_tokens)
        plans.append([[part[i] for i in micro_batch] for micro_batch in local])
    count = max(len(plan) for plan in plans)
    return [_equalise(plan, count, lengths) for plan in plans]


def plan_tokens(plan: Plan, lengths: Sequence[int]) -> list[int]:
    """Tokens in each micro batch of ``plan``."""
    return [sum(lengths[i] for i in micro_batch) for micro_batch in plan]


def _equalise(plan: Plan, count: int, lengths: Sequence[int]) -> Plan:
    """Split the largest multi-sequence micro batches until there are ``count``, then pad with []."""
    plan = [list(micro_batch) for micro_batch in plan]
    splittable = [(-tokens, i) for i, tokens in enumerate(plan_tokens(plan, lengths))]
    splittable = [entry for entry in splittable if len(plan[entry[1]]) > 1]
    heapq.heapify(splittable)
    while len(plan) < count and splittable:
        _, i = heapq.heappop(splittable)
        first, second = _halves(plan[i], lengths)
        plan[i] = first
        plan.append(second)
        for j in (i, len(plan) - 1):
            if len(plan[j]) > 1:
                heapq.heappush(splittable, (-sum(lengths[k] for k in plan[j]), j))
    plan.extend([] for _ in range(count - len(plan)))
    return _ordered(plan, lengths)


def _halves(micro_batch: list[int], lengths: Sequence[int]) -> tuple[list[int], list[int]]:
    """Two non-empty parts of a micro batch (>= 2 sequences) with close token counts."""
    parts: tuple[list[int], list[int]] = ([], [])
    totals = [0, 0]
    for index in _longest_first(lengths, micro_batch):
        lighter = 0 if totals[0] <= totals[1] else 1
        parts[lighter].append(index)
        totals[lighter] += lengths[index]
    return sorted(parts[0]), sorted(parts[1])


def _ordered(plan: Plan, lengths: Sequence[int]) -> Plan:
    """Indices increasing inside each micro batch; largest micro batch first, empty ones last."""
    plan = [sorted(micro_batch) for micro_batch in plan]
    return sorted(
        plan,
        key=lambda mb: (-sum(lengths[i] for i in mb), mb[0] if mb else len(lengths)),
    )


def _longest_first(lengths: Sequence[int], indices: Sequence[int] | None = None) -> list[int]:
    chosen = range(len(lengths)) if indices is None else indices
    return sorted(chosen, key=lambda i: (-lengths[i], i))


def _check_lengths(lengths: Sequence[int], max_tokens: int) -> None:
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    for index, length in enumerate(lengths):
        if length < 1:
            raise ValueError(f"sequence {index} has {length} tokens; sequences must be non-empty")
        if length > max_tokens:
            raise ValueError(
                f"sequence {index} has {length} tokens, more than max_tokens={max_tokens}; a "
                "sequence cannot be split across micro batches, so raise max_tokens to at least "
                "the longest sequence a rollout can produce"
            )
