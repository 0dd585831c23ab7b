"""Rollout throughput: async episodes vs a turn-synchronous baseline, with simulated tool latency.

Three runs over the same episodes (same prompts, seeds and engine: SmolLM2 on the CPU, or on a GPU
with ``--device cuda``, where the engine is fast enough for the tool latency to dominate):

1. **turn-synchronous** (as older frameworks do): every active environment generates, all wait for the
   whole batch, then every environment steps, all wait for the slowest tool, and so on.
2. **async** (agentrl's ``EpisodeRunner``): each episode proceeds on its own; the engine batches
   whatever requests are waiting while other episodes wait on their tools.
3. **engine alone**: the async run with no tool latency, the upper bound on throughput.

The engine's prefix cache (on by default) is flushed before each run, so every run reuses only the KV of
its own earlier turns.

Tool latency is 0.5 s per step on average, drawn per step from an exponential distribution (the
heavy tail of real tools: searches, sandboxes) or fixed at 0.5 s (``--latency fixed``). Prints
generated tokens/s of each run, what the engine did in it (scheduler steps, rows and wall time per
step, prefill forwards), the ratios async/sync (target >= 3x) and async/engine-alone (target >= 0.8),
and the best async/sync any scheduler could reach with the tool latencies the episodes drew, were
generation free: the synchronous run waits for the slowest tool of each turn, and no run ends before
its slowest episode's tools. With 128 episodes of 3 turns at 0.5 s mean exponential latency that
bound is about 1.7x, so the 3x target needs many more turns (about 16) as well as a fast engine.
On a GPU (``--device cuda``) an unmeasured engine-alone run comes first (``--warmup-run``).

    python -m bench.bench_rollout [--episodes 48] [--turns 3] [--max-new-tokens 32]
    python -m bench.bench_rollout --device cuda --dtype bfloat16 --episodes 256
    python -m bench.bench_rollout --model .whl/smollm2-config --random-weights --device cuda ...

``--random-weights`` builds the model from the config in ``--model`` with random weights (the same
compute; for machines SmolLM2's weights cannot reach, such as a lent GPU: ``scripts/gpu-wheels``
writes SmolLM2's config and tokenizer to ``.whl/smollm2-config``). Generation then rarely stops at an
end-of-sequence token, so episodes run to ``--max-new-tokens``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from agentrl.engine_pool import LocalEngine, SamplingParams
from agentrl.engine_pool.request_state import EngineStats
from agentrl.envs import AgentEnv
from agentrl.models import load_tokenizer
from agentrl.rollout import EpisodeRunner, RolloutTask, group_tasks
from agentrl.tokenization import TrajectoryBuilder


class ToolLatencyEnv(AgentEnv):
    """A fixed number of turns; each step 'runs a tool' that takes ``latency()`` seconds."""

    def __init__(self, turns: int, mean_latency: float, distribution: str):
        self.turns, self.mean_latency, self.distribution = turns, mean_latency, distribution
        self.drawn: list[float] = []  # each step's latency, in order

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed, options=options)
        self.left = self.turns
        question = f"Count from {int(self.np_random.integers(1, 50))} upwards, one number per line."
        return [{"role": "user", "content": question}], {"tools": []}

    async def astep(self, action):
        if self.mean_latency > 0:
            fixed = self.distribution == "fixed"
            latency = self.mean_latency if fixed else self.np_random.exponential(self.mean_latency)
            self.drawn.append(latency)
            await asyncio.sleep(latency)
        self.left -= 1
        if self.left == 0:
            return [], 1.0, True, False, {}
        return [{"role": "tool", "name": "tool", "content": "ok, continue"}], 0.0, False, False, {}


async def turn_synchronous(engine, tokenizer, tasks, sampling, make_env) -> int:
    """All environments advance one turn at a time together; returns generated tokens."""
    envs = [make_env() for _ in tasks]
    builders = []
    for env, task in zip(envs, tasks, strict=True):
        obs, _ = await env.areset(seed=task.seed)
        builders.append(TrajectoryBuilder(tokenizer, obs, tools=None))
    active, tokens = list(range(len(envs))), 0
    while active:
        results = await asyncio.gather(
            *(engine.generate(builders[i].prompt_ids(), sampling, str(i)) for i in active)
        )
        steps = []
        for i, result in zip(active, results, strict=True):
            tokens += len(result.token_ids)
            builders[i].add_completion(result.token_ids, result.logprobs, result.weight_version)
            steps.append(
                envs[i].astep(tokenizer.decode(result.token_ids, skip_special_tokens=True))
            )
        outcomes = await asyncio.gather(*steps)
        still = []
        for i, (obs, _, terminated, truncated, _) in zip(active, outcomes, strict=True):
            if not (terminated or truncated):
                builders[i].add_messages(obs)
                still.append(i)
        active = still
    return tokens


async def asynchronous(engine, tokenizer, tasks, sampling, make_env) -> int:
    runner = EpisodeRunner(make_env, engine, tokenizer, sampling)
    trajectories = await runner.collect(tasks, concurrency=len(tasks))
    errors = [t.error for t in trajectories if t.error]
    assert not errors, errors[0]
    return sum(t.completion_tokens for t in trajectories)


def engine_counts(before: EngineStats, after: EngineStats, seconds: float) -> dict[str, float]:
    """What the engine did in one run: its scheduler iterations (each a decode step, with any
    admissions' prefills), rows per iteration, wall time per iteration and prefill forwards. A GPU
    engine bound by the host shows as a time per step that does not fall with fewer rows."""
    steps = after.steps - before.steps
    tokens = after.tokens_generated - before.tokens_generated
    return {
        "steps": steps,
        "rows_per_step": tokens / max(steps, 1),
        "wall_ms_per_step": 1000 * seconds / max(steps, 1),
        "prefills": after.prefills - before.prefills,
    }


def latency_bound(drawn: Sequence[Sequence[float]]) -> float:
    """The most any scheduler could gain over the turn-synchronous one, given the tool latencies
    the episodes drew (``drawn[i][t]``: episode i's turn t), if generation took no time: the
    synchronous run waits for the slowest tool of every turn, sum over t of max over i, and no run
    ends before its slowest episode's tools, max over i of sum over t. Generation time adds to
    both, so the measured ratio is lower; ``nan`` without latency."""
    if not drawn or not any(drawn):
        return float("nan")
    turns = max(len(d) for d in drawn)
    synchronous = sum(max((d[t] for d in drawn if t < len(d)), default=0.0) for t in range(turns))
    return synchronous / max(sum(d) for d in drawn)


async def main(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer(args.model)
    model = args.model
    if args.random_weights:
        torch.manual_seed(0)
        config = AutoConfig.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    tasks: list[RolloutTask] = group_tasks(args.episodes)

    drawn: list[list[float]] = []  # the latencies each environment of the last run drew

    def env_maker(latency: float):
        drawn.clear()

        def make() -> ToolLatencyEnv:
            env = ToolLatencyEnv(args.turns, latency, args.latency)
            drawn.append(env.drawn)
            return env

        return make

    engine = LocalEngine(
        model,
        tokenizer=tokenizer,
        max_batch_size=args.episodes,
        dtype=args.dtype,
        device=args.device,
    )
    weights = "random weights" if args.random_weights else "its weights"
    print(f"engine: {args.model} ({weights}) in {args.dtype} on {args.device}")
    async with engine:
        await engine.generate(tokenizer.encode("warm up"), SamplingParams(max_new_tokens=4))
        if args.warmup_run if args.warmup_run is not None else args.device != "cpu":
            # one unmeasured run at full size first: on a GPU the first run pays for the
            # allocator's growth to the KV cache's sizes, which would count against the first mode
            await asynchronous(engine, tokenizer, tasks, sampling, env_maker(0.0))
        runs = [
            ("turn-synchronous", turn_synchronous, args.mean_latency),
            ("async", asynchronous, args.mean_latency),
            ("engine alone (no latency)", asynchronous, 0.0),
        ]
        rates, engine_work = {}, {}
        for name, fn, latency in runs:
            await engine.flush_cache()  # no run may reuse another run's prefix KV
            before = dataclasses.replace(engine.stats)
            start = time.perf_counter()
            tokens = await fn(engine, tokenizer, tasks, sampling, env_maker(latency))
            seconds = time.perf_counter() - start
            rates[name] = tokens / seconds
            engine_work[name] = work = engine_counts(before, engine.stats, seconds)
            if fn is turn_synchronous:
                bound = latency_bound(drawn)
            print(
                f"{name:28s} {tokens:6d} tokens in {seconds:7.1f} s = {rates[name]:7.1f} tokens/s"
                f"  ({work['steps']} engine steps, {work['rows_per_step']:.1f} rows and "
                f"{work['wall_ms_per_step']:.1f} ms of wall time a step, "
                f"{work['prefills']} prefill forwards)"
            )
    sync, asyn, alone = (
        rates["turn-synchronous"],
        rates["async"],
        rates["engine alone (no latency)"],
    )
    print(f"async / turn-synchronous      = {asyn / sync:.2f}x  (target >= 3x)")
    print(f"async / engine alone          = {asyn / alone:.2f}   (target >= 0.8)")
    print(
        f"best async / turn-synchronous = {bound:.2f}x  with these tool latencies, at zero "
        "generation time (any scheduler)"
    )
    if args.json:
        device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
        record = {
            "device": device,
            "model": str(args.model),
            "dtype": args.dtype,
            "episodes": args.episodes,
            "tokens_per_s": rates,
            "async_over_sync": asyn / sync,
            "async_over_engine_alone": asyn / alone,
            "engine": engine_work,
            "latency_bound_async_over_sync": bound,
        }
        Path(args.json).write_text(json.dumps(record, indent=1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--mean-latency", type=float, default=0.5)
    parser.add_argument("--latency", choices=["exponential", "fixed"], default="exponential")
    parser.add_argument("--device", default="cpu", help='"cpu" (default) or "cuda"')
    parser.add_argument("--model", default="smollm2", help="smollm2 or a model directory")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--json", type=Path, help="write the numbers to this file")
    parser.add_argument(
        "--warmup-run",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="an unmeasured engine-alone run first (default: on a GPU only)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
