"""Code-v0's multi-turn feedback comes from the public tests only; the hidden tests stay hidden.

The last test runs scripted episodes over all 164 problems with submissions built to leak
(they print and raise their arguments, or pass exactly the docstring's examples) and checks that
no literal of a problem's hidden tests that its prompt does not show reaches an observation.
"""

import ast
import asyncio
import re

import pytest

from agentrl.envs.code import CodeEnv, load_problems
from agentrl.tools import SandboxError, SandboxLimits, sandbox_factory

PROBLEMS = load_problems()
LIMITS = SandboxLimits(memory_mb=512, pids=64, cpus=1.0)
WRONG = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
HIDDEN_ASSERTION = "assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True"


def fenced(code: str) -> str:
    return f"```python\n{code}```"


def echo(problem, raises: bool = False) -> str:
    """A wrong solution that shows the model every input it is called with: it prints them and
    returns None, or raises an exception that names them."""
    if raises:
        body = '    raise ValueError(f"called with {args!r}")\n'
    else:
        body = '    print("called with", repr(args))\n    return None\n'
    return fenced(f"def {problem.entry_point}(*args):\n{body}")


def overfit(problem) -> str:
    """A solution that gives the reference's answers on the docstring's examples only (None for
    every other input), printing each input: it passes the public tests, not the hidden ones."""
    examples = {
        repr(tuple(ast.literal_eval(argument) for argument in node.args))
        for test in problem.public_tests
        for node in ast.walk(ast.parse(test.call, mode="eval"))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == problem.entry_point
    }
    name = problem.entry_point
    wrapper = f"""
_reference = {name}
_examples = {sorted(examples)!r}
_depth = 0


def {name}(*args):
    global _depth
    if _depth:  # the reference calling itself
        return _reference(*args)
    print("called with", repr(args))
    _depth += 1
    try:
        result = _reference(*args)
    finally:
        _depth -= 1
    return result if repr(args) in _examples else None
"""
    return fenced(problem.prompt + problem.canonical_solution + wrapper)


async def episode(env, index, actions):
    """The observation texts and infos of the steps of ``actions`` on problem ``index``."""
    await env.areset(options={"index": index})
    texts, infos = [], []
    for action in actions:
        observation, _, terminated, _, info = await env.astep(action)
        texts += [message["content"] for message in observation]
        infos.append(info)
        if terminated:
            break
    return texts, infos


@pytest.fixture
def counted():
    """``(factory, starts)``: a bwrap sandbox factory, and the list of the sandboxes it started
    (or failed to: the ``fail_from``-th start on raises)."""
    starts = []
    real = sandbox_factory("bwrap", LIMITS)

    def make(fail_from=None):
        async def factory():
            starts.append(len(starts) + 1)
            if fail_from is not None and len(starts) >= fail_from:
                raise SandboxError("no sandbox today")
            return await real()

        return factory

    return make, starts


async def test_a_failed_submission_sees_the_failing_example_and_nothing_of_the_hidden_tests():
    env = CodeEnv(mode="multi", tools=())
    (text,), (info,) = await episode(env, 0, [WRONG])
    assert text.startswith("Submission 1 of 3 failed the hidden tests.\n")
    assert "Run on the docstring's examples (the public tests):" in text
    assert "assert has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3) == True" in text
    assert "which returned False" in text and text.endswith("(2 attempts left).")
    assert "candidate" not in text and "3.9" not in text
    assert info["feedback"] in text and info["public_tests_passed"] is False
    assert info["tests_passed"] is False and HIDDEN_ASSERTION in info["hidden_test_report"]


async def test_passing_the_examples_but_not_the_hidden_tests_says_only_that():
    env = CodeEnv(mode="multi", tools=())
    (text,), (info,) = await episode(env, 0, [overfit(PROBLEMS[0])])
    assert text == (
        "Submission 1 of 3 failed the hidden tests.\n"
        "It passes the docstring's 2 examples (the public tests); the hidden tests check cases "
        "they do not show.\n\n"
        "Fix it and submit the whole function again in a ```python code block (2 attempts left)."
    )
    assert info["public_tests_passed"] is True and "called with" in info["hidden_test_report"]


async def test_without_examples_only_a_solution_that_does_not_load_is_shown_why():
    env = CodeEnv(mode="multi", tools=())
    prints = fenced("def decode_cyclic(s):\n    print(s)\n    return s\n")
    broken = fenced("def decode_cyclic(s):\n    print(s)\n    return (\n")
    texts, _ = await episode(env, 38, [prints, broken])
    assert texts[0] == (
        "Submission 1 of 3 failed the hidden tests.\n"
        "The docstring has no examples to run as public tests; nothing more is shown.\n\n"
        "Fix it and submit the whole function again in a ```python code block (2 attempts left)."
    )
    assert "Run alone (the docstring has no examples to test), it fails:" in texts[1]
    assert "SyntaxError" in texts[1]


