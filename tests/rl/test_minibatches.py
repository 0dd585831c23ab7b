"""PPO mini-batches and epochs (`train_on_batch`): several optimizer steps per trainer step.

Every value comes from real training of the fixed tiny Llama in a one-process gloo group: the
trainer step and the LR schedule advance once per trainer step, the ratio to the stored old
log-probs moves after the first update so clipping changes the update, and one mini-batch and
one epoch is exactly the single ``train_step`` of before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fsdp_worker import one_process_group, tiny_llama

from agentrl.rl.config import AlgorithmConfig
from agentrl.rl.loop import train_on_batch
from agentrl.rl.objective import Objective
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.distributed import DistInfo
from agentrl.training.logprobs import token_logprobs
from agentrl.training.packing import pack_for_rank

LENGTHS = [7, 5, 9, 4, 8, 6]
ADVANTAGES = [1.0, -1.0, 0.5, 2.0, -1.5, 0.7]
MICRO_BATCH_TOKENS = 16


@pytest.fixture(scope="module")
def dist_info() -> Iterator[DistInfo]:
    with one_process_group() as info:
        yield info


def sequences() -> list[dict[str, Any]]:
    """Sequences whose engine log-probs are the initial model's own plus known noise."""
    model = tiny_llama()
    generator = torch.Generator().manual_seed(1)
    out = []
    for i, n in enumerate(LENGTHS):
        ids = torch.randint(0, model.config.vocab_size, (n,), generator=generator)
        with torch.no_grad():
            own = token_logprobs(model, ids[None], temperature=1.0)[0]  # (n - 1,) scores ids[1:]
        mask = [0, 0, *[1] * (n - 2)]
        engine = [0.0, *(own + 0.01 * (i + 1)).tolist()]
        out.append(
            {
                "input_ids": ids.tolist(),
                "loss_mask": mask,
                "logprobs": [e if m else 0.0 for e, m in zip(engine, mask, strict=True)],
                "versions": [0 if m else -1 for m in mask],
                "advantages": ADVANTAGES[i],
            }
        )
    return out


def train(
    dist_info: DistInfo, algorithm: AlgorithmConfig, lr: float = 1e-2
) -> tuple[Actor, dict[str, float]]:
    """A fresh actor after one trainer step of ``train_on_batch`` on :func:`sequences`."""
    actor = Actor(tiny_llama(), ActorConfig(lr=lr, warmup_steps=2), dist_info=dist_info)
    objective = Objective(algorithm, temperature=1.0)
    report = train_on_batch(
        actor,
        objective,
        sequences(),
        micro_batch_tokens=MICRO_BATCH_TOKENS,
        mini_batches=algorithm.mini_batches,
        epochs=algorithm.epochs,
    )
    return actor, report


def parameters(actor: Actor) -> dict[str, torch.Tensor]:
    return {name: p.full_tensor().detach().clone() for name, p in actor.model.named_parameters()}


def adam_steps(actor: Actor) -> set[int]:
    return {int(state["step"]) for state in actor.optimizer.state.values()}


def test_two_mini_batches_take_two_optimizer_steps_in_one_trainer_step(dist_info):
    actor, report = train(dist_info, AlgorithmConfig(mini_batches=2))
    assert adam_steps(actor) == {2}  # AdamW stepped twice
    assert actor.step == 1  # the trainer step (weight version) advanced once
    assert actor.scheduler.last_epoch == 1  # so did the LR schedule
    assert report["train/optimizer_steps"] == 2.0
    assert report["train/lr"] == pytest.approx(1e-2 / 2)  # both at warmup step 0's LR
    assert actor.lr == pytest.approx(1e-2)  # warmup step 1's


@pytest.mark.parametrize("loss", ["ppo", "gspo"])
@pytest.mark.parametrize(("mini_batches", "epochs"), [(2, 1), (1, 2)])
def test_later_updates_see_a_moved_ratio_and_clip(dist_info, loss, mini_batches, epochs):
    kwargs = {"loss": loss, "mini_batches": mini_batches, "epochs": epochs}
    wide = {"clip_low": 0.99, "clip_high": 100.0, "clip_ratio_c": None}
    clipped_actor, clipped = train(dist_info, AlgorithmConfig(**kwargs), lr=5e-2)
    free_actor, free = train(dist_info, AlgorithmConfig(**kwargs, **wide), lr=5e-2)
    assert clipped["policy/clip_fraction"] > 0
    assert free["policy/clip_fraction"] == 0
    assert clipped["policy/ratio_max"] > 1.01 or clipped["policy/ratio_min"] < 0.99
    after_clip, after_free = parameters(clipped_actor), parameters(free_actor)
    assert any(not torch.equal(after_clip[n], after_free[n]) for n in after_clip)


def test_one_update_never_clips(dist_info):
    """The control of the test above: with one update the ratio is 1, the clip range is moot."""
    wide = {"clip_low": 0.99, "clip_high": 100.0, "clip_ratio_c": None}
    clipped_actor, clipped = train(dist_info, AlgorithmConfig(), lr=5e-2)
    free_actor, free = train(dist_info, AlgorithmConfig(**wide), lr=5e-2)
    assert clipped["policy/clip_fraction"] == free["policy/clip_fraction"] == 0
    after_clip, after_free = parameters(clipped_actor), parameters(free_actor)
    assert all(torch.equal(after_clip[n], after_free[n]) for n in after_clip)


def test_one_mini_batch_one_epoch_is_the_single_step_of_before(dist_info):
    algorithm = AlgorithmConfig()
    actor, report = train(dist_info, algorithm)
    before = Actor(tiny_llama(), ActorConfig(lr=1e-2, warmup_steps=2), dist_info=dist_info)
    objective = Objective(algorithm, temperature=1.0)
    objective.policy_version = before.step  # as train_on_batch sets it
    micro_batches = pack_for_rank(sequences(), 0, 1, MICRO_BATCH_TOKENS)
    expected = objective.finish(before.train_step(micro_batches, objective), before.device)
    assert report == {**expected, "train/optimizer_steps": 1.0}
    assert (actor.step, adam_steps(actor)) == (before.step, adam_steps(before)) == (1, {1})
    after, reference = parameters(actor), parameters(before)
    assert all(torch.equal(after[n], reference[n]) for n in after)
