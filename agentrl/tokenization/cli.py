"""``agentrl check-template MODEL_OR_TOKENIZER``: can trajectories built with this chat template be
trusted to equal a full render, and where not, why?

MODEL_OR_TOKENIZER is ``smollm2``, a local model or tokenizer directory, a ``.gguf`` file, a
``.jinja`` template file (rendered with the ``--tokenizer`` vocabulary, smollm2 by default), or the
name of a template shipped in ``agentrl/tokenization/templates``. The exit status is in
:data:`EXIT_STATUS`.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.tokenization.chat_format import BUILTIN_TEMPLATES, builtin_template
from agentrl.tokenization.checker import (
    USES,
    TemplateReport,
    Verdict,
    check_template,
    group_seams,
)

if TYPE_CHECKING:
    from rich.console import Console

EXIT_STATUS = {
    Verdict.APPEND_ONLY: 0,
    Verdict.NOT_APPEND_ONLY: 1,
    Verdict.UNUSABLE: 3,
    Verdict.TOKEN_SEAMS: 4,
}
"""Exit status per verdict (the most severe over the uses checked); 2: cannot be loaded."""

_GUARANTEES = """\
verdicts, per use (the exit status is the most severe over the uses checked):
  append-only      (exit 0) at every generation point of the use's sample conversations the
                   TrajectoryBuilder's ids equal encode(render(conversation so far)), given an
                   engine whose tokens are the tokenizer's own encoding of its text.
  token seams      (exit 4) the builder's ids decode to exactly the rendered text, but a full
                   encode splits the text around a boundary differently (a generation prompt
                   ending in text that merges with the generated text). Training is consistent:
                   the trainer scores the ids the engine saw. A re-render finds other ids there;
                   TrajectoryBuilder(seams="reencode") re-encodes them (the seam's ids get loss
                   mask 0).
  NOT append-only  (exit 1) a full render writes other text than the builder holds (earlier
                   reasoning dropped, the system prompt moved, a turn rewritten). The builder keeps
                   the tokens the engine saw and warns (policy 'keep') or refuses ('strict').
  cannot be used   (exit 3) the template raises for the roles the use needs (no tool role,
                   alternating roles only...), or cannot give deltas at all; builders refuse it.
  (exit 2: the model, tokenizer or file cannot be loaded)

uses: tools (tool schemas, tool calls, two tool results in a row, reasoning), plain (no tools),
no_reply (an environment step that returns no messages); each with and without a system
message. A builder with tools is judged by 'tools', one without by 'plain', an empty
add_messages() by 'no_reply', each for the sample conversation with (or without) a system
message as its episode has.
Not covered: behaviour the samples do not trigger (counters beyond three user turns, keys other
than role/content/name). Templates that print the date or time are reported as time-dependent;
builders render each episode at its start time, so they stay exact across midnight."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's arguments to ``parser``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _GUARANTEES
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
    parser.add_argument(
        "--special-tokens",
        default="",
        metavar="TOKEN,...",
        help="marker strings to add to the vocabulary as special tokens (e.g. Llama 3's "
        "'<|start_header_id|>,<|end_header_id|>,<|eot_id|>' to check its template with smollm2)",
    )
    parser.add_argument(
        "--use",
        action="append",
        choices=list(USES),
        help="check only this use (repeatable; default: all uses)",
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
    markers = [token for token in args.special_tokens.split(",") if token]
    if markers:  # on a copy: the loaded tokenizer is shared by the process
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.add_special_tokens({"additional_special_tokens": markers})
    report = check_template(tokenizer, template)
    uses = args.use or list(USES)
    verdict = report.verdict(uses)
    if args.json:
        console.print_json(json.dumps({**report.to_dict(), "verdict": verdict.value}))
    else:
        _print_report(console, args.model, report, uses)
    return EXIT_STATUS[verdict]


_VERDICT_TEXT = {
    Verdict.APPEND_ONLY: ("append-only", "bold green"),
    Verdict.TOKEN_SEAMS: ("token seams", "bold yellow"),
    Verdict.NOT_APPEND_ONLY: ("NOT append-only", "bold red"),
    Verdict.UNUSABLE: ("cannot be used", "bold red"),
}
_MEANING = {
    Verdict.TOKEN_SEAMS: (
        "Same text, other ids at the seams: training is consistent (the engine's ids are kept); "
        "TrajectoryBuilder(seams='reencode') makes trajectories equal a full render."
    ),
    Verdict.NOT_APPEND_ONLY: (
        "TrajectoryBuilder keeps the tokens the engine saw (policy 'keep', with a "
        "TemplateWarning): its trajectories differ from a from-scratch render of the final "
        "conversation, which matters if SFT or evaluation re-render conversations. Policy "
        "'strict' refuses this template."
    ),
    Verdict.UNUSABLE: "TrajectoryBuilder refuses this template for this use.",
}


def _print_report(console: Console, name: str, report: TemplateReport, uses: list[str]) -> None:
    from rich.table import Table
    from rich.text import Text

    if report.error:
        console.print(Text(f"{name}: the template cannot be used: {report.error}", style="red"))
        return
    text, style = _VERDICT_TEXT[report.verdict(uses)]
    console.print(Text.assemble(f"{name}: ", (text, style)))
    facts = Table(show_header=False, box=None)
    facts.add_row("end-of-turn tokens", Text(", ".join(report.end_of_turn_tokens)))
    facts.add_row("generation prompt", Text(repr(report.generation_prompt)))
    tools = "yes" if report.renders_tools else "no (put tool schemas in the system prompt)"
    facts.add_row("renders tool schemas", Text(tools))
    clock = (
        f"yes, strftime_now({', '.join(map(repr, report.clock_formats))}); each episode "
        "renders at its start time"
        if report.time_dependent
        else "no"
    )
    facts.add_row("prints the date or time", Text(clock))
    console.print(facts)
    for use in report.uses:
        if use.name not in uses:
            continue
        text, style = _VERDICT_TEXT[use.verdict]
        console.print(
            Text.assemble(f"use {use.name}: ", (text, style), f"  ({USES[use.name].description})")
        )
        if len({v for _, v in use.conversations}) > 1:
            per = "; ".join(f"{c}: {_VERDICT_TEXT[v][0]}" for c, v in use.conversations)
            console.print(Text(f"    by sample conversation: {per}"))
        if use.error:
            console.print(Text(f"    {use.error}"))
        for issue in use.issues:
            kinds = ", ".join(kind.value for kind in issue.kinds)
            console.print(
                Text.assemble(
                    ("    [" + kinds + "] ", "yellow"), f"{issue.conversation}: {issue.detail}"
                )
            )
            console.print(Text(f"        should extend: {issue.earlier!r}"))
            console.print(Text(f"        rendered:      {issue.later!r}"))
        for seam, also in group_seams(use.seams):
            console.print(Text.assemble(("    [token_seam] ", "yellow"), seam.describe(also)))
        if use.seams and not use.reencode_exact:
            console.print(
                Text("    seams='reencode' does not remove every difference", style="red")
            )
        if use.verdict in _MEANING:
            console.print(Text("    " + _MEANING[use.verdict], style="dim"))
