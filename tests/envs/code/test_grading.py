"""The HumanEval grader against ground truth and against solutions that try to fake a pass.

The container tests need Podman's (or Docker's) API at ``DOCKER_HOST`` and the image from
``sandboxes/build.sh``; the test command sets both up, so they fail rather than skip without them.
"""

import asyncio
import dataclasses
import textwrap
import time

import pytest

from agentrl.envs.code import CodeProblem, grade, load_problems
from agentrl.envs.code.examples import public_tests
from agentrl.tools import SandboxError, SandboxLimits, SandboxPool, sandbox_factory

LIMITS = SandboxLimits(memory_mb=512, pids=64, cpus=1.0)
PROBLEMS = load_problems()
HAS_CLOSE = PROBLEMS[0]  # has_close_elements(numbers, threshold) -> bool
FIND_ZERO = PROBLEMS[32]  # find_zero(xs); its tests check poly(xs, result) with the prompt's poly


@pytest.fixture
def bwrap():
    return sandbox_factory("bwrap", LIMITS)


def stub(problem: CodeProblem) -> str:
    """The corrupted solution: the prompt alone, a function whose body is its docstring.

    It returns None for every input, a wrong answer of a built-in type, so it is rejected by the
    tests' own assertions (not by the harness's rule against non-built-in results, which the
    adversarial tests below cover). Every HumanEval suite asserts at least one result that None
    fails, whether compared with ``==`` or checked for truth; the ground-truth test checks that
    for all 164.
    """
    return problem.prompt


async def grade_all(programs, sandbox, concurrency=4, timeout=20.0, tests="hidden"):
    gate = asyncio.Semaphore(concurrency)

    async def one(problem, program):
        async with gate:
            return await grade(program, problem, sandbox=sandbox, timeout=timeout, tests=tests)

    return await asyncio.gather(*(one(problem, program) for problem, program in programs))


async def assert_ground_truth(problems, sandbox):
    canonical = [(p, p.prompt + p.canonical_solution) for p in problems]
    corrupted = [(p, stub(p)) for p in problems]
    results = await grade_all(canonical + corrupted, sandbox)
    assert [r.grading_error for r in results] == [None] * len(results)
    verdicts = [r.passed for r in results]
    failed = [
        p.task_id for p, ok in zip(problems, verdicts[: len(problems)], strict=True) if not ok
    ]
    passed = [p.task_id for p, ok in zip(problems, verdicts[len(problems) :], strict=True) if ok]
    assert failed == [], "canonical solutions that failed"
    assert passed == [], "corrupted solutions that passed"


@pytest.mark.slow
async def test_ground_truth_all_164_with_bwrap(bwrap):
    """Every canonical solution scores 1 and its corrupted version 0 (328 gradings)."""
    await assert_ground_truth(PROBLEMS, bwrap)


@pytest.mark.slow
async def test_reference_solutions_pass_every_public_test_and_fail_every_dropped_one(bwrap):
    """The public tests (the docstrings' examples) of the 150 problems that have some hold for
    HumanEval's reference solutions, and each example dropped as contradicted fails them, alone
    (156 gradings)."""
    with_tests = [p for p in PROBLEMS if p.public_tests]
    dropped = [
        dataclasses.replace(problem, public_tests=(test,))
        for problem in PROBLEMS
        for test in public_tests("", problem.prompt, problem.entry_point)
        if test not in problem.public_tests
    ]
    programs = [(p, p.prompt + p.canonical_solution) for p in with_tests + dropped]
    results = await grade_all(programs, bwrap, tests="public")
    assert [r.grading_error for r in results] == [None] * len(results)
    verdicts = {
        (p.task_id, p.public_tests): r.passed for (p, _), r in zip(programs, results, strict=True)
    }
    assert [p.task_id for p in with_tests if not verdicts[p.task_id, p.public_tests]] == []
    assert [p.public_tests for p in dropped if verdicts[p.task_id, p.public_tests]] == []
    assert len(with_tests) == 150 and len(dropped) == 6


