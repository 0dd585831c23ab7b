"""Problem statements for generated tasks, written like a user's bug report.

A statement is made only of what a user running the tests would see: the failing tests' node ids,
the statement of the test that failed and the exception pytest reported (expected against actual
value, for assertions), or what the test printed when the exception says nothing more than its
type. It never names the changed file or line and never shows the fix (the failing call in a test
may name the function that holds the bug, as a user's report would). Paths of the scratch tree and
memory addresses are removed from the messages so that the text is the same on every run.
"""

from __future__ import annotations

import hashlib
import re
import textwrap
from collections.abc import Mapping, Sequence

from agentrl.envs.swe.taskgen.testrun import Failure

MAX_LISTED_TESTS = 6
MAX_EXAMPLES = 2
MAX_MESSAGE_LINES = 24
MAX_MESSAGE_CHARS = 1200

_OPENINGS = (
    "I'm seeing wrong behaviour in {project} {version}.",
    "Something in {project} {version} does not work the way its tests say it should.",
    "After setting up {project} {version} from this repository, part of its test suite fails.",
)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def problem_statement(
    instance_id: str,
    project: str,
    version: str,
    failing: Sequence[str],
    failures: Mapping[str, Failure],
    scrub: Sequence[str] = (),
) -> str:
    """The issue text for the tests ``failing`` (node ids) with their ``failures``; each string in
    ``scrub`` (the scratch tree's path) is removed from the messages. The wording varies with
    ``instance_id`` and nothing else."""
    choice = int(hashlib.sha256(instance_id.encode()).hexdigest(), 16)
    lines = [_OPENINGS[choice % len(_OPENINGS)].format(project=project, version=version), ""]
    noun = "test fails" if len(failing) == 1 else f"{len(failing)} tests fail"
    lines.append(f"The following {noun}:")
    lines.append("")
    lines += [f"- `{test}`" for test in failing[:MAX_LISTED_TESTS]]
    if len(failing) > MAX_LISTED_TESTS:
        lines.append(f"- ... and {len(failing) - MAX_LISTED_TESTS} more")
    shown: set[str] = set()
    for test in failing:
        failure = failures.get(test)
        if failure is None or len(shown) == MAX_EXAMPLES:
            continue
        message = _clean(failure.exception, scrub)
        if message in shown:
            continue
        shown.add(message)
        name = test.split("::")[-1]
        lines.append("")
        if failure.statement:
            statement = _clean(failure.statement, scrub)
            lines += [f"For example, `{name}` runs", "", textwrap.indent(statement, "    "), ""]
            lines += ["and fails with", ""]
        else:
            lines += [f"For example, `{name}` fails with", ""]
        lines.append(textwrap.indent(message, "    "))
        if ":" not in message.splitlines()[0] and failure.output.strip():
            # A bare exception (an assertion in a helper pytest does not explain): what the
            # test printed usually shows the expected and actual values.
            lines += ["", "It printed", "", textwrap.indent(_clean(failure.output, scrub), "    ")]
    these = "This test should pass" if len(failing) == 1 else "These tests should pass"
    lines += ["", f"{these}; the rest of the test suite passes."]
    return "\n".join(lines) + "\n"


def _clean(text: str, scrub: Sequence[str]) -> str:
    for path in scrub:
        text = text.replace(f"{path}/", "").replace(path, ".")
    text = _ADDRESS.sub("", text)
    lines = text.strip().splitlines()
    if len(lines) > MAX_MESSAGE_LINES:
        lines = [*lines[:MAX_MESSAGE_LINES], "..."]
    text = "\n".join(lines)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + " ..."
