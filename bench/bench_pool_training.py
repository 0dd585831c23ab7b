"""One GRPO training step with the embedded engine vs over a pool of two `agentrl serve` processes.

Same model (SmolLM2-135M-Instruct, float32 engine weights), Math-v0 prompts, batch and sampling on
both sides; each side is a fresh :class:`~agentrl.rl.loop.Trainer` in this process, synchronous
(``stream.max_staleness=0``), and a step is timed end to end (waiting for its rollouts, training,
weight sync). The first step of each side is a warm-up and not counted. Printed: each side's median
step, its rollout wait and weight-sync time, and the ratio embedded / pool (above 1: the pool is
faster).

What two CPU cores can show: the pool's servers are separate processes on the same two cores as
the trainer, so the comparison measures the pool's overheads (HTTP, routing, weight sync by
broadcast or HTTP instead of an in-process copy) more than its point, which is generation on
other machines or GPUs than training.

    python -m bench.bench_pool_training [--steps 3] [--weight-sync broadcast|tensor|disk]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from agentrl.models import cpu_name
from agentrl.rl.config import TrainConfig
from agentrl.rl.loop import Trainer


def config(out: Path, args: argparse.Namespace, *engines: str) -> TrainConfig:
    return TrainConfig.load(
        None,
        [
            "model.path=smollm2",
            "env.id=agentrl/Math-v0",
            "env.kwargs={answer_format: flexible, generated_difficulty: 1}",
            f"rollout.groups_per_step={args.groups}",
            f"rollout.group_size={args.group_size}",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            "rollout.max_total_tokens=512",
            "engines.dtype=float32",
            "stream.max_staleness=0",
            f"trainer.steps={args.steps}",
            "trainer.micro_batch_tokens=2048",
            "trainer.export_hf=false",
            "trainer.tensorboard=false",
            f"trainer.output_dir={out}",
            *engines,
        ],
    )


async def time_steps(cfg: TrainConfig) -> list[dict[str, float]]:
    records = []
    async with Trainer(cfg, show_progress=False) as trainer:
        for _ in range(cfg.trainer.steps):
            record = await trainer.step()
            assert record is not None
            records.append(record)
    return records


def summary(name: str, records: list[dict[str, float]]) -> float:
    counted = records[1:] or records
    step = statistics.median(r["time/step_s"] for r in counted)
    wait = statistics.median(r["time/wait_rollouts_s"] for r in counted)
    sync = statistics.median(r["time/sync_s"] for r in counted)
    print(
        f"{name:<28} median step {step:6.2f} s   rollouts waited {wait:6.2f} s   "
        f"weight sync {sync:5.2f} s   ({len(counted)} counted steps)"
    )
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--weight-sync", default="broadcast", choices=["broadcast", "tensor", "disk"]
    )
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}")
    with tempfile.TemporaryDirectory() as tmp:
        embedded = asyncio.run(time_steps(config(Path(tmp) / "embedded", args)))
        pool = asyncio.run(
            time_steps(
                config(
                    Path(tmp) / "pool",
                    args,
                    "engines.kind=serve",
                    "engines.count=2",
                    f"engines.weight_sync={args.weight_sync}",
                    f"engines.batch_size={args.groups * args.group_size // 2}",
                )
            )
        )
    ours = summary("embedded LocalEngine", embedded)
    theirs = summary(f"pool of 2 servers ({args.weight_sync})", pool)
    print(f"ratio embedded / pool: {ours / theirs:.2f}x (above 1: the pool is faster)")


if __name__ == "__main__":
    main()