@pytest.mark.slow
async def test_ground_truth_with_containers_from_a_pool():
    async with SandboxPool(sandbox_factory("container", LIMITS), warm=4) as pool:
        await assert_ground_truth(PROBLEMS[::21], pool)


async def graded(program, problem=HAS_CLOSE, sandbox=None, **kwargs):
    return await grade(
        program, problem, sandbox=sandbox or sandbox_factory("bwrap", LIMITS), **kwargs
    )


def solution(body: str, problem=HAS_CLOSE) -> str:
    """``body`` (module-level code run before the tests) followed by the canonical solution, so
    that only the code in ``body`` can make the grading fail."""
    return textwrap.dedent(body) + "\n" + problem.prompt + problem.canonical_solution


async def test_canonical_passes_and_failure_feedback_names_the_assertion():
    assert (await graded(solution(""))).passed
    result = await graded(HAS_CLOSE.prompt + "    return False\n")
    assert not result.passed and result.grading_error is None and not result.timed_out
    assert "assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True" in result.feedback
    assert "AssertionError" in result.feedback
    assert "has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3), which returned False" in (
        result.feedback
    )


async def test_public_tests_run_the_docstrings_examples_and_nothing_of_the_hidden_tests():
    result = await graded(HAS_CLOSE.prompt + "    return False\n", tests="public")
    assert not result.passed and result.grading_error is None
    assert "assert has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3) == True" in (
        result.feedback
    )
    assert "has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3), which returned False" in (
        result.feedback
    )
    assert "candidate" not in result.feedback and "3.9" not in result.feedback
    reference = HAS_CLOSE.prompt + HAS_CLOSE.canonical_solution
    assert (await graded(reference, tests="public")).passed


async def test_public_tests_of_a_problem_without_examples_check_that_the_solution_loads():
    decode_cyclic = PROBLEMS[38]
    assert decode_cyclic.public_tests == ()
    wrong = decode_cyclic.prompt + "    return s\n"
    assert not (await graded(wrong, problem=decode_cyclic)).passed
    assert (await graded(wrong, problem=decode_cyclic, tests="public")).passed
    broken = await graded(wrong + "(\n", problem=decode_cyclic, tests="public")
    assert not broken.passed and "SyntaxError" in broken.feedback


async def test_feedback_shows_the_solutions_traceback_and_prints():
    result = await graded(
        HAS_CLOSE.prompt + "    print('debug', numbers)\n    return numbers[99]\n"
    )
    assert "debug [1.0, 2.0, 3.9, 4.0, 5.0, 2.2]" in result.feedback
    assert 'File "solution.py", line 13, in has_close_elements' in result.feedback
    assert "IndexError: list index out of range" in result.feedback


async def test_a_flood_of_output_does_not_hide_why_the_tests_failed():
    flood = "    for i in range(20_000):\n        print('noise', i)\n    return None\n"
    result = await graded(HAS_CLOSE.prompt + flood)
    assert len(result.feedback) < 2000 and "noise 0\n" not in result.feedback  # the end is kept
    assert "noise 19999" in result.feedback and "which returned None" in result.feedback


async def test_syntax_error_fails_with_its_message():
    result = await graded(HAS_CLOSE.prompt + "    return (\n")
    assert not result.passed and result.grading_error is None
    assert "SyntaxError" in result.feedback and "solution.py" in result.feedback


async def test_infinite_loop_times_out_without_hanging():
    started = time.monotonic()
    result = await graded(HAS_CLOSE.prompt + "    while True:\n        pass\n", timeout=1.5)
    assert not result.passed and result.timed_out and "timed out after 1.5 s" in result.feedback
    assert time.monotonic() - started < 8


async def test_printing_a_pass_marker_and_exiting_early_fails():
    result = await graded(solution("import sys\nprint('PASSED')\nprint('ok')\nsys.exit(0)"))
    assert not result.passed and "SystemExit: 0" in result.feedback


