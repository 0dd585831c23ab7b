"""Code-v0 demonstrations: HumanEval's canonical solution written, run on the docstring's examples
with the python tool, (for every third problem) a planted one-line bug found and fixed, submitted.

:func:`code_demonstration` is registered in :data:`agentrl.sft.demos.DEMONSTRATORS`; the module
docstring there says what every constructed demonstration guarantees.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from agentrl.envs.code.problems import CodeProblem
from agentrl.sft.demo_row import Env, Row, finish_demonstration
from agentrl.tools import ToolCall


@dataclass(frozen=True)
class CodeExample:
    """A call of a Code-v0 problem's function with literal arguments, and the result its
    docstring shows for it (``str`` of the value, as ``print`` writes it)."""

    call: str
    expected: str


def code_examples(problem: CodeProblem, limit: int = 2) -> list[CodeExample]:
    """Up to ``limit`` of ``problem``'s public tests (its docstring's examples,
    :func:`agentrl.envs.code.examples.public_tests`), with calls that take arguments. Never
    anything of the hidden tests: a problem whose docstring has no example gets none, and its
    demonstration only checks that the function runs."""
    examples = []
    for test in problem.public_tests:
        call = ast.parse(test.call, mode="eval").body
        if isinstance(call, ast.Call) and (call.args or call.keywords):
            examples.append(CodeExample(test.call, str(ast.literal_eval(test.expected))))
    return examples[:limit]


@dataclass(frozen=True)
class Mutation:
    """A one-line bug planted in a solution: the program with it, and the line before and after."""

    program: str
    line: str
    broken_line: str


def code_mutations(program: str, first_line: int) -> list[Mutation]:
    """Simple one-line bugs in the lines of ``program`` from ``first_line`` (1-based) on: an
    off-by-one (``x + 1`` or ``x - 1`` becomes ``x``), then a flipped bound (``<`` and ``<=``,
    ``>`` and ``>=``), in source order. Nothing inside a ``while`` loop is touched (a changed
    bound there can loop forever); each mutation changes the program's syntax tree."""
    tree = ast.parse(program)
    in_while = {
        id(node)
        for loop in ast.walk(tree)
        if isinstance(loop, ast.While)
        for node in ast.walk(loop)
    }
    lines = program.splitlines(keepends=True)
    found: list[tuple[int, int, int, ast.expr, ast.expr]] = []
    for node in ast.walk(tree):
        if id(node) in in_while or not isinstance(node, (ast.BinOp, ast.Compare)):
            continue
        if node.lineno < first_line or node.lineno != node.end_lineno:
            continue
        broken: ast.expr | None = None
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, (ast.Add, ast.Sub))
            and isinstance(node.right, ast.Constant)
            and node.right.value == 1
            and type(node.right.value) is int
        ):
            broken, kind = node.left, 0
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            flipped = _FLIPPED.get(type(node.ops[0]))
            if flipped is not None:
                broken, kind = ast.Compare(node.left, [flipped()], node.comparators), 1
        if broken is not None:
            found.append((kind, node.lineno, node.col_offset, node, broken))
    mutations = []
    for _, lineno, _, node, broken in sorted(found, key=lambda item: item[:3]):
        line = lines[lineno - 1]
        if not line.isascii():  # col_offset counts UTF-8 bytes
            continue
        broken_line = line[: node.col_offset] + ast.unparse(broken) + line[node.end_col_offset :]
        mutated = "".join([*lines[: lineno - 1], broken_line, *lines[lineno:]])
        mutations.append(Mutation(mutated, line.strip(), broken_line.strip()))
    return mutations


_FLIPPED: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
}


