"""Sequence parallelism (issue 36, point 2): two gloo ranks sharing a 16k-token packed micro-batch
give the loss and gradients one rank gives on all of it.

The two-rank job is tests/training/sequence_parallel_worker.py. The one-rank references run here,
in float32 and in float64, and every comparison's tolerance is the float32 reference's own error
against float64 on this CPU (`float_tolerance`): the two-rank float32 result must be as close to
the exact value as one rank's float32 result is (within ``FACTOR``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from float_tolerance import assert_within, float32_tolerance, tolerance
from fsdp_worker import one_process_group
from sequence_parallel_worker import (
    ACTOR_LENGTHS,
    CHUNK,
    SHAPES,
    long_sequences,
    random_llama,
    weighted_logprob_sum,
    whole_batch,
)
from torchrun_jobs import run_torchrun

from agentrl.sft.trainer import nll_loss
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.attention import use_trainer_attention
from agentrl.training.distributed import DistInfo
from agentrl.training.packing import FILLER, pack, packed_scores
from agentrl.training.sequence_parallel import (
    SequenceParallel,
    sequence_parallel_layout,
    shard_mask,
)

WORKER = Path(__file__).with_name("sequence_parallel_worker.py")


@pytest.fixture(scope="module")
def dist_info() -> Iterator[DistInfo]:
    with one_process_group() as info:
        yield info


# -- one process: the view, the mask, the refusals ---------------------------------------------


def test_the_ranks_views_partition_the_loss_tokens(dist_info: DistInfo) -> None:
    (batch,) = pack(long_sequences([7, 5, 3]), 15)
    views = [
        batch.split(SequenceParallel(3, rank, torch.distributed.group.WORLD, 0, 1))
        for rank in range(3)
    ]
    # 15 tokens over 3 ranks: no padding; slices [0,5), [5,10), [10,15)
    assert [(v.shard.start, v.shard.end) for v in views if v.shard] == [(0, 5), (5, 10), (10, 15)]
    masks = torch.stack([v.loss_mask[0] for v in views])
    assert torch.equal(masks.sum(0).bool(), batch.loss_mask[0])  # every loss token, once
    assert int(masks.sum()) == batch.n_loss_tokens == sum(v.n_loss_tokens for v in views)
    for rank, view in enumerate(views):  # rank r scores the tokens after its slice's positions
        scored = view.loss_mask[0].nonzero().squeeze(-1)
        assert all(5 * rank + 1 <= int(t) <= 5 * rank + 5 for t in scored)
    # 15 tokens over 2 ranks: a one-token filler sequence makes 16
    two = batch.split(SequenceParallel(2, 1, torch.distributed.group.WORLD, 0, 1))
    assert two.n_tokens == 16 and two.sequence_index[-1] == FILLER and two.seq_lens[-1] == 1
    assert two.shard is not None and (two.shard.start, two.shard.end) == (8, 16)
    assert all(value.shape == (1, 16) for value in two.fields.values())


def test_the_shard_mask_is_the_slice_of_the_packed_causal_mask() -> None:
    positions = torch.tensor([0, 1, 2, 3, 0, 1, 2, 0, 1, 0])
    full = shard_mask(positions, 0, 10)[0, 0]
    sequence = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 3])
    expected = (sequence[:, None] == sequence[None, :]) & torch.ones(10, 10).tril().bool()
    assert torch.equal(full, expected)
    assert torch.equal(shard_mask(positions, 4, 8)[0, 0], expected[4:8])


def test_a_model_not_switched_to_sequence_parallel_attention_is_refused(
    dist_info: DistInfo,
) -> None:
    (batch,) = pack(long_sequences([6, 4]), 10)
    view = batch.split(SequenceParallel(2, 0, torch.distributed.group.WORLD, 0, 1))
    with pytest.raises(ValueError, match="agentrl_sdpa"):
        packed_scores(random_llama(4, 2), view, 1.0)


def test_without_a_shard_the_sequence_parallel_model_is_the_sdpa_model(
    dist_info: DistInfo,
) -> None:
    batch = whole_batch([40, 25, 7])
    plain = weighted_logprob_sum(random_llama(4, 2), batch)
    switched = weighted_logprob_sum(use_trainer_attention(random_llama(4, 2)), batch)
    assert torch.equal(plain, switched)


def test_sizes_that_do_not_divide_the_ranks_are_refused(dist_info: DistInfo) -> None:
    with pytest.raises(ValueError, match="must be >= 1 and divide the number of ranks"):
        sequence_parallel_layout(dist_info, 2)
    with pytest.raises(ValueError, match="divide the number of ranks"):
        Actor(random_llama(4, 2), ActorConfig(sequence_parallel=2))


# -- two ranks --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sequence-parallel")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", "2", str(WORKER), "--out", str(out)]
    done = run_torchrun(command, timeout=600)
    assert done.returncode == 0, done.stderr[-8000:]
    return torch.load(out / "result.pt")


def one_rank_loss_and_grads(name: str, dtype: torch.dtype) -> tuple[torch.Tensor, dict]:
    shape = SHAPES[name]
    model = random_llama(shape["heads"], shape["kv_heads"]).to(dtype)
    loss = weighted_logprob_sum(model, whole_batch(shape["lengths"]), shape.get("chunk", CHUNK))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SHAPES))
def test_two_ranks_give_one_ranks_loss_and_gradients(
    two_ranks: dict[str, Any], dist_info: DistInfo, name: str
) -> None:
    """``long``: 16,383 tokens (a 12,288-token sequence and two more) over 2 ranks;
    ``odd_heads``: 3 query heads and 1 key/value head, which no head-splitting scheme could
    share between 2 ranks; ``unchunked``: log-probs from full logits (logprob_chunk_tokens=0)."""
    mine = two_ranks["attention"][name]
    assert mine["tokens"] == sum(SHAPES[name]["lengths"]) + sum(SHAPES[name]["lengths"]) % 2
    assert mine["slice"] == (0, mine["tokens"] // 2)  # rank 0's half
    loss32, grads32 = one_rank_loss_and_grads(name, torch.float32)
    loss64, grads64 = one_rank_loss_and_grads(name, torch.float64)
    assert_within(mine["loss"], loss64, float32_tolerance(loss32, loss64), "loss")
    assert set(mine["grads"]) == set(grads64)
    for param, exact in grads64.items():
        atol = float32_tolerance(grads32[param], exact)
        assert_within(mine["grads"][param], exact, atol, param)


@pytest.mark.slow
def test_an_actor_step_over_two_ranks_sharing_each_micro_batch_is_one_ranks_step(
    two_ranks: dict[str, Any], dist_info: DistInfo
) -> None:
    """``Actor`` with ``sequence_parallel=2`` and activation checkpointing: one micro-batch of
    4,096 tokens (each rank's budget is 2,048) shared by both ranks; the step's report and the
    updated weights are one rank's step on the whole micro-batch."""
    mine = two_ranks["actor"]
    assert mine["micro_batches"] == 1
    runs = {}
    for dtype in (torch.float32, torch.float64):
        config = ActorConfig(lr=1e-3, logprob_chunk_tokens=CHUNK)
        actor = Actor(random_llama(4, 2).to(dtype), config)
        micro_batches = actor.micro_batches(long_sequences(ACTOR_LENGTHS), sum(ACTOR_LENGTHS))
        report = actor.train_step(micro_batches, lambda m, b: nll_loss(m, b, chunk_tokens=CHUNK))
        params = {n: p.full_tensor() for n, p in actor.model.named_parameters()}
        runs[dtype] = {"report": report, "params": params}
    one, exact = runs[torch.float32], runs[torch.float64]
    for key in ("loss", "grad_norm", "token_accuracy", "denominator"):
        value = exact["report"][key]
        atol = tolerance(abs(one["report"][key] - value), value)
        assert mine["report"][key] == pytest.approx(value, abs=atol), key
    for param, value in exact["params"].items():
        atol = float32_tolerance(one["params"][param], value)
        assert_within(mine["params"][param], value, atol, param)