async def test_printing_every_string_the_solution_can_find_then_exiting_0_fails():
    """In a one-process harness the nonce is in the program text: in /proc/self/cmdline, in the
    code object's constants, in the file. Here the solution process holds none of them, and
    ``os._exit(0)`` ends only the solution process."""
    body = """
        import os, sys
        for path in ("/proc/self/cmdline", f"/proc/{os.getppid()}/cmdline", "/proc/self/environ"):
            print(open(path, "rb").read().decode(errors="replace").replace("\\0", "\\n"))
        print(*sys.argv, *sys._getframe().f_code.co_consts, sep="\\n")
        os._exit(0)
    """
    result = await graded(solution(body))
    assert not result.passed and "exited with code 0 while loading" in result.feedback


async def test_results_with_a_rigged_eq_do_not_reach_the_tests():
    always_equal = """
        def has_close_elements(numbers, threshold):
            class AlwaysEqual:
                def __eq__(self, other):
                    return True
                def __bool__(self):
                    return True
            return AlwaysEqual()
    """
    result = await graded(HAS_CLOSE.prompt + textwrap.dedent(always_equal))
    assert not result.passed and "object of type AlwaysEqual cannot be passed" in result.feedback
    int_subclass = """
        class Yes(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__

        def has_close_elements(numbers, threshold):
            return Yes(0)
    """
    result = await graded(HAS_CLOSE.prompt + textwrap.dedent(int_subclass))
    assert not result.passed and "which returned 0" in result.feedback


async def test_redefining_the_prompts_helpers_does_not_change_the_tests():
    """find_zero's tests check ``poly(xs, result) ~ 0`` with the prompt's ``poly``; a solution
    that redefines ``poly`` to return 0 passes a one-process harness, not this one."""
    rigged = "\ndef poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n"
    result = await graded(FIND_ZERO.prompt + rigged, problem=FIND_ZERO)
    assert not result.passed and "AssertionError" in result.feedback


async def test_killing_the_judge_fails():
    result = await graded(solution("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"))
    assert not result.passed and "killed" in result.feedback


async def test_the_judges_memory_and_descriptors_are_closed_to_the_solution():
    body = """
        import os
        opened = []
        for name, mode in [("environ", "rb"), ("mem", "rb"), ("fd/0", "rb"), ("fd/1", "wb")]:
            try:
                open(f"/proc/{os.getppid()}/{name}", mode).close()
                opened.append(name)
            except PermissionError:
                pass
        raise SystemExit(f"opened: {opened}")
    """
    result = await graded(solution(body))
    assert "SystemExit: opened: []" in result.feedback


async def test_the_nonce_cannot_be_read_from_any_process_in_the_sandbox():
    body = r"""
        import os, re
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                memory = open(f"/proc/{pid}/mem", "rb")
                for line in open(f"/proc/{pid}/maps"):
                    start, end = (int(x, 16) for x in line.split()[0].split("-"))
                    if "rw-p" in line:
                        memory.seek(start)
                        found += re.findall(rb'nonce\\": \\"([0-9a-f]{32})', memory.read(end - start))
            except OSError:
                pass
        raise SystemExit(f"found: {found}")
    """
    result = await graded(solution(body))
    assert "SystemExit: found: []" in result.feedback


async def test_a_sandbox_killed_by_the_solution_is_a_failure_not_a_grading_error():
    result = await graded(solution("import os, signal\nos.kill(-1, signal.SIGKILL)"))
    assert not result.passed and result.grading_error is None
    assert "The sandbox died while the tests ran" in result.feedback


async def test_a_sandbox_that_cannot_start_is_a_grading_error():
    async def broken():
        raise SandboxError("no sandbox today")

    result = await graded(solution(""), sandbox=broken)
    assert not result.passed and result.feedback == ""
    assert result.grading_error == "SandboxError: no sandbox today"
