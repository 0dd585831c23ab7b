"""The generator's command line: ``python -m agentrl.envs.swe.taskgen`` (:func:`main`), and
``add_arguments``/``run`` for ``agentrl swe generate`` (``agentrl/cli.py``'s convention for a
subcommand module; the ``swe`` parser gets a ``generate`` subcommand)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from agentrl.config import ConfigError
from agentrl.envs.swe.taskgen.config import TaskgenConfig
from agentrl.envs.swe.taskgen.mutators import MUTATORS
from agentrl.envs.swe.taskgen.pipeline import Tally, generate

DESCRIPTION = (
    "Inject bugs into the source of Python projects (sdists with pytest suites) and write "
    "verified SWE-bench instances, the sdists and one JSON per project."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``agentrl swe`` parser: its ``generate`` subcommand."""
    commands = parser.add_subparsers(dest="swe_command", required=True, metavar="COMMAND")
    generate_parser = commands.add_parser(
        "generate", help="generate SWE tasks from sdists", description=DESCRIPTION
    )
    add_generate_arguments(generate_parser)


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    fields = TaskgenConfig.model_fields

    def doc(name: str) -> str:
        default = fields[name].default
        return f"{fields[name].description} (default: {default})".replace("%", "%%")

    parser.add_argument("sdists", nargs="+", type=Path, help="source distributions (.tar.gz)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=fields["seed"].default, help=doc("seed"))
    for name, kind in [
        ("max_instances", int),
        ("min_fail", int),
        ("max_fail", int),
        ("max_hidden_bytes", int),
        ("p2p_max", int),
        ("time_budget", float),
        ("jobs", int),
        ("test_timeout", float),
    ]:
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=kind, default=fields[name].default, help=doc(name))
    parser.add_argument("--python", default=fields["python"].default, help=doc("python"))
    parser.add_argument(
        "--kinds",
        type=lambda text: text.split(","),
        help=f"comma-separated mutation kinds, of: {', '.join(MUTATORS)} (default: all)",
    )
    parser.add_argument(
        "--source",
        action="append",
        metavar="PATTERN",
        help=f"{fields['source'].description} Repeatable.",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentrl.envs.swe.taskgen", description=DESCRIPTION
    )
    add_generate_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    options = {k: v for k, v in vars(args).items() if k in TaskgenConfig.model_fields}
    sdists, out = args.sdists, args.out
    try:
        config = TaskgenConfig.build("taskgen", options)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    missing = [str(sdist) for sdist in sdists if not sdist.is_file()]
    if missing:
        print(f"taskgen: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    console = Console(stderr=True)
    start = time.monotonic()
    with Progress(
        TextColumn("[bold]{task.fields[project]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("kept; {task.fields[tried]}/{task.fields[candidates]} candidates tried"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        tasks: dict[str, TaskID] = {}
        tallies: dict[str, Tally] = {}

        def show(tally: Tally) -> None:
            tallies[tally.project] = tally
            if tally.project not in tasks:
                tasks[tally.project] = progress.add_task(
                    "", total=config.max_instances, project=tally.project, tried=0, candidates=0
                )
            progress.update(
                tasks[tally.project],
                completed=tally.kept,
                tried=tally.tried,
                candidates=tally.candidates,
            )
            if tally.done:
                progress.update(tasks[tally.project], total=tally.kept or 1)

        try:
            instances = generate(sdists, out, config, show)
        except (OSError, ValueError, RuntimeError) as exc:
            progress.stop()
            print(f"taskgen: {exc}", file=sys.stderr)
            return 1
    for tally in tallies.values():
        reasons = ", ".join(f"{reason}: {n}" for reason, n in tally.rejected.most_common())
        console.print(f"{tally.project}: {tally.kept} kept of {tally.tried} tried ({reasons})")
    console.print(
        f"{len(instances)} instances from {len(sdists)} project(s) in "
        f"{time.monotonic() - start:.0f} s -> {out / 'instances.jsonl'}"
    )
    return 0
