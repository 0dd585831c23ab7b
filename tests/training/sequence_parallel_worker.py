"""Two ranks sharing long packed micro-batches (sequence parallelism), for test_sequence_parallel.py.

Run under torchrun: ``python -m torch.distributed.run --standalone --nproc_per_node 2
tests/training/sequence_parallel_worker.py --out DIR``. Every rank builds the same random models
and sequences (seeded) and:

* ``attention``: for each shape in :data:`SHAPES`, a plain (unsharded) float32 model on both ranks,
  ``split`` views of one packed micro-batch, the weighted log-prob sum of each rank's tokens
  (:func:`weighted_logprob_sum`), backward, and the gradients summed over the group;
* ``actor``: an FSDP2 :class:`Actor` with ``sequence_parallel=2`` and activation checkpointing
  (the backward recomputes every layer, all-gathers included), one SFT step on
  :func:`long_sequences` through ``Actor.micro_batches`` (one micro-batch of 4,096 tokens, up to
  2 x 2,048, so both ranks share it).

Rank 0 writes ``result.pt``: per shape the loss and gradients, and the actor's step report and
full parameters. The test computes the same on one rank, the whole micro-batch at once.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.sft.trainer import nll_loss
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.attention import use_trainer_attention
from agentrl.training.distributed import current_dist_info, distributed
from agentrl.training.packing import PackedMicroBatch, pack, packed_scores
from agentrl.training.sequence_parallel import sequence_parallel_layout

VOCAB = 512
TEMPERATURE = 0.7
CHUNK = 1024
SHAPES: dict[str, dict[str, Any]] = {
    # 16,383 tokens: a 12k sequence and two more, an odd total (split() pads it)
    "long": {"heads": 4, "kv_heads": 2, "lengths": [12288, 3000, 1095]},
    # SmolLM2's head counts (9 and 3) are not divisible by 2 ranks; 3 and 1 are not either
    "odd_heads": {"heads": 3, "kv_heads": 1, "lengths": [1500, 1001, 500]},
    # logprob_chunk_tokens=0: each rank's log-probs from its slice's full logits
    "unchunked": {"heads": 4, "kv_heads": 2, "lengths": [700, 301], "chunk": 0},
}
ACTOR_LENGTHS = [2000, 1500, 596]  # 4,096 tokens (the 16k case is the attention job's)
ACTOR_MAX_TOKENS = 2048  # per rank: the micro-batch is longer than one rank's budget


def random_llama(heads: int, kv_heads: int) -> LlamaForCausalLM:
    """A 2-layer Llama, head dimension 16, identical in every process (seeded init), sdpa."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16 * heads,
        intermediate_size=32 * heads,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=16384,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def long_sequences(lengths: list[int]) -> list[dict[str, Any]]:
    """Random sequences with a random loss mask (never the first token) and an advantage each."""
    generator = torch.Generator().manual_seed(sum(lengths))
    sequences = []
    for n in lengths:
        mask = torch.rand(n, generator=generator) < 0.7
        mask[0] = False
        sequences.append(
            {
                "input_ids": torch.randint(0, VOCAB, (n,), generator=generator),
                "loss_mask": mask,
                "advantages": float(torch.randn((), generator=generator)),
            }
        )
    return sequences


def weighted_logprob_sum(
    model: nn.Module, batch: PackedMicroBatch, chunk: int = CHUNK
) -> torch.Tensor:
    """``sum(advantage * log p)`` over the micro-batch's loss tokens, at :data:`TEMPERATURE`,
    the log-probs ``chunk`` tokens at a time (0: all at once)."""
    scores = packed_scores(model, batch, TEMPERATURE, loss_tokens_only=True, chunk_tokens=chunk)
    weights = batch.fields["advantages"] * batch.loss_mask
    return (scores.logprobs * weights).sum()


def whole_batch(lengths: list[int]) -> PackedMicroBatch:
    (batch,) = pack(long_sequences(lengths), sum(lengths))
    return batch


def attention_job() -> dict[str, Any]:
    info = current_dist_info()
    layout = sequence_parallel_layout(info, info.world_size)
    results = {}
    for name, shape in SHAPES.items():
        model = use_trainer_attention(random_llama(shape["heads"], shape["kv_heads"]))
        view = whole_batch(shape["lengths"]).split(layout)
        loss = weighted_logprob_sum(model, view, shape.get("chunk", CHUNK))
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        for grad in grads.values():
            dist.all_reduce(grad, group=layout.group)
        total = loss.detach().clone()
        dist.all_reduce(total, group=layout.group)
        results[name] = {
            "loss": total,
            "grads": grads,
            "slice": (view.shard.start, view.shard.end) if view.shard else None,
            "tokens": view.n_tokens,
        }
    return results


def actor_job() -> dict[str, Any]:
    model = random_llama(4, 2)
    config = ActorConfig(
        lr=1e-3, sequence_parallel=2, activation_checkpointing=True, logprob_chunk_tokens=CHUNK
    )
    actor = Actor(model, config)
    micro_batches = actor.micro_batches(long_sequences(ACTOR_LENGTHS), ACTOR_MAX_TOKENS)
    report = actor.train_step(micro_batches, lambda m, b: nll_loss(m, b, chunk_tokens=CHUNK))
    params = {n: p.full_tensor() for n, p in actor.model.named_parameters()}
    return {"report": report, "params": params, "micro_batches": len(micro_batches)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with distributed():
        result = {"attention": attention_job(), "actor": actor_job()}
        if dist.get_rank() == 0:
            torch.save(result, args.out / "result.pt")


if __name__ == "__main__":
    main()
