"""GRPO on Math-v0 with SmolLM2-135M: the whole RL loop in one file, from agentrl's public pieces.

    python examples/minimal_grpo.py --steps 4 --groups 2 --group-size 4

Each step does what ``agentrl train`` (:class:`agentrl.rl.loop.Trainer`) does with its default
embedded engine, synchronous rollouts (``stream.max_staleness=0``) and one update per step:

1. roll out ``--groups`` GRPO groups of ``--group-size`` Math-v0 episodes (one prompt per group)
   against the embedded engine (:class:`~agentrl.rollout.runner.EpisodeRunner`);
2. build the batch: rewards to group-normalised advantages, one token sequence per episode
   (:func:`~agentrl.rl.batch.build_batch`);
3. pack the sequences into micro-batches (:func:`~agentrl.training.packing.pack_for_rank`) and
   take one optimizer step of the FSDP2 actor on the PPO-clip objective with importance
   correction (:class:`~agentrl.rl.objective.Objective`);
4. load the new weights into the engine as weight version ``step``
   (:func:`~agentrl.rl.weight_sync.sync_weights`).

The settings are the Trainer's own (:class:`~agentrl.rl.config.TrainConfig`, its defaults plus
the knobs below), so both read the same keys. Each step prints one JSON line: the mean reward, the
loss, the gradient norm, the engine's weight version and ``sync_gap``, the largest difference
between any weight of the engine and the actor's (cast to the engine's dtype): 0 after a sync.

Left out (the Trainer has them): checkpoints and resuming, rollouts that run while the actor
trains (staleness bounds, partial rollouts), engine servers and pools, several ranks, a critic, a
KL reference, PPO mini-batches and epochs (:func:`~agentrl.rl.loop.train_on_batch`), dynamic
sampling, metrics files and the progress display. It runs in one process: a one-process group,
gloo on the CPU or NCCL on a GPU, which the actor's FSDP2 sharding needs.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import json
from collections.abc import Sequence

import gymnasium
import torch
from torch.distributed.tensor import DTensor

import agentrl  # noqa: F401  (registers agentrl/Math-v0 with gymnasium)
from agentrl.engine_pool import LocalEngine, SamplingParams
from agentrl.models import engine_dtype, load_model, load_tokenizer
from agentrl.rl.batch import build_batch
from agentrl.rl.config import TrainConfig
from agentrl.rl.objective import Objective
from agentrl.rl.weight_sync import sync_weights
from agentrl.rollout.runner import EpisodeRunner, group_tasks
from agentrl.training.actor import Actor
from agentrl.training.distributed import DistInfo, distributed
from agentrl.training.packing import pack_for_rank


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """The Trainer's own configuration, its defaults plus these knobs (so both read the same
    keys); a bad value ends the program with a message naming its key."""
    parser = argparse.ArgumentParser(description="GRPO on Math-v0 with SmolLM2, in one file.")
    parser.add_argument("--steps", type=int, default=4, help="trainer steps (one batch each)")
    parser.add_argument("--groups", type=int, default=2, help="GRPO groups (prompts) per step")
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="tokens per answer")
    parser.add_argument("--lr", type=float, default=2e-6, help="AdamW's peak learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seeds prompts, sampling and torch")
    args = parser.parse_args(argv)
    overrides = [
        f"trainer.steps={args.steps}",
        f"trainer.seed={args.seed}",
        f"rollout.groups_per_step={args.groups}",
        f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"actor.lr={args.lr}",
        "env.id=agentrl/Math-v0",
        "env.kwargs={answer_format: flexible}",  # the last number counts: SmolLM2 rarely boxes it
    ]
    try:
        return TrainConfig.load(None, overrides)
    except ValueError as exc:  # agentrl.config.ConfigError
        parser.error(str(exc))


async def train(config: TrainConfig, dist_info: DistInfo) -> None:
    """Load the policy twice (the actor's and the engine's copy), then run the steps."""
    rollout = config.rollout
    torch.manual_seed(config.trainer.seed)
    tokenizer = load_tokenizer(config.model.path)
    model = load_model(config.model.path, dtype="float32")  # float32: the optimizer's master copy
    # The engine samples from its own copy, in its own dtype (bfloat16 on GPUs and CPUs with
    # native bfloat16); weight sync casts on load. Copied before the actor shards `model`.
    dtype = engine_dtype(config.engines.dtype, dist_info.device.type)
    engine_model = copy.deepcopy(model).to(getattr(torch, dtype))
    actor = Actor(model, config.actor, dist_info=dist_info)  # FSDP2: shards `model` in place
    objective = Objective(
        config.algorithm, temperature=rollout.temperature, norm_length=rollout.max_new_tokens
    )
    async with LocalEngine(
        engine_model,
        tokenizer=tokenizer,
        max_batch_size=config.engines.batch_size,
        prefix_cache_tokens=config.engines.prefix_cache_tokens,
        device=dist_info.device,
    ) as engine:
        runner = EpisodeRunner(
            functools.partial(gymnasium.make, config.env.id, **config.env.kwargs),
            engine,
            tokenizer,
            SamplingParams(
                temperature=rollout.temperature,  # the objective scores at the same temperature
                top_p=rollout.top_p,
                max_new_tokens=rollout.max_new_tokens,
                seed=config.trainer.seed,  # each (group, sample, turn) derives its own seed
            ),
            env_id=config.env.id,
            max_total_tokens=rollout.max_total_tokens,
            template_policy=rollout.template_policy,
            seams=rollout.token_seams,
        )
        for _ in range(config.trainer.steps):
            record = await grpo_step(config, runner, actor, objective, engine)
            print(json.dumps(record), flush=True)


async def grpo_step(
    config: TrainConfig,
    runner: EpisodeRunner,
    actor: Actor,
    objective: Objective,
    engine: LocalEngine,
) -> dict[str, float]:
    """Rollouts, batch, one update, weight sync; returns the step's metrics."""
    rollout = config.rollout
    # 1. Rollouts. The samples of a group share its reset seed, hence its prompt; seeds go on
    # from step to step, so each step sees the prompts the Trainer's RolloutStream would give it.
    first_group = actor.step * rollout.groups_per_step
    tasks = group_tasks(
        rollout.groups_per_step, rollout.group_size, seed=config.trainer.seed + first_group
    )
    trajectories = await runner.collect(tasks, concurrency=rollout.concurrency)  # task order
    size = rollout.group_size
    groups = [trajectories[i : i + size] for i in range(0, len(trajectories), size)]

    # 2. The batch: `input_ids`, `loss_mask` (the engine's tokens), the engine's `logprobs` and
    # weight `versions` per token, and one advantage per sequence (GRPO: group-normalised reward).
    batch = build_batch(
        groups,
        config.algorithm,
        config.stream,
        actor.step,
        max_response_tokens=rollout.max_new_tokens,
    )
    if not batch.sequences:  # the Trainer skips such a step; an example had better say why
        errors = sorted({t.error for t in trajectories if t.error})
        raise RuntimeError(f"no episode left anything to train on: {errors}")

    # 3. One update: this rank's packed micro-batches (one rank: all of them, at most
    # `micro_batch_tokens` tokens each), gradients accumulated over them, one AdamW step.
    # `train_on_batch` does the same, and PPO mini-batches and epochs besides.
    objective.policy_version = actor.step  # the weights that sampled the on-policy tokens
    micro_batches = [
        mb.to(actor.device)
        for mb in pack_for_rank(
            batch.sequences,
            actor.dist.rank,
            actor.dist.world_size,
            config.trainer.micro_batch_tokens,
        )
    ]
    reported = actor.train_step(micro_batches, objective)  # actor.step advances: the new version
    report = objective.finish(reported, actor.device)

    # 4. Weight sync: gather the full weights bucket by bucket, load them into the paused engine
    # as version `actor.step`; it raises unless the engine then reports that version.
    await sync_weights(
        actor.model,
        [engine],
        actor.step,
        bucket_bytes=config.trainer.weight_sync_bucket_mb * 2**20,
    )
    return {
        "step": actor.step,
        "reward": batch.metrics["reward/mean"],
        "loss": report["train/loss"],
        "grad_norm": report["train/grad_norm"],
        "episodes": batch.metrics["episodes/count"],
        "errors": batch.metrics["episodes/errors"],
        "response_tokens": batch.metrics["response_length/mean"],
        "weight_version": engine.weight_version,
        "sync_gap": await sync_gap(actor, engine),
    }


async def sync_gap(actor: Actor, engine: LocalEngine) -> float:
    """A check, not part of the loop: the largest |engine - actor| over every weight, the
    actor's cast to the engine's dtype as the sync does (0.0: the engine has the new weights)."""
    gap = 0.0
    for name, param in actor.model.named_parameters():
        # the whole tensor from FSDP2's shards (a collective)
        full = (param.full_tensor() if isinstance(param, DTensor) else param).detach()
        held = await engine.get_weights_by_name(name, truncate_size=full.shape[0])
        sent = full.to(engine.model.dtype).float().cpu()
        gap = max(gap, float((held - sent).abs().max()))
    return gap


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_config(argv)
    with distributed() as dist_info:  # destroyed on every exit path
        if dist_info.world_size != 1:
            raise SystemExit("one process only; `agentrl train` runs under torchrun")
        asyncio.run(train(config, dist_info))


if __name__ == "__main__":
    main()
