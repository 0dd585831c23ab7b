"""Sequence parallelism: one packed micro-batch split across the ranks of a group.

A packed micro-batch of ``T`` tokens that is too long for one rank's memory is cut into ``P``
equal slices of ``T / P`` tokens, one per rank of a sequence-parallel group of ``P`` ranks. Each
rank runs every layer on its own slice only: embeddings, MLPs, norms, the LM head and the loss
scale with ``T / P``. Attention is the only step that needs other tokens; there each rank
all-gathers the keys and values of the whole sequence (after the rotary embedding, which each
rank applies to its own tokens at their true positions) and attends its own queries to them under
the packed causal mask, a ``(T / P) x T`` block of the full ``T x T`` one. In the backward the
all-gather becomes a reduce-scatter of the keys' and values' gradients
(:mod:`agentrl.training.attention`: torch's differentiable ``all_gather_single``, gloo and nccl
alike).

Why this scheme and not Ulysses' all-to-all over heads (verl, slime): Ulysses needs the number of
attention heads, and of key/value heads, divisible by ``P``; SmolLM2-135M has 9 and 3, so 2 ranks
could not split it. Gathering keys and values works for any head count, and with grouped-query
attention the keys and values are the small part (SmolLM2: a third of the queries' size). This is
the all-gather form of context parallelism that Llama 3's training used. Costs: every rank holds
the whole sequence's keys and values for one layer at a time (``T x kv_heads x head_dim`` twice),
and the mask is dense (``T / P x T`` booleans): the attention's compute per rank is ``T^2 / P``,
uneven across ranks under a causal mask (the first slice attends to fewer keys). Ring attention
would avoid holding all keys; it is not built.

Contract. Every rank of a group holds the same packed micro-batch
(:meth:`~agentrl.training.packing.PackedMicroBatch.split` makes its view: the slice, the mask,
and a loss mask restricted to the tokens this rank scores, those whose predecessor is in its
slice). A loss that *sums over tokens* is then this rank's part of the whole micro-batch's sum:
adding the parts over the group (which :class:`~agentrl.training.actor.Actor` does for losses
and denominators, and FSDP2's gradient reduction does for gradients) gives exactly the one-rank
values. Losses that need a whole sequence on one rank (sequence-mean aggregations, sequence-level
ratios, a critic's values) are refused by the RL config. Every rank of a group runs the same
forwards in the same order (each all-gather is a collective).

The model must use the trainer's attention (:func:`~agentrl.training.attention.use_trainer_attention`,
which :class:`~agentrl.training.actor.Actor` applies to sdpa models): transformers' ``"sdpa"`` with
the gather in front when a group is passed, so one model serves both sharded and whole
micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from agentrl.training.attention import GROUP_KWARG
from agentrl.training.distributed import DistInfo


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's place in the sequence-parallel layout of the job.

    Ranks ``[k * size, (k + 1) * size)`` form sequence-parallel group ``k``, which is data-parallel
    rank ``k`` of ``world_size / size``: its ranks hold the same micro-batches, each a slice.
    ``size == 1`` is plain data parallelism (no group).
    """

    size: int
    """Ranks per group, ``P``."""
    rank: int
    """This rank's index in its group (which slice it takes)."""
    group: dist.ProcessGroup | None
    """The group's process group (``None`` when ``size == 1``)."""
    data_rank: int
    """Which share of a batch this rank's group takes."""
    data_size: int
    """How many shares a batch is split into (``world_size / size``)."""

    def describe(self) -> str:
        """One line for a run's output."""
        groups = f"{self.data_size} data-parallel group{'s' if self.data_size > 1 else ''}"
        return f"sequence parallel: {self.size} ranks per micro-batch, {groups}"


def sequence_parallel_layout(info: DistInfo, size: int) -> SequenceParallel:
    """Make the groups of ``size`` consecutive ranks (a collective: every rank calls it)."""
    if size < 1 or info.world_size % size:
        raise ValueError(
            f"actor.sequence_parallel={size} must be >= 1 and divide the number of ranks "
            f"({info.world_size})"
        )
    if size == 1:
        return SequenceParallel(1, 0, None, info.rank, info.world_size)
    mine = None
    for first in range(0, info.world_size, size):
        ranks = list(range(first, first + size))
        group = dist.new_group(ranks)  # every rank creates every group, in the same order
        if info.rank in ranks:
            mine = group
    return SequenceParallel(
        size, info.rank % size, mine, info.rank // size, info.world_size // size
    )


@dataclass(frozen=True)
class SequenceShard:
    """Tokens ``[start, end)`` of a packed micro-batch, this rank's slice of it."""

    start: int
    end: int
    group: dist.ProcessGroup

    def model_inputs(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> dict[str, Any]:
        """Forward keywords for this slice of the ``(1, T)`` ``input_ids`` and
        ``position_ids``: the slice, its ``(1, 1, T / P, T)`` packed causal mask over the whole
        micro-batch, and the group. Transformers passes a 4-D mask through untouched."""
        return {
            "input_ids": input_ids[:, self.start : self.end],
            "position_ids": position_ids[:, self.start : self.end],
            "attention_mask": shard_mask(position_ids[0], self.start, self.end),
            GROUP_KWARG: self.group,
            "use_cache": False,
        }

    def scored(self, length: int, device: torch.device) -> torch.Tensor:
        """``(length,)`` bool: the tokens this rank scores, those whose predecessor is in its
        slice (``[start + 1, end + 1)``)."""
        here = torch.zeros(length, dtype=torch.bool, device=device)
        here[self.start + 1 : self.end + 1] = True
        return here


def shard_mask(position_ids: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """``(1, 1, end - start, T)`` bool: query ``q`` (global index ``start + q``) may attend key
    ``k`` when both are in the same packed sequence (a sequence starts where its position id is
    0) and ``k <= start + q``."""
    sequence = (position_ids == 0).cumsum(0)  # (T,) which packed sequence each token is in
    keys = torch.arange(position_ids.shape[0], device=position_ids.device)
    queries = keys[start:end, None]
    same = sequence[start:end, None] == sequence[None, :]
    return (same & (keys[None, :] <= queries))[None, None]
