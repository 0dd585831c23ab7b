"""Grade a HumanEval-style solution by running the problem's tests in a fresh sandbox.

``await grade(program, problem, sandbox=...)`` starts a sandbox that nothing else has touched
(from a :class:`~agentrl.tools.SandboxPool`, or from a factory such as
:func:`~agentrl.tools.sandbox_factory`), runs :mod:`agentrl.envs.code.harness` in it with a time
limit, and destroys it. It runs the problem's hidden tests (HumanEval's ``check``), or with
``tests="public"`` its public tests (the docstring's examples,
:attr:`~agentrl.envs.code.problems.CodeProblem.public_tests`; none at all still checks that the
program loads). Each run has its own fresh sandbox, so a solution cannot carry what it saw in
one run (the hidden tests' inputs) into another's report. The tests pass only on evidence the
solution cannot forge:

* the harness's judge process exited 0 without timing out, and
* its stdout carries the random nonce of this grading, which only the judge holds and prints
  only after ``check(candidate)`` returned.

The solution runs in a separate process that is never given the nonce or the tests and cannot
read the judge's memory (see the harness); its results reach the tests as plain built-in values.

Failures are told apart:

* ``grading_error`` (an infrastructure failure, never a verdict on the solution): no sandbox could
  be had (the backend failed to start one, or the pool is closed), the sandbox's host went away
  with it (:class:`~agentrl.tools.SandboxLost`: a container engine that stopped answering), or
  the harness could not set itself up.
* A sandbox that dies *while the tests run* is a failed test run, with the reason as feedback:
  the usual causes are the solution's own (a memory or fork bomb that takes the sandbox's agent
  down with it, or code that kills or stops the agent), and a deliberate crash must not buy the
  model a dropped episode instead of a zero.

What this does NOT guarantee (checked in ``tests/envs/code/test_grading.py``):

* The sandbox's agent (:mod:`agentrl.tools.sandbox_agent`) holds the nonce while it feeds it to
  the judge and runs as the same uid as the solution; it is non-dumpable
  (``prctl(PR_SET_DUMPABLE, 0)``), so a solution can neither read it from ``/proc/<agent>/mem`` nor
  ``ptrace`` it (tested). A kernel exploit from inside the sandbox is not covered.
* The tests are HumanEval's, public and finite: a solution that memorised the expected outputs
  passes them.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agentrl.envs.code import harness
from agentrl.envs.code.examples import public_check
from agentrl.envs.code.problems import CodeProblem
from agentrl.tools import Sandbox, SandboxError, SandboxLost, SandboxPool
from agentrl.tools.sandbox_pool import SandboxFactory

HARNESS_SOURCE = Path(harness.__file__).read_text()
_MAX_OUTPUT_BYTES = 65_536


@dataclass(frozen=True)
class GradeResult:
    """The verdict on one solution."""

    passed: bool
    """Every test passed, on the evidence described in the module docstring."""
    feedback: str = ""
    """Why the tests failed (the failing assertion, the solution's traceback, what it printed),
    cut to its last ``feedback_chars`` characters; empty when passed. It quotes the tests that
    ran: Code-v0 shows the model only that of a public run."""
    timed_out: bool = False
    """The test run was killed at the time limit."""
    grading_error: str | None = None
    """An infrastructure failure (sandbox or harness), not the solution's fault; None otherwise."""
    duration_s: float = 0.0
    """Wall-clock time of the grading, sandbox start included."""


async def grade(
    program: str,
    problem: CodeProblem,
    *,
    sandbox: SandboxFactory | SandboxPool,
    tests: Literal["hidden", "public"] = "hidden",
    timeout: float = 10.0,
    feedback_chars: int = 2000,
) -> GradeResult:
    """Run ``problem``'s ``tests`` against ``program`` (a module defining
    ``problem.entry_point``) in a fresh sandbox from ``sandbox``, for at most ``timeout``
    seconds."""
    started = time.monotonic()
    nonce = secrets.token_hex(16)
    request = {
        "nonce": nonce,
        "program": program,
        "prompt": problem.prompt,
        "test": problem.test if tests == "hidden" else public_check(problem.public_tests),
        "entry_point": problem.entry_point,
    }
    crash = None
    try:
        async with _fresh(sandbox) as box:
            try:
                result = await box.exec(
                    ["python3", "-I", "-u", "-c", HARNESS_SOURCE, "judge"],
                    timeout=timeout,
                    stdin=json.dumps(request),
                    max_output_bytes=_MAX_OUTPUT_BYTES,
                )
            except SandboxLost:
                raise  # its host went away with it: handled below, as no sandbox at all
            except SandboxError as exc:  # died under the solution: see the module docstring
                crash = str(exc)
    except Exception as exc:  # no sandbox could be had, or it was lost: never the solution's fault
        return GradeResult(
            passed=False,
            grading_error=f"{type(exc).__name__}: {exc}",
            duration_s=time.monotonic() - started,
        )
    duration = time.monotonic() - started
    if crash is not None:
        feedback = _cut(f"The sandbox died while the tests ran: {crash}", feedback_chars)
        return GradeResult(passed=False, feedback=feedback, duration_s=duration)
    if result.exit_code == harness.HARNESS_FAILED:
        return GradeResult(
            passed=False,
            grading_error=f"the test harness failed: {result.stderr.strip()[-500:]}",
            duration_s=duration,
        )
    passed = result.exit_code == 0 and not result.timed_out and nonce in result.stdout.splitlines()
    if passed:
        return GradeResult(passed=True, duration_s=duration)
    if result.timed_out:
        why = f"The tests timed out after {timeout:g} s (an infinite loop, or too slow)."
    elif result.exit_code is not None and (result.exit_code < 0 or result.exit_code == 137):
        why = f"The test run was killed (exit code {result.exit_code}; out of memory?)."
    elif result.exit_code == 0:
        why = "The test run ended without evidence that the tests ran."
    else:
        why = ""
    feedback = _cut(
        "\n".join(part for part in (result.stderr.rstrip(), why) if part), feedback_chars
    )
    return GradeResult(
        passed=False, feedback=feedback, timed_out=result.timed_out, duration_s=duration
    )


def _cut(text: str, limit: int) -> str:
    """The last ``limit`` characters of ``text``, marked when cut (the cause comes last)."""
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


@contextlib.asynccontextmanager
async def _fresh(source: SandboxFactory | SandboxPool) -> AsyncIterator[Sandbox]:
    """A sandbox no one has used, destroyed on exit."""
    if isinstance(source, SandboxPool):
        async with source.acquire() as box:
            yield box
    else:
        async with await source() as box:
            yield box
