"""One GRPO step of agentrl's trainer vs TRL's ``GRPOTrainer``: same model, prompts, batch and CPU.

Runs in the TRL env only (TRL is never a dependency of the project)::

    bash bench/setup_trl_env.sh
    .venv-trl/bin/python -m bench.compare_trl [--blocks 3] [--steps-per-block 3] \
        [--groups 4] [--group-size 2] [--max-new-tokens 64]

Both sides start from SmolLM2-135M-Instruct in float32 (each its own copy), answer Math-v0
problems (generated, difficulty 1, ``answer_format=flexible``) with ``groups x group_size``
completions of at most ``max_new_tokens`` tokens at temperature 1, grade them with Math-v0's
verifier, take group-normalised advantages, and take one token-mean PPO-clip step (no KL, no
reference model, lr 1e-6, clip to norm 1.0, AdamW). A step is timed end to end on both sides:

* **agentrl**: :meth:`agentrl.rl.loop.Trainer.step` in synchronous mode, its engine in
  ``--engine-dtype`` (``float32`` by default, as TRL generates with the trained model itself;
  ``bfloat16`` is agentrl's separate-engine option, with the mismatch printed)
  (``stream.max_staleness=0``): waiting for the step's rollouts (which start when the previous
  step's weights reach the engine), building the batch, the packed FSDP2 forward + backward and
  optimizer step, and pushing the new weights into the embedded engine. Each group ``g`` is the
  prompt of ``env.reset(seed=g)``; step ``s`` uses groups ``s*groups .. s*groups+groups-1``.
* **TRL** (see :mod:`bench.trl_baseline` for what its step contains and how it is configured):
  its whole ``GRPOTrainer`` step: ``model.generate`` over the batch, reward, padded forward +
  backward, optimizer step. Its prompts are the first step's prompts (``env.reset(seed=g)`` for
  ``g < groups``), reused every step: TRL's dataset is one step long.

The sides alternate in blocks of ``--steps-per-block`` steps in this one process (agentrl, TRL,
agentrl, TRL, ...), so slow phases of a shared machine hit both. The first step of every block is
a warm-up on both sides and not counted (TRL's first step starts the verifier pool and allocates;
agentrl's first step in a block found its rollouts started before the block, while the other side
ran). Printed: every step's time, each side's median over counted steps, and the ratio
TRL / agentrl (above 1: agentrl is faster).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

import gymnasium
import torch

import agentrl  # noqa: F401  (registers agentrl/Math-v0)
from agentrl.models import cpu_has_native_bfloat16, cpu_name, load_model, load_tokenizer
from agentrl.rl.config import TrainConfig
from agentrl.rl.loop import Trainer
from bench.trl_baseline import make_trl_reward, math_v0_grade, trl_grpo_step_times

ENV_KWARGS = {"answer_format": "flexible", "generated_difficulty": 1}


def agentrl_config(args: argparse.Namespace, output_dir: Path) -> TrainConfig:
    overrides = {
        "model.path": args.model,
        "env.id": "agentrl/Math-v0",
        "env.kwargs": ENV_KWARGS,
        "rollout.groups_per_step": args.groups,
        "rollout.group_size": args.group_size,
        "rollout.temperature": 1.0,
        "rollout.max_new_tokens": args.max_new_tokens,
        "rollout.max_total_tokens": 512,
        "engines.batch_size": args.groups * args.group_size,
        "engines.dtype": args.engine_dtype,
        "algorithm.advantage": "grpo",
        "algorithm.loss": "ppo",
        "algorithm.clip_low": 0.2,
        "algorithm.clip_high": 0.2,
        "algorithm.aggregation": "token-mean",
        "stream.max_staleness": args.max_staleness,
        "actor.lr": args.learning_rate,
        "actor.warmup_steps": 0,
        "actor.max_grad_norm": 1.0,
        "trainer.steps": 10**6,
        "trainer.micro_batch_tokens": args.micro_batch_tokens,
        "trainer.seed": 0,
        "trainer.output_dir": str(output_dir),
        "trainer.export_hf": False,
        "trainer.tensorboard": False,
    }
    return TrainConfig.load(None, [f"{key}={value}" for key, value in overrides.items()])


async def first_step_prompts(groups: int) -> tuple[list[list[dict]], list[str]]:
    """The observation and gold answer of ``env.reset(seed=g)``: agentrl's first-step groups."""
    env = gymnasium.make("agentrl/Math-v0", **ENV_KWARGS)
    prompts, answers = [], []
    for group in range(groups):
        messages, info = await env.areset(seed=group)
        prompts.append(messages)
        answers.append(info["gold_answer"])
    await env.aclose()
    return prompts, answers


