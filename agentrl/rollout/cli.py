"""``agentrl rollout``: run an environment against the embedded engine and save the trajectories."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentrl.rollout.trajectory import Trajectory


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    """``--env ID`` and ``--env-kwargs KEY=VALUE ...`` (read with :func:`parse_kwargs`)."""
    parser.add_argument("--env", required=True, help="environment id, e.g. agentrl/Math-v0")
    parser.add_argument(
        "--env-kwargs",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="keyword arguments for gymnasium.make; values are parsed as JSON when they can be",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_env_arguments(parser)
    parser.add_argument("--n", type=int, default=16, help="number of prompts (groups)")
    parser.add_argument("--group-size", type=int, default=1, help="samples per prompt (GRPO's G)")
    parser.add_argument("--model", default="smollm2", help="'smollm2', a model directory or .gguf")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="per assistant turn")
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="a stop string for every turn (repeatable), besides the environment's own",
    )
    parser.add_argument("--max-total-tokens", type=int, default=2048, help="per trajectory")
    parser.add_argument("--seed", type=int, default=0, help="reset seeds and sampling seeds")
    parser.add_argument("--concurrency", type=int, default=64, help="episodes in flight")
    parser.add_argument("--max-batch-size", type=int, default=32, help="engine batch size")
    parser.add_argument(
        "--template-policy",
        choices=["keep", "strict"],
        default="keep",
        help="a chat template that is not append-only: keep the engine's tokens (with a warning) "
        "or refuse it (see agentrl check-template)",
    )
    parser.add_argument(
        "--seams",
        choices=["keep", "reencode"],
        default="keep",
        help="token seams: keep the engine's ids, or re-encode them as a full render would",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/rollout/trajectories.jsonl"),
        help="output file: .jsonl (written as trajectories complete) or .parquet",
    )


def parse_kwargs(items: list[str]) -> dict[str, Any]:
    """``["mode=multi", "max_turns=4"]`` -> ``{"mode": "multi", "max_turns": 4}``."""
    kwargs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env-kwargs: expected KEY=VALUE, got {item!r}")
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return kwargs


def run(args: argparse.Namespace) -> int:
    suffix = args.out.suffix.lower()
    if suffix not in (".jsonl", ".parquet"):
        raise SystemExit(f"--out must end in .jsonl or .parquet, got {args.out}")
    trajectories = asyncio.run(_rollout(args, parse_kwargs(args.env_kwargs)))
    if suffix == ".parquet":
        import datasets

        datasets.Dataset.from_list([t.to_record() for t in trajectories]).to_parquet(str(args.out))
    return 0


async def _rollout(args: argparse.Namespace, env_kwargs: dict[str, Any]) -> list[Trajectory]:
    import gymnasium

    import agentrl  # noqa: F401  (registers environments)
    from agentrl.engine_pool import LocalEngine, SamplingParams
    from agentrl.envs import AgentEnv, AgentWrapper, make_env
    from agentrl.models import load_tokenizer
    from agentrl.rollout.runner import EpisodeRunner, group_tasks

    console = Console()
    probe = gymnasium.make(args.env, **env_kwargs)  # fail fast on a bad id or keyword
    if not isinstance(probe, (AgentEnv, AgentWrapper)):
        raise SystemExit(f"{args.env} is not an agentrl environment (it has no async verbs)")
    await probe.aclose()
    sampling = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
        stop=tuple(args.stop),
        seed=args.seed,
    )
    tasks = group_tasks(args.n, args.group_size, seed=args.seed)
    with console.status(f"loading {args.model}"):
        tokenizer = load_tokenizer(args.model)
        engine = await LocalEngine(
            args.model, tokenizer=tokenizer, max_batch_size=args.max_batch_size
        ).start()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    trajectories: list[Trajectory] = []
    start = time.perf_counter()
    async with engine:
        runner = EpisodeRunner(
            lambda: make_env(args.env, **env_kwargs),
            engine,
            tokenizer,
            sampling,
            env_id=args.env,
            max_total_tokens=args.max_total_tokens,
            template_policy=args.template_policy,
            seams=args.seams,
        )
        progress = Progress(
            TextColumn("[bold]rollout"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("mean reward {task.fields[reward]:.3f}"),
            TimeElapsedColumn(),
            console=console,
        )
        jsonl = args.out.open("w") if args.out.suffix.lower() == ".jsonl" else None
        try:
            with progress:
                bar = progress.add_task("rollout", total=len(tasks), reward=0.0)
                async for trajectory in runner.stream(tasks, args.concurrency):
                    trajectories.append(trajectory)
                    if jsonl:
                        jsonl.write(json.dumps(trajectory.to_record(), ensure_ascii=False) + "\n")
                        jsonl.flush()
                    progress.update(bar, advance=1, reward=judged_mean(trajectories))
        finally:
            if jsonl:
                jsonl.close()
    console.print(summary_table(trajectories, time.perf_counter() - start, args.out))
    return sorted(trajectories, key=lambda t: (t.group, t.sample))


def judged_mean(trajectories: list[Trajectory], key: str | None = None) -> float:
    """The mean reward (or reward component ``key``) over the judged episodes; nan when none
    was judged. An episode with an error or an infrastructure fault has no verdict to average."""
    judged = [t for t in trajectories if t.judged]
    if not judged:
        return float("nan")
    values = [t.reward if key is None else t.reward_components.get(key, 0.0) for t in judged]
    return sum(values) / len(judged)


def summary_table(trajectories: list[Trajectory], seconds: float, out: Path) -> Table:
    n = len(trajectories)
    tokens = sum(t.completion_tokens for t in trajectories)
    errors = [t for t in trajectories if t.error]
    unjudged = [t for t in trajectories if t.error is None and t.infra_error is not None]
    calling = sum(t.tool_calls > 0 for t in trajectories)
    table = Table(title="rollout summary", show_header=False)
    rows = [
        ("trajectories", str(n)),
        ("judged", str(n - len(errors) - len(unjudged))),
        ("mean reward (judged)", f"{judged_mean(trajectories):.3f}"),
        ("mean turns", f"{sum(len(t.turns) for t in trajectories) / max(n, 1):.2f}"),
        ("mean tool calls", f"{sum(t.tool_calls for t in trajectories) / max(n, 1):.2f}"),
        ("episodes calling a tool", f"{calling} ({calling / max(n, 1):.0%})"),
        ("generated tokens", str(tokens)),
        ("tokens/s", f"{tokens / max(seconds, 1e-9):.1f}"),
        ("wall time", f"{seconds:.1f} s"),
        ("errors", str(len(errors)) + (f" (first: {errors[0].error})" if errors else "")),
        (
            "infra errors (not judged)",
            str(len(unjudged)) + (f" (first: {unjudged[0].infra_error})" if unjudged else ""),
        ),
        ("written to", str(out)),
    ]
    components = sorted({key for t in trajectories for key in t.reward_components})
    rows[3:3] = [(f"  mean {key}", f"{judged_mean(trajectories, key):.3f}") for key in components]
    for key, value in rows:
        table.add_row(key, value)
    return table
