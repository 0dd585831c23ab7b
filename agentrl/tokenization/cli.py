"""``agentrl check-template MODEL_OR_TOKENIZER``: is this chat template append-only?

MODEL_OR_TOKENIZER is ``smollm2``, a local model or tokenizer directory, a ``.gguf`` file, a
``.jinja`` template file (rendered with the ``--tokenizer`` vocabulary, smollm2 by default), or the
name of a template shipped in ``agentrl/tokenization/templates``. Exit status: 0 when the template is
append-only with token-exact deltas, 1 when it is not, 2 when it cannot be loaded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.tokenization.chat_format import BUILTIN_TEMPLATES, builtin_template
from agentrl.tokenization.checker import TemplateReport, check_template

if TYPE_CHECKING:
    from rich.console import Console

_POLICY_NOTE = (
    "TrajectoryBuilder keeps the tokens the engine saw (policy 'keep', with a TemplateWarning): "
    "its trajectories will differ from a from-scratch render of the final conversation, which "
    "matters if SFT or evaluation re-render conversations. Policy 'strict' refuses this template."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's arguments to ``parser``."""
    parser.add_argument(
        "model",
        metavar="MODEL_OR_TOKENIZER",
        help="'smollm2', a model/tokenizer directory, a .gguf file, a .jinja file, or one of "
        + ", ".join(sorted(BUILTIN_TEMPLATES)),
    )
    parser.add_argument(
        "--tokenizer",
        default="smollm2",
        help="vocabulary for a .jinja or built-in template (default: smollm2)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    """Check the template named by ``args``, print the report; return the exit status."""
    from rich.console import Console
    from rich.text import Text

    from agentrl.models import load_tokenizer

    console = console or Console()
    path = Path(args.model).expanduser()
    try:
        if path.suffix == ".jinja":
            template: str | None = path.read_text("utf-8")
            tokenizer = load_tokenizer(args.tokenizer)
        elif args.model in BUILTIN_TEMPLATES and not path.exists():
            template = builtin_template(args.model)
            tokenizer = load_tokenizer(args.tokenizer)
        else:
            template = None
            tokenizer = load_tokenizer(args.model)
    except (OSError, ValueError) as error:
        console.print(Text(f"cannot load {args.model!r}: {error}", style="red"))
        return 2
    report = check_template(tokenizer, template)
    if args.json:
        console.print_json(json.dumps(report.to_dict()))
    else:
        _print_report(console, args.model, report)
    return 0 if report.ok else 1


def _print_report(console: Console, name: str, report: TemplateReport) -> None:
    from rich.table import Table
    from rich.text import Text

    if report.error:
        console.print(Text(f"{name}: the template cannot be used: {report.error}", style="red"))
        return
    verdict = (
        Text("append-only", style="bold green")
        if report.ok
        else Text("NOT append-only", style="bold red")
    )
    console.print(Text.assemble(f"{name}: ", verdict))
    facts = Table(show_header=False, box=None)
    facts.add_row("end-of-turn tokens", Text(", ".join(report.end_of_turn_tokens)))
    facts.add_row("generation prompt", Text(repr(report.generation_prompt)))
    tools = "yes" if report.renders_tools else "no (put tool schemas in the system prompt)"
    facts.add_row("renders tool schemas", Text(tools))
    console.print(facts)
    for issue in report.issues:
        kinds = ", ".join(kind.value for kind in issue.kinds)
        console.print(
            Text.assemble((f"[{kinds}] ", "yellow"), f"{issue.conversation}: {issue.detail}")
        )
        console.print(Text(f"    should extend: {issue.earlier!r}"))
        console.print(Text(f"    rendered:      {issue.later!r}"))
    if report.issues:
        console.print(Text(_POLICY_NOTE, style="dim"))
