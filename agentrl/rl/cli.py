"""``agentrl train CONFIG [key=value ...]``: run a training job from a YAML config.

Examples::

    agentrl train examples/math_grpo_cpu.yaml
    agentrl train examples/math_grpo_cpu.yaml trainer.steps=50 actor.lr=5e-6
    torchrun --nproc_per_node 2 -m agentrl.cli train examples/math_grpo_cpu.yaml
    agentrl train --help-config          # every key, its default and what it does

Ctrl-C stops after the step in progress, saves a checkpoint and the curves (exit code 130); a
second Ctrl-C abandons the step. Re-running the same command resumes from the newest checkpoint
in ``trainer.output_dir`` (``trainer.resume=never`` starts over).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentrl.config import add_arguments as config_arguments
from agentrl.config import config_from_args
from agentrl.malloc import fix_mmap_threshold, limit_malloc_arenas

INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    limit_malloc_arenas()  # before any thread allocates (agentrl/malloc.py)
    fix_mmap_threshold()
    from agentrl.rl.config import TrainConfig, config_reference_markdown

    console = Console()
    config = config_from_args(
        args, "agentrl train", TrainConfig, TrainConfig.load, config_reference_markdown, console
    )
    if isinstance(config, int):
        return config
    return asyncio.run(_train(config, console))


async def _train(config, console: Console) -> int:
    import agentrl  # noqa: F401  (registers environments)
    from agentrl.config import ConfigError
    from agentrl.rl.loop import Trainer
    from agentrl.training.distributed import destroy

    trainer = Trainer(config, console=console)
    main_task = asyncio.current_task()
    presses = 0

    def on_interrupt() -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            trainer.request_stop()
            console.print(
                "[yellow]Ctrl-C: stopping after the current step; press again to abandon it"
            )
        elif main_task is not None:
            main_task.cancel()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, on_interrupt)
    try:
        async with trainer:
            summary = await trainer.run()
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]", highlight=False)
        return 2
    except asyncio.CancelledError:
        console.print(
            "[red]abandoned: the step in progress is not saved (exiting once its worker thread ends)"
        )
        return INTERRUPTED
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        destroy()
    if trainer.is_main:
        console.print(summary_table(summary, config, trainer.engine_dtype))
    return INTERRUPTED if summary.interrupted else 0


def mismatch_summary(metrics: dict[str, float]) -> str:
    """The last step's mean |Δ log p| over all tokens and over the on-policy ones, in words."""
    overall = f"{metrics.get('mismatch/mean_abs', float('nan')):.2e} over all tokens"
    fraction = metrics.get("mismatch/on_policy_fraction", 0.0)
    if not fraction:  # every token was sampled by older weights (or nothing was measured)
        return f"{overall} (none sampled by the weights trained: staleness included)"
    on_policy = metrics["mismatch/on_policy_mean_abs"]
    return f"{overall}, {on_policy:.2e} over the {fraction:.0%} sampled by the weights trained"


def summary_table(summary, config, engine_dtype: str = "float32") -> Table:
    from agentrl.training.memory import peak_memory_summary

    metrics = summary.last_metrics
    table = Table(title="training summary", show_header=False)
    rows = [
        ("steps", f"{summary.steps} this run, {summary.final_step} in all"),
        ("stopped early", "yes (Ctrl-C)" if summary.interrupted else "no"),
        ("last mean reward", f"{metrics.get('reward/mean', float('nan')):.3f}"),
        ("last mean turns", f"{metrics.get('episodes/turns_mean', float('nan')):.2f}"),
        (
            "last tool calls",
            f"{metrics.get('episodes/tool_calls_mean', float('nan')):.2f} per episode, "
            f"{metrics.get('episodes/tool_use_fraction', float('nan')):.0%} of episodes call one",
        ),
        ("last mismatch (mean |Δ log p|)", mismatch_summary(metrics)),
        ("engine weights", f"{engine_dtype} (engines.dtype={config.engines.dtype})"),
        ("peak memory", peak_memory_summary(metrics)),
        ("metrics", str(Path(config.trainer.output_dir) / "metrics.jsonl")),
        ("checkpoint", str(summary.checkpoint or "-")),
        ("curves", str(summary.curves or "-")),
        ("exported model", str(summary.exported or "-")),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table
