"""``agentrl sft CONFIG [key=value ...]``: supervised fine-tuning on multi-turn conversations.

Examples::

    agentrl demos --env agentrl/Math-v0 --env-kwargs mode=multi --count 160 --out demos.jsonl
    agentrl sft examples/math_tool_sft_cpu.yaml
    agentrl sft examples/math_tool_sft_cpu.yaml data.path=demos.jsonl trainer.epochs=2
    torchrun --nproc_per_node 2 -m agentrl.cli sft examples/math_tool_sft_cpu.yaml
    agentrl sft --help-config            # every key, its default and what it does
    agentrl train examples/math_tool_grpo_cpu.yaml model.path=runs/math_tool_sft_cpu/hf

Ctrl-C stops after the step in progress and saves a checkpoint (exit code 130). Re-running the same
command resumes from the newest checkpoint in ``trainer.output_dir``.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from agentrl.malloc import fix_mmap_threshold, limit_malloc_arenas

if TYPE_CHECKING:
    from agentrl.sft.config import SFTConfig
    from agentrl.sft.trainer import SFTSummary

INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentrl.config import add_arguments as add_config_arguments

    add_config_arguments(parser, example="data.path=demos.jsonl trainer.epochs=2")


def run(args: argparse.Namespace) -> int:
    limit_malloc_arenas()  # before any thread allocates (agentrl/malloc.py)
    fix_mmap_threshold()
    from agentrl.config import config_from_args
    from agentrl.sft.config import SFTConfig, sft_config_reference_markdown

    console = Console()
    config = config_from_args(
        args, "agentrl sft", SFTConfig, SFTConfig.load, sft_config_reference_markdown, console
    )
    if isinstance(config, int):
        return config
    return _train(config, console)


def _train(config: SFTConfig, console: Console) -> int:
    from agentrl.config import ConfigError
    from agentrl.sft.data import ConversationError
    from agentrl.sft.trainer import SFTTrainer
    from agentrl.training.distributed import destroy

    trainer = SFTTrainer(config, console=console)

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        if trainer.stop_requested:
            raise KeyboardInterrupt
        trainer.request_stop()
        console.print("[yellow]Ctrl-C: stopping after the current step; press again to abandon it")

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        with trainer:
            summary = trainer.run()
    except (ConfigError, ConversationError, FileNotFoundError) as exc:
        console.print(f"[red]{exc}[/red]", highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print("[red]abandoned: the step in progress is not saved")
        return INTERRUPTED
    finally:
        signal.signal(signal.SIGINT, previous)
        destroy()
    if trainer.is_main:
        console.print(summary_table(summary, config))
    return INTERRUPTED if summary.interrupted else 0


def summary_table(summary: SFTSummary, config: SFTConfig) -> Table:
    """The end-of-run table: steps, last losses, peak memory, where the outputs are."""
    from agentrl.training.memory import peak_memory_summary

    metrics = summary.last_metrics
    table = Table(title="SFT summary", show_header=False)
    rows = [
        ("steps", f"{summary.steps} this run, {summary.final_step} in all"),
        ("stopped early", "yes (Ctrl-C)" if summary.interrupted else "no"),
        ("last train loss", f"{metrics.get('train/loss', float('nan')):.4f}"),
        ("validation loss", f"{metrics.get('val/loss', float('nan')):.4f}"),
        ("peak memory", peak_memory_summary(metrics)),
        ("metrics", str(Path(config.trainer.output_dir) / "metrics.jsonl")),
        ("checkpoint", str(summary.checkpoint or "-")),
        ("exported model", str(summary.exported or "-")),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table
