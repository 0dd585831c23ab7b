"""What the rows writers share (``swebench_rows``, ``swesmith_rows``, ``r2e_rows``): their command
line and their JSON-lines output."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.instances import SWEInstance, load_instances


def write_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Write ``rows`` to ``path``, one JSON object a line (non-ASCII kept as is)."""
    Path(path).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def rows_cli(
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    write: Callable[[Sequence[SWEInstance], str], list[dict[str, Any]]],
    left_out: str = "",
) -> None:
    """The command line of a rows writer: ``OUT [INSTANCE_ID...] [--instances FILE]``; writes
    with ``write`` and prints how many rows it wrote, and how many instances it left out and
    why (``left_out``) when it left any."""
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
    written = len(write(instances, args.out))
    left = len(instances) - written
    print(
        f"{written} rows written to {args.out}"
        + (f"; {left} left out ({left_out})" if left else "")
    )