def trl_block(args: argparse.Namespace, prompts, answers) -> list[float]:
    """A fresh TRL trainer on a fresh model copy (TRL patches the model's forward), ``steps``."""
    model = load_model(args.model, dtype="float32")
    with tempfile.TemporaryDirectory() as output_dir:
        return trl_grpo_step_times(
            model,
            load_tokenizer(args.model),
            prompts,
            make_trl_reward(math_v0_grade("flexible")),
            answers=answers,
            num_generations=args.group_size,
            max_completion_length=args.max_new_tokens,
            temperature=1.0,
            learning_rate=args.learning_rate,
            steps=args.steps_per_block,
            seed=0,
            output_dir=output_dir,
        )


async def compare(args: argparse.Namespace) -> None:
    prompts, answers = await first_step_prompts(args.groups)
    ours: list[float] = []
    theirs: list[float] = []
    mismatch: list[float] = []
    with tempfile.TemporaryDirectory() as output_dir:
        config = agentrl_config(args, Path(output_dir))
        async with Trainer(config, show_progress=False) as trainer:
            engine_dtype = trainer.engine_dtype
            for block in range(args.blocks):
                times = []
                for _ in range(args.steps_per_block):
                    record = await trainer.step()
                    assert record is not None
                    times.append(record["time/step_s"])
                    mismatch.append(record["mismatch/mean_abs"])
                    print(
                        f"block {block} agentrl step {trainer.actor.step}: "
                        f"{record['time/step_s']:.2f} s (rollouts {record['time/wait_rollouts_s']:.2f}"
                        f", train {record['time/train_s']:.2f}, sync {record['time/sync_s']:.2f}), "
                        f"reward {record['reward/mean']:.3f}, "
                        f"mismatch {record['mismatch/mean_abs']:.2e}",
                        flush=True,
                    )
                ours.extend(times[1:])
                # The event loop is blocked while TRL runs: agentrl's next rollouts wait.
                times = trl_block(args, prompts, answers)
                for step, seconds in enumerate(times):
                    print(f"block {block} TRL step {step + 1}: {seconds:.2f} s", flush=True)
                theirs.extend(times[1:])
    batch = args.groups * args.group_size
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    print(
        f"\nGRPO step, SmolLM2-135M float32, {args.groups} prompts x {args.group_size} samples "
        f"= {batch} completions of <= {args.max_new_tokens} tokens, "
        f"{torch.get_num_threads()} torch threads, {len(ours)} counted steps a side"
    )
    print(f"CPU: {cpu_name()}; native bfloat16: {'yes' if cpu_has_native_bfloat16() else 'no'}")
    print(f"TRL GRPOTrainer: median {theirs_s:.2f} s/step (min {min(theirs):.2f})")
    print(
        f"agentrl Trainer (engine {engine_dtype} from {args.engine_dtype}, trainer float32, "
        f"stream.max_staleness={args.max_staleness}): median {ours_s:.2f} s/step "
        f"(min {min(ours):.2f}); train/inference mismatch, mean |Δ log p|: "
        f"median {statistics.median(mismatch):.2e}"
    )
    print(f"ratio TRL / agentrl: {theirs_s / ours_s:.2f}x (>1: agentrl faster)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--steps-per-block", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=512,
        help="agentrl's packing budget (on the CPU, sdpa's packed attention costs T^2: keep it small)",
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument(
        "--engine-dtype",
        choices=["auto", "float32", "bfloat16"],
        default="float32",
        help="agentrl's rollout engine weights (engines.dtype; auto: bfloat16 only on CPUs "
        "with native bfloat16); the trainer stays float32",
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=0,
        help="agentrl's stream.max_staleness: 1 overlaps the next step's rollouts with this "
        "step's training (TIS-corrected); TRL's step is synchronous",
    )
    args = parser.parse_args()
    if args.steps_per_block < 2:
        parser.error("--steps-per-block must be at least 2 (the first of each block is a warm-up)")
    asyncio.run(compare(args))


if __name__ == "__main__":  # the math verifier's worker processes use the spawn start method
    main()