async def code_demonstration(env: Env, index: int) -> Row | None:
    """A verified demonstration of Code-v0 problem ``index`` (None: not rewarded 1, or an example
    the reference solution does not reproduce). ``env`` is a ``mode="multi"`` Code-v0 environment
    with the python tool (it is reset here).

    The reference solution (the prompt completed by HumanEval's canonical solution) is run with
    the python tool on the docstring's examples (:func:`code_examples`), then submitted in a
    ```` ```python ```` block. For every third problem (``index % 3 == 2``) whose examples have
    expected results, the first run is of the solution with a planted bug
    (:func:`code_mutations`); when the environment's output shows it (a result other than the
    docstring's, or an exception) the next turn names the wrong line, fixes it and runs the
    examples again before submitting. A bug that does not show is dropped and the episode starts
    over with the next one (three at most), then without one."""
    code_env: Any = env.unwrapped  # a CodeEnv
    problem: CodeProblem = code_env.problems[index]
    examples = code_examples(problem)
    checked = bool(examples)
    prompt = problem.prompt.lstrip("\n")
    program = prompt + problem.canonical_solution
    if index % 3 == 2 and checked:
        for mutation in code_mutations(program, prompt.count("\n") + 1)[:3]:
            if row := await _code_episode(env, index, program, examples, mutation):
                return row
    return await _code_episode(env, index, program, examples, None)


async def _code_episode(
    env: Env, index: int, program: str, examples: list[CodeExample], mutation: Mutation | None
) -> Row | None:
    messages, info = await env.areset(seed=index, options={"index": index})
    code_env: Any = env.unwrapped
    parser = getattr(code_env, "parser", None)
    if parser is None or "python" not in code_env.tools:
        return None
    expected = [example.expected for example in examples]
    checked = bool(examples)
    prints = "".join(f"print({example.call})\n" for example in examples)
    if not prints:
        prints = f"print({code_env.problem.entry_point}.__name__, 'is defined')\n"

    def run(code: str) -> str:
        try:
            return parser.format(
                ToolCall("python", {"code": f"{code.rstrip()}\n\n{prints}"}, raw="")
            )
        except ValueError:  # the code contains the tool's closing tag
            return ""

    conversation = [*messages]

    async def say(text: str) -> str | None:
        """Step ``text``; the tool's output, or None unless it is exactly one tool message."""
        observation, _, terminated, truncated, _ = await env.astep(text)
        if terminated or truncated or len(observation) != 1 or observation[0]["role"] != "tool":
            return None
        conversation.extend([{"role": "assistant", "content": text}, *observation])
        return str(observation[0]["content"])

    lead = (
        "Let me write the function and run it on the examples from the docstring."
        if checked
        else "Let me write the function and check that it runs."
    )
    call = run(mutation.program if mutation else program)
    output = await say(f"{lead}\n{call}") if call else None
    if output is None:
        return None
    if mutation is not None:
        got = _printed(output)
        wrong = [i for i in range(len(examples)) if i >= len(got) or got[i] != expected[i]]
        if not wrong:
            return None  # the bug does not show on these examples
        example = examples[wrong[0]]
        error = next((line for line in reversed(got) if "Error" in line), None)
        if error is not None:
            seen = f"raised {error}"
        else:
            seen = f"printed {got[wrong[0]]}" if wrong[0] < len(got) else "printed nothing"
        explanation = (
            f"The docstring expects {example.expected} for `{example.call}`, but the code {seen}. "
            f"The line `{mutation.broken_line}` is wrong: it should be `{mutation.line}`. "
            "Let me fix it and run the examples again."
        )
        output = await say(f"{explanation}\n{run(program)}")
        if output is None:
            return None
    if checked and _printed(output) != expected:
        return None  # the reference solution does not give the docstring's results
    if "Traceback" in output or re.search(r"^\[(exit code|timed out)", output, re.M):
        return None
    done = (
        "The results match the docstring's examples"
        if checked
        else "The function runs without errors"
    )
    last = f"{done}, so here is the solution:\n\n```python\n{program.rstrip()}\n```"
    problem_id = str(info.get("task_id", ""))
    return await finish_demonstration(
        env, conversation, last, info=info, index=index, problem_id=problem_id
    )


def _printed(output: str) -> list[str]:
    """The lines a tool's output printed (an empty line counts: ``print('')``)."""
    return output.removesuffix("\n").split("\n")
