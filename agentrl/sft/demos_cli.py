"""``agentrl demos``: write tool-use demonstrations (conversation rows for ``agentrl sft``).

Examples::

    # constructed from the environment's own tasks, each verified by stepping the environment
    agentrl demos --env agentrl/Math-v0 --env-kwargs mode=multi tool_format=tags \\
        answer_format=flexible generated_difficulty=2 --count 300 --out runs/demos/math.jsonl
    agentrl demos --env agentrl/Code-v0 --env-kwargs mode=multi tool_format=hermes \\
        --count 164 --out runs/demos/code.jsonl
    # rejection sampling: the successful episodes of a rollout file
    agentrl rollout --env agentrl/Math-v0 --env-kwargs mode=multi --n 64 --out runs/r.jsonl
    agentrl demos --env agentrl/Math-v0 --env-kwargs mode=multi --from-rollouts runs/r.jsonl \\
        --min-reward 1 --out runs/demos/sampled.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentrl.rollout.cli import add_env_arguments

    add_env_arguments(parser)
    parser.add_argument(
        "--count", type=int, default=100, help="demonstrations to write (constructed mode)"
    )
    parser.add_argument("--start", type=int, default=0, help="first task index tried")
    parser.add_argument("--concurrency", type=int, default=8, help="episodes in flight")
    parser.add_argument(
        "--from-rollouts",
        type=Path,
        default=None,
        metavar="FILE",
        help="rejection sampling: keep the successful episodes of this `agentrl rollout` JSONL",
    )
    parser.add_argument(
        "--min-reward", type=float, default=1.0, help="with --from-rollouts: reward threshold"
    )
    parser.add_argument("--out", type=Path, required=True, help="output .jsonl file")


class DemosError(Exception):
    """A problem with the arguments or inputs, shown as one ``agentrl demos: ...`` line (exit 2)."""


def run(args: argparse.Namespace) -> int:
    from agentrl.rollout.cli import parse_kwargs

    if args.out.suffix.lower() != ".jsonl":
        raise SystemExit(f"--out must end in .jsonl, got {args.out}")
    if args.count < 1:
        raise SystemExit(f"--count must be >= 1, got {args.count}")
    kwargs = parse_kwargs(args.env_kwargs)
    # Rows go to a side file that replaces --out only when the run succeeds, so a failed or
    # interrupted run never leaves a file that looks like its result.
    partial = args.out.with_name(args.out.name + ".partial")
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.from_rollouts is not None:
            written = asyncio.run(_from_rollouts(args, kwargs, partial))
        else:
            written = asyncio.run(_constructed(args, kwargs, partial))
        if written:
            partial.replace(args.out)
    except DemosError as error:
        print(f"agentrl demos: {error}", file=sys.stderr)
        return 2
    finally:
        partial.unlink(missing_ok=True)
    return 0 if written else 1


async def _probe(env_id: str, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Make ``env_id`` and reset it once: its base environment (for the task count) and the
    reset's info (the tool schemas, the same for every episode)."""
    import gymnasium

    import agentrl  # noqa: F401  (registers environments)
    from agentrl.config import ConfigError

    try:
        env: Any = gymnasium.make(env_id, **kwargs)
    except gymnasium.error.Error as error:
        raise DemosError(f"--env {env_id}: {error}") from error
    except ConfigError as error:
        raise DemosError(f"--env-kwargs: {error}") from error
    if not hasattr(env, "astep"):
        raise DemosError(f"{env_id} is not an agentrl environment (it has no async verbs)")
    try:
        _, info = await env.areset(seed=0)
    finally:
        await env.aclose()
    return env.unwrapped, info


async def _constructed(args: argparse.Namespace, kwargs: dict[str, Any], partial: Path) -> int:
    from agentrl.sft.demos import DEMONSTRATORS, constructed_demonstrations

    console = Console()
    probe, _ = await _probe(args.env, kwargs)
    if args.env not in DEMONSTRATORS:
        raise DemosError(
            f"no constructed demonstrations for {args.env} (supported: "
            f"{', '.join(sorted(DEMONSTRATORS))}); use --from-rollouts for rejection sampling"
        )
    if getattr(probe, "parser", None) is None:
        raise DemosError(
            f"constructed demonstrations call the python tool: pass --env-kwargs mode=multi "
            f"(got {args.env} with {kwargs or 'no kwargs'})"
        )
    tasks = len(probe.problems)
    start = time.perf_counter()
    written = tried = 0
    index = args.start
    with partial.open("w") as out, console.status("writing demonstrations") as status:
        # batches of the missing count, so skipped tasks are replaced by the next ones
        while written < args.count and index < tasks:
            batch = range(index, min(tasks, index + args.count - written))
            index = batch.stop
            async for row in constructed_demonstrations(
                args.env, kwargs, batch, concurrency=args.concurrency
            ):
                tried += 1
                if row is not None and written < args.count:
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    written += 1
                status.update(f"{written} demonstrations written, {tried} tasks tried")
    seconds = time.perf_counter() - start
    console.print(
        f"{written} verified demonstrations ({tried} tasks tried, {tried - written} skipped) "
        f"in {seconds:.1f} s -> {args.out if written else 'nothing written'}",
        soft_wrap=True,
    )
    return written


async def _from_rollouts(args: argparse.Namespace, kwargs: dict[str, Any], partial: Path) -> int:
    from agentrl.rollout.trajectory import Trajectory
    from agentrl.sft.demos import successful_trajectories

    source = args.from_rollouts
    if not source.is_file():
        raise DemosError(f"--from-rollouts: no such file: {source}")
    records = []
    with source.open() as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DemosError(
                    f"--from-rollouts: {source} line {number} is not JSON ({error.msg}); "
                    "expected the .jsonl that `agentrl rollout --out` writes"
                ) from error
            try:
                Trajectory.from_record(record)
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                raise DemosError(
                    f"--from-rollouts: {source} line {number} is not an `agentrl rollout` record "
                    f"({type(error).__name__}: {error})"
                ) from error
            records.append(record)
    _, info = await _probe(args.env, kwargs)
    rows = successful_trajectories(records, args.min_reward, info.get("tools"))
    with partial.open("w") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    Console().print(
        f"{len(rows)} of {len(records)} episodes kept (reward >= {args.min_reward}) -> "
        f"{args.out if rows else 'nothing written'}",
        soft_wrap=True,
    )
    return len(rows)
