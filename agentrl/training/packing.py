"""Sequence packing: whole trajectories side by side in one ``(1, T)`` row, no padding.

A :class:`PackedMicroBatch` concatenates the sequences of one micro batch (chosen by
:mod:`agentrl.training.micro_batches`) with position ids that restart at 0 for each sequence. Called with
those position ids, ``attention_mask=None`` and no KV cache, transformers detects the packing and
gives each sequence its own causal attention: a block-diagonal causal mask
(``masking_utils.find_packed_sequence_indices``) for eager, sdpa and flex attention, and varlen
kernels from the position ids for flash attention.

Guaranteed:

* :func:`packed_logprobs` gives every token the log-prob its sequence's own unpadded forward gives
  it (tested to 1e-5 in float32 with sdpa and eager, on SmolLM2 and a random Llama), and never
  scores across a boundary: the first token of every sequence gets 0 (no context), so the last
  token of one sequence never "predicts" the first of the next.
* It passes ``use_cache=False``. That matters: with a KV cache (the default in eval mode),
  transformers skips packing detection and tokens silently attend across sequences.
* Attention implementations outside :data:`PACKED_ATTENTION` are refused. Flash and flex attention
  are listed because transformers handles packed position ids for them, but they are not tested
  here (no flash kernels on the CPU; flex takes a minute to compile there).

Not guaranteed: cheap attention. Eager and sdpa get a dense ``T x T`` mask, so their attention
costs grow with ``T^2`` (and eager keeps the weights for the backward), not with the sum of the
squared sequence lengths; keep ``max_tokens`` near the longest sequence there (SmolLM2's GRPO demo
step on the CPU: 4,096 -> 1,024 took its training from 61 s to 39 s). Flash and flex attention
skip the masked blocks. The trainer's sdpa (:mod:`agentrl.training.attention`, which
:class:`~agentrl.training.actor.Actor` applies) keeps one float copy of the mask for the
backward, not one per layer.

Losses: sums over tokens work on the packed ``(1, T)`` tensors directly (fillers and first tokens
have loss mask 0); per-sequence reductions (the sequence-mean modes of
:mod:`agentrl.algorithms.losses`) need one row per sequence, :meth:`PackedMicroBatch.as_rows`.

Inputs are :class:`~agentrl.tokenization.TokenTrajectory` records (per-token fields ``logprobs``
and ``versions`` come along) or mappings of per-token columns: ``input_ids`` and ``loss_mask`` are
required, and every other key (engine log-probs, advantages, old log-probs...) is carried through
into :attr:`PackedMicroBatch.fields`; a scalar is repeated over the sequence's tokens (one advantage
per trajectory). Lists become int64 or float32 tensors, tensors keep their dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from agentrl.algorithms.losses import entropy_from_logits
from agentrl.engine_pool.sampling import logprob_temperature, temperature_logprobs
from agentrl.tokenization.trajectory import TokenTrajectory
from agentrl.training.attention import ATTENTION
from agentrl.training.chunked_logprobs import (
    chunked_token_scores,
    final_hidden_states,
    output_head,
)
from agentrl.training.micro_batches import Plan, balance_across_ranks, plan_micro_batches
from agentrl.training.sequence_parallel import SequenceParallel, SequenceShard

SequenceLike = TokenTrajectory | Mapping[str, Any]
"""A trajectory, or a mapping with per-token ``input_ids``, ``loss_mask`` and any other columns."""

PACKED_ATTENTION = frozenset(
    {"eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", ATTENTION}
)
"""``config._attn_implementation`` values for which transformers keeps packed sequences apart."""

FILLER = -1
"""``sequence_index`` of a filler segment: one token 0, loss mask 0, every field 0."""


@dataclass
class PackedMicroBatch:
    """Sequences concatenated into one row of ``T = sum(seq_lens)`` tokens.

    Segment ``i`` holds tokens ``[cu_seqlens[i], cu_seqlens[i + 1])`` of input sequence
    ``sequence_index[i]`` (or is a filler, :data:`FILLER`, which keeps ranks in lockstep).
    """

    input_ids: torch.Tensor  # (1, T) int64
    position_ids: torch.Tensor  # (1, T) int64, 0 at the start of every segment
    loss_mask: torch.Tensor  # (1, T) bool
    fields: dict[str, torch.Tensor]  # name -> (1, T), the other per-token columns
    seq_lens: list[int]
    sequence_index: list[int]
    n_loss_tokens: int
    shard: SequenceShard | None = None
    """Set on a rank's view of a micro-batch split across a sequence-parallel group
    (:meth:`split`): the model runs on tokens ``[shard.start, shard.end)`` only."""

    @property
    def n_tokens(self) -> int:
        """``T``: every token, fillers included (there is no padding)."""
        return sum(self.seq_lens)

    @property
    def cu_seqlens(self) -> torch.Tensor:
        """Segment boundaries ``(S + 1,)`` int32, as flash attention's varlen kernels take them."""
        lens = torch.tensor([0, *self.seq_lens], dtype=torch.int32, device=self.input_ids.device)
        return lens.cumsum(0, dtype=torch.int32)

    def unpack(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Split a per-token tensor back into one tensor per segment (aligned with
        :attr:`sequence_index`).

        ``values`` is ``(1, T, ...)``, aligned with :attr:`input_ids`: segment ``i`` gives
        ``(seq_lens[i], ...)``. Or it is ``(1, T - 1, ...)``, shifted as
        :func:`~agentrl.training.logprobs.token_logprobs` returns it (entry ``t`` scores token
        ``t + 1``): segment ``i`` gives ``(seq_lens[i] - 1, ...)``, the entries that score its own
        tokens; the entries that cross a boundary are dropped.
        """
        width = self.n_tokens
        if values.dim() < 2 or values.shape[0] != 1 or values.shape[1] not in (width, width - 1):
            raise ValueError(
                f"expected a (1, {width}, ...) or (1, {width - 1}, ...) tensor, "
                f"got {tuple(values.shape)}"
            )
        shift = int(values.shape[1] == width - 1)
        starts = self.cu_seqlens.tolist()
        return [
            values[0, start : start + length - shift]
            for start, length in zip(starts[:-1], self.seq_lens, strict=True)
        ]

    def as_rows(self, values: torch.Tensor, fill: float = 0) -> torch.Tensor:
        """:meth:`unpack`, right-padded with ``fill`` into ``(S, max length, ...)``: one row per
        segment, for per-sequence reductions (the ``(N, T)`` layout of
        :mod:`agentrl.algorithms.losses`, whose sequence-mean modes need one row per sequence).
        Differentiable."""
        return pad_sequence(self.unpack(values), batch_first=True, padding_value=fill)

    def split(self, layout: SequenceParallel) -> PackedMicroBatch:
        """This rank's view of the micro-batch when its sequence-parallel group shares it
        (:mod:`agentrl.training.sequence_parallel`); the micro-batch itself when ``layout.size``
        is 1.

        Every tensor keeps its full ``(1, T)`` width (each rank of the group holds the same
        micro-batch), with ``T`` first padded to a multiple of the group size by a filler
        sequence. The view's :attr:`shard` is the rank's slice ``[r T / P, (r + 1) T / P)``; its
        :attr:`loss_mask` keeps only the tokens the rank scores, those whose predecessor lies in
        the slice, so that a loss summed over the loss tokens, added up over the group, is the
        whole micro-batch's."""
        if layout.size == 1:
            return self
        if self.shard is not None or layout.group is None:
            raise ValueError("split() takes a whole micro-batch and a layout with a group")
        batch = self.padded_to(layout.size)
        width = batch.n_tokens // layout.size
        shard = SequenceShard(layout.rank * width, (layout.rank + 1) * width, layout.group)
        loss_mask = batch.loss_mask & shard.scored(batch.n_tokens, batch.loss_mask.device)
        return dataclasses.replace(
            batch, loss_mask=loss_mask, n_loss_tokens=int(loss_mask.sum()), shard=shard
        )

    def padded_to(self, multiple: int) -> PackedMicroBatch:
        """This micro-batch with ``T`` rounded up to a multiple of ``multiple`` by a filler
        sequence (its own positions from 0, no loss tokens): the real sequences' scores do not
        change. Itself when ``T`` already is one."""
        if multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {multiple}")
        length = (-self.n_tokens) % multiple
        if length == 0:
            return self
        tail = {
            name: torch.zeros(1, length, dtype=value.dtype) for name, value in self.fields.items()
        }
        return dataclasses.replace(
            self,
            input_ids=torch.cat([self.input_ids, self.input_ids.new_zeros(1, length)], 1),
            position_ids=torch.cat([self.position_ids, torch.arange(length)[None]], 1),
            loss_mask=torch.cat([self.loss_mask, self.loss_mask.new_zeros(1, length)], 1),
            fields={name: torch.cat([value, tail[name]], 1) for name, value in self.fields.items()},
            seq_lens=[*self.seq_lens, length],
            sequence_index=[*self.sequence_index, FILLER],
        )

    def to(self, device: torch.device | str) -> PackedMicroBatch:
        """A copy with every tensor on ``device``."""
        return dataclasses.replace(
            self,
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            loss_mask=self.loss_mask.to(device),
            fields={name: value.to(device) for name, value in self.fields.items()},
        )


def sequence_lengths(sequences: Sequence[SequenceLike]) -> list[int]:
    """Token count of each sequence."""
    return [len(_raw_columns(seq)["input_ids"]) for seq in sequences]


def pack(sequences: Sequence[SequenceLike], max_tokens: int) -> list[PackedMicroBatch]:
    """Pack all ``sequences`` into micro batches of at most ``max_tokens`` tokens each
    (:func:`~agentrl.training.micro_batches.plan_micro_batches`; one longer sequence is an error)."""
    return build_micro_batches(
        sequences, plan_micro_batches(sequence_lengths(sequences), max_tokens)
    )


def pack_for_rank(
    sequences: Sequence[SequenceLike], rank: int, world_size: int, max_tokens: int
) -> list[PackedMicroBatch]:
    """This rank's micro batches of a batch every rank holds in full
    (:func:`~agentrl.training.micro_batches.balance_across_ranks`): every rank computes the same plan
    and gets the same number of micro batches."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    plans = balance_across_ranks(sequence_lengths(sequences), world_size, max_tokens)
    return build_micro_batches(sequences, plans[rank])


def build_micro_batches(sequences: Sequence[SequenceLike], plan: Plan) -> list[PackedMicroBatch]:
    """One :class:`PackedMicroBatch` per entry of ``plan`` (lists of indices into ``sequences``);
    an empty entry becomes a one-token filler. Every sequence must have the same columns."""
    if not plan:
        return []
    if not sequences:
        raise ValueError("a plan needs at least one sequence (for the columns of its fillers)")
    schema = _columns(sequences[0], 0)
    return [
        _concatenate([_columns(sequences[i], i) for i in indices], indices, schema)
        if indices
        else _filler(schema)
        for indices in plan
    ]


def packed_logprobs(
    model: nn.Module,
    batch: PackedMicroBatch,
    temperature: float,
    *,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """Log-probs ``(1, T)`` float32 from one packed forward; entry ``t`` scores token ``t``.

    Each entry is :func:`~agentrl.engine_pool.sampling.temperature_logprobs` of the token given
    the tokens before it in its own sequence; the first token of every segment gets 0. Runs the
    model as the caller left it (train mode and grad: differentiable). Raises ``ValueError`` for an
    attention implementation not in :data:`PACKED_ATTENTION`. ``chunk_tokens``: as
    :func:`packed_scores`.
    """
    return packed_scores(model, batch, temperature, chunk_tokens=chunk_tokens).logprobs


@dataclass
class PackedScores:
    """What :func:`packed_scores` computed for the ``K`` scored tokens of a micro-batch."""

    logprobs: torch.Tensor  # (1, T) float32, 0 where not scored; differentiable
    scored: torch.Tensor  # (K,) int64: the positions scored
    entropy: torch.Tensor | None  # (1, T) float32, 0 where not scored; no gradient
    argmax: torch.Tensor | None  # (K,) int64: the most likely token at each scored position


def packed_scores(
    model: nn.Module,
    batch: PackedMicroBatch,
    temperature: float,
    *,
    loss_tokens_only: bool = False,
    chunk_tokens: int | None = None,
    entropy: bool = False,
    argmax: bool = False,
) -> PackedScores:
    """:func:`packed_logprobs`, plus, when asked, the entropy of ``softmax(logits / T)`` (the
    distribution tokens were sampled from; for logging: it carries no gradient) and the greedy
    token at each scored position.

    By default every token but each sequence's first is scored. With ``loss_tokens_only`` only
    tokens with loss mask 1 are, and the LM head runs only at their predecessors: prompt and tool
    tokens need hidden states for the context but no vocabulary-wide logits, which on a 49k
    vocabulary is a fifth of SmolLM2's per-token compute.

    ``chunk_tokens`` (``actor.logprob_chunk_tokens``): 0 or ``None`` computes the ``(K, V)``
    logits at once (through the model's ``logits_to_keep``) and keeps them for the backward; a
    positive value never materialises them: the final hidden states go through the LM head
    ``chunk_tokens`` tokens at a time, recomputed in the backward
    (:func:`~agentrl.training.chunked_logprobs.chunked_token_scores`), the same numbers to
    rounding for ``O(chunk_tokens x V)`` memory instead of ``O(K x V)``.
    """
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in PACKED_ATTENTION:
        raise ValueError(
            f"attention implementation {implementation!r} is not known to keep packed sequences "
            f"apart; use one of {sorted(PACKED_ATTENTION)}"
        )
    wanted = batch.position_ids[0] != 0  # (T,) the first token of a sequence has no context
    if loss_tokens_only:
        wanted = wanted & (batch.loss_mask[0] != 0)
    shard, offset = batch.shard, 0
    inputs: dict[str, Any]
    if shard is None:
        inputs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids}
        inputs["use_cache"] = False
    else:  # this rank's slice: it scores the tokens whose predecessor is in it
        if implementation != ATTENTION:
            raise ValueError(
                f"a sequence-parallel micro-batch needs the model's attention to be {ATTENTION!r}"
                f" (agentrl.training.attention.use_trainer_attention), not "
                f"{implementation!r}"
            )
        inputs, offset = shard.model_inputs(batch.input_ids, batch.position_ids), shard.start
        wanted = wanted & shard.scored(len(wanted), wanted.device)
    scored = wanted.nonzero().squeeze(-1)  # (K,)
    targets = batch.input_ids[0, scored]  # (K,)
    if chunk_tokens:
        hidden = final_hidden_states(model, **inputs)[0, scored - 1 - offset]  # (K, H)
        chunked = chunked_token_scores(
            hidden,
            output_head(model),
            targets,
            temperature,
            chunk_tokens,
            entropy=entropy,
            argmax=argmax,
        )
        values, top = chunked.logprobs, chunked.argmax  # (K,), (K,)
        ent = None if chunked.entropy is None else chunked.entropy.detach()
    else:
        logits = model(**inputs, logits_to_keep=scored - 1 - offset).logits[0]  # (K, V)
        values = temperature_logprobs(logits, targets, temperature)  # (K,)
        top = logits.detach().argmax(-1) if argmax else None
        ent = None
        if entropy:
            with torch.no_grad():
                ent = entropy_from_logits(
                    logits.detach()[None], temperature=logprob_temperature(temperature)
                )[0]
    return PackedScores(
        logprobs=_aligned(values, scored, batch),
        scored=scored,
        entropy=None if ent is None else _aligned(ent, scored, batch),
        argmax=top,
    )


def _aligned(values: torch.Tensor, scored: torch.Tensor, batch: PackedMicroBatch) -> torch.Tensor:
    """``(K,)`` values at ``scored`` in a ``(1, T)`` float32 tensor of zeros (differentiable)."""
    zeros = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=values.device)
    return zeros.index_put((torch.zeros_like(scored), scored), values.float())


def _raw_columns(seq: SequenceLike) -> Mapping[str, Any]:
    if isinstance(seq, TokenTrajectory):
        return {
            "input_ids": seq.input_ids,
            "loss_mask": seq.loss_mask,
            "logprobs": seq.logprobs,
            "versions": seq.versions,
        }
    return seq


def _columns(seq: SequenceLike, index: int) -> dict[str, torch.Tensor]:
    """Sequence ``index`` as 1-D tensors of its length ``n``, checked."""
    raw = _raw_columns(seq)
    missing = {"input_ids", "loss_mask"} - raw.keys()
    if missing:
        raise ValueError(f"sequence {index} lacks {sorted(missing)}")
    n = len(raw["input_ids"])
    if n == 0:
        raise ValueError(f"sequence {index} is empty")
    columns = {}
    for name, value in raw.items():
        column = torch.as_tensor(value)
        if column.dim() == 0:
            column = column.expand(n)  # one value for the whole sequence
        if column.shape != (n,):
            raise ValueError(
                f"sequence {index}: {name!r} has shape {tuple(column.shape)}; expected ({n},) "
                "like input_ids, or a scalar"
            )
        columns[name] = column
    columns["input_ids"] = columns["input_ids"].long()
    columns["loss_mask"] = columns["loss_mask"].bool()
    if columns["loss_mask"][0]:
        raise ValueError(f"sequence {index}: loss_mask[0] is 1, but its first token has no context")
    return columns


def _concatenate(
    parts: list[dict[str, torch.Tensor]], indices: list[int], schema: dict[str, torch.Tensor]
) -> PackedMicroBatch:
    for index, columns in zip(indices, parts, strict=True):
        if columns.keys() != schema.keys():
            raise ValueError(
                f"sequence {index} has columns {sorted(columns)}, sequence 0 has {sorted(schema)}"
            )
    seq_lens = [len(columns["input_ids"]) for columns in parts]
    joined = {name: torch.cat([columns[name] for columns in parts])[None] for name in schema}
    loss_mask = joined.pop("loss_mask")  # (1, T)
    return PackedMicroBatch(
        input_ids=joined.pop("input_ids"),
        position_ids=torch.cat([torch.arange(n) for n in seq_lens])[None],
        loss_mask=loss_mask,
        fields=joined,
        seq_lens=seq_lens,
        sequence_index=list(indices),
        n_loss_tokens=int(loss_mask.sum()),
    )


def _filler(schema: dict[str, torch.Tensor]) -> PackedMicroBatch:
    zeros = {name: torch.zeros(1, 1, dtype=column.dtype) for name, column in schema.items()}
    return PackedMicroBatch(
        input_ids=zeros.pop("input_ids"),
        position_ids=torch.zeros(1, 1, dtype=torch.long),
        loss_mask=zeros.pop("loss_mask"),
        fields=zeros,
        seq_lens=[1],
        sequence_index=[FILLER],
        n_loss_tokens=0,
    )
