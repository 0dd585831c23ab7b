"""The command line the rows writers share (``swebench_rows``, ``swesmith_rows``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.instances import SWEInstance, load_instances


def rows_cli(
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    write: Callable[[Sequence[SWEInstance], str], list[dict[str, Any]]],
) -> tuple[int, int, str]:
    """The command line of a rows writer: ``OUT [INSTANCE_ID...] [--instances FILE]``; writes
    with ``write`` and returns (instances selected, rows written, OUT)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("out", help="the .jsonl file to write")
    parser.add_argument("instance_ids", nargs="*", help="these instances only (default: all)")
    parser.add_argument("--instances", default=str(SHIPPED_INSTANCES), help="instances file")
    args = parser.parse_args(argv)
    instances = load_instances(args.instances)
    if args.instance_ids:
        unknown = sorted(set(args.instance_ids) - {i.instance_id for i in instances})
        if unknown:
            parser.error(f"no such instance in {args.instances}: {', '.join(unknown)}")
        instances = [i for i in instances if i.instance_id in args.instance_ids]
    return len(instances), len(write(instances, args.out)), args.out