async def test_feedback_none_says_only_that_the_submission_failed(counted):
    make, starts = counted
    env = CodeEnv(mode="multi", tools=(), feedback="none")
    env.grading_sandboxes = make()
    (text,), (info,) = await episode(env, 0, [WRONG])
    assert text == (
        "Submission 1 of 3 failed the hidden tests.\n\n"
        "Fix it and submit the whole function again in a ```python code block (2 attempts left)."
    )
    assert info["feedback"] == "" and "public_tests_passed" not in info
    assert starts == [1]  # the hidden tests' run only
    assert "you see the result" not in env.default_system_prompt()


async def test_the_last_attempt_runs_no_public_tests(counted):
    make, starts = counted
    env = CodeEnv(mode="multi", tools=(), max_attempts=1)
    env.grading_sandboxes = make()
    texts, (info,) = await episode(env, 0, [WRONG])
    assert texts == [] and info["feedback"] == "" and starts == [1]


async def test_a_public_run_without_a_sandbox_is_an_infrastructure_error(counted):
    make, starts = counted
    env = CodeEnv(mode="multi", tools=())
    env.grading_sandboxes = make(fail_from=2)
    texts, (info,) = await episode(env, 0, [WRONG])
    assert texts == [] and starts == [1, 2]
    assert info["infra_error"] == info["grading_error"] == "SandboxError: no sandbox today"
    assert info["tests_passed"] is False


def literals(code: str):
    """``(value, source)`` of each literal in ``code``: constants, and containers of literals."""
    literal_nodes = (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp)
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, literal_nodes):
            try:
                value = ast.literal_eval(node)
            except ValueError:
                continue
            yield value, ast.get_source_segment(code, node)


def hidden_texts(problem) -> set[str]:
    """What of the hidden tests the model must never see: each literal of them that the prompt
    does not show, as written and as its ``repr`` (as the harness prints values). Literals
    shown by the public tests count as shown, whatever their spelling; None and booleans tell
    nothing; shorter than 5 characters could turn up by chance."""
    shown = {repr(value) for test in problem.public_tests for value, _ in literals(test.assertion)}
    texts = set()
    for value, source in literals(problem.test):
        forms = {repr(value), source}
        if value is None or isinstance(value, bool) or repr(value) in shown:
            continue
        if not any(form in problem.prompt for form in forms):
            texts |= {form for form in forms if len(form) >= 5}
    return texts


def leaked(texts: set[str], observation: str) -> list[str]:
    return sorted(
        text for text in texts if re.search(rf"(?<![\w.]){re.escape(text)}(?![\w.])", observation)
    )


@pytest.mark.slow
async def test_no_literal_of_the_hidden_tests_reaches_an_observation():
    """Every problem gets one wrong submission with an attempt left: one that prints its inputs
    and returns None, one that raises naming them, or (where the docstring has examples) one
    that passes exactly the examples; 1 hidden and 1 public run each (328 gradings)."""
    gate = asyncio.Semaphore(4)

    async def one(index):
        problem = PROBLEMS[index]
        probes = [echo(problem), echo(problem, raises=True), overfit(problem)]
        probe = probes[index % 3] if problem.public_tests else probes[index % 2]
        async with gate:
            env = CodeEnv(mode="multi", tools=(), max_attempts=2)
            texts, infos = await episode(env, index, [probe])
        return texts, infos[-1]

    episodes = await asyncio.gather(*(one(index) for index in range(len(PROBLEMS))))
    checked = found = 0
    outcomes = {"failed an example": 0, "passed the examples": 0, "no examples": 0}
    for problem, (texts, info) in zip(PROBLEMS, episodes, strict=True):
        assert "grading_error" not in info and not info["tests_passed"], problem.task_id
        secret = hidden_texts(problem)
        checked += len(secret)
        for text in texts:
            assert not (leak := leaked(secret, text)), (problem.task_id, leak, text)
            found += 1
        outcomes["failed an example"] += "Run on the docstring's examples" in info["feedback"]
        outcomes["passed the examples"] += "It passes the docstring's" in info["feedback"]
        outcomes["no examples"] += "has no examples" in info["feedback"]
    assert found == len(PROBLEMS)  # one feedback message each
    assert checked > 1500  # texts of the hidden tests looked for (1686 at the time of writing)
    assert outcomes == {"failed an example": 103, "passed the examples": 47, "no examples": 14}
