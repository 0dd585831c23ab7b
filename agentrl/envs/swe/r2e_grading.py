"""R2E-Gym's grading of a test run: its log parser and its reward, reproduced.

R2E-Gym (github.com/R2E-Gym/R2E-Gym, ``src/r2egym``) is not on PyPI, so its code cannot run here;
this module reproduces what its ``DockerRuntime._calculate_reward_r2e`` does with the output of
``bash /root/run_tests.sh`` (``agenthub/runtime/docker.py``), rule for rule:

1. ``run_tests`` strips ANSI colour codes and ``\\r`` from the output (``\\x1b\\[[0-9;]*m|\\r``);
2. ``parse_log_pytest`` (``repo_analysis/execution_log_parser.py``, the parser ``parse_log_fn``
   gives every R2E-Gym repository) reads only what follows pytest's ``short test summary info``
   line: a line holding ``PASSED`` anywhere is a pass, else one holding ``FAILED`` a failure,
   else one holding ``ERROR`` an error; the test's name is the line's ``::``-separated parts
   after the first joined with ``.`` (the file is dropped: ``r2e_tests/test_1.py::TestA::test_b``
   is ``TestA.test_b``), cut at ``" - "`` for failures and errors;
3. ``decolor_dict_keys`` removes ``\\x1b[<n>m`` from the names of both maps, then each name of
   both is cut at ``" - "``;
4. the reward is 1 when both maps have as many tests and every parsed test has its expected
   status, else 0.

One deliberate difference: where R2E-Gym compares a parsed test the expected map lacks, its
``expected[k]`` raises ``KeyError`` (its run loop then has no reward); here that is a mismatch,
reward 0, with the test named in the reason. Statuses other than the three (``SKIPPED``,
``XFAIL``, ``XPASS`` lines) are not read, as there.

**Where the run happens** (:func:`grade_r2e`) differs from R2E-Gym on purpose, the verdict's
rules not: R2E-Gym runs the tests in the agent's own container, where ``/testbed/r2e_tests`` is a
link to the hidden tests the agent can read and rewrite. Here the agent's tree never holds
``run_tests.sh`` or ``r2e_tests`` (R2E-Gym's ``SKIP_FILES_NEW``, which its runtime moves out of
``/testbed``) and cannot read the image's ``/r2e_tests``; the patch (the agent's diff) is applied
with R2E-Gym's ``git apply --whitespace=fix`` to a fresh copy of the image's ``/testbed`` in a new
container, whatever it put at ``r2e_tests`` is replaced by the image's hidden tests (copied out
through the engine), and the image's ``run_tests.sh`` runs from outside the tree.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from agentrl.envs.swe.grading import SWEGrade
from agentrl.envs.swe.instances import SWEInstance
from agentrl.tools.sandbox import Sandbox

R2E_GYM = "r2e-gym"
"""The row format (:mod:`agentrl.envs.swe.row_formats`) graded here."""
RUN_TESTS = "/tmp/agentrl-run_tests.sh"
"""Where the grader keeps the image's ``/testbed/run_tests.sh``, out of the patch's reach."""
TESTS_DIR = "/r2e_tests"
"""Where R2E-Gym's images hold the hidden tests."""
_PATCH = "/tmp/agentrl-r2e.diff"
_TESTS_TAR = "/tmp/agentrl-r2e-tests.tar"
_MAX_LOG_BYTES = 8 << 20

_ANSI_OR_CR = re.compile(r"\x1b\[[0-9;]*m|\r")
_COLOUR = re.compile(r"\x1b\[\d+m")


def strip_output(output: str) -> str:
    """``DockerRuntime.run_tests``' cleaning of the test output."""
    return _ANSI_OR_CR.sub("", output)


def parse_log_pytest(log: str | None) -> dict[str, str]:
    """R2E-Gym's ``parse_log_pytest``: test name -> ``PASSED``/``FAILED``/``ERROR``."""
    if log is None or "short test summary info" not in log:
        return {}
    statuses: dict[str, str] = {}
    for line in log.split("short test summary info")[1].strip().split("\n"):
        name = ".".join(line.split("::")[1:])
        if "PASSED" in line:
            statuses[name] = "PASSED"
        elif "FAILED" in line:
            statuses[name.split(" - ")[0]] = "FAILED"
        elif "ERROR" in line:
            statuses[name.split(" - ")[0]] = "ERROR"
    return statuses


def _normalised(statuses: Mapping[str, str]) -> dict[str, str]:
    """``decolor_dict_keys``, then every name cut at ``" - "`` (later names win, as there)."""
    decolored = {_COLOUR.sub("", name): status for name, status in statuses.items()}
    return {name.split(" - ")[0]: decolored[name] for name in sorted(decolored)}


def r2e_verdict(output: str, expected: Mapping[str, str]) -> tuple[bool, dict[str, str], str]:
    """R2E-Gym's reward on ``output`` (the raw test output) against ``expected``
    (``expected_output_json``): ``(resolved, the parsed statuses, why not)``."""
    parsed = _normalised(parse_log_pytest(strip_output(output)))
    want = _normalised(expected)
    if len(parsed) != len(want):
        return (
            False,
            parsed,
            (
                f"R2E-Gym's parser read {len(parsed)} tests from the run, "
                f"expected_output_json has {len(want)}"
            ),
        )
    for name, status in parsed.items():
        if name not in want:
            return False, parsed, f"the run has a test expected_output_json lacks: {name!r}"
        if status != want[name]:
            return False, parsed, f"{name!r} is {status}, expected {want[name]}"
    return True, parsed, ""


def set_up_script(*, agent: bool) -> str:
    """Shell (``set -e``, in the fresh copy of ``/testbed``) that takes R2E-Gym's hidden files
    (its ``SKIP_FILES_NEW``: ``run_tests.sh``, ``r2e_tests``) out of the tree: the agent's box drops them, the grader keeps ``run_tests.sh`` at
    :data:`RUN_TESTS` (an image without one fails the set-up); then R2E-Gym's clean-up of
    compiled files."""
    keep = "rm -f run_tests.sh" if agent else f"mv run_tests.sh {RUN_TESTS}"
    return (
        f"{keep}; rm -rf r2e_tests; find . -name '*.pyc' -delete; "
        "find . -name __pycache__ -prune -exec rm -rf {} +; "
    )


async def grade_r2e(
    sandbox: Sandbox, instance: SWEInstance, patch: str, tests: bytes, timeout: float
) -> SWEGrade:
    """Apply ``patch`` in ``sandbox`` (a grader's box set up with :func:`set_up_script`), put
    ``tests`` (a tar of the image's ``/r2e_tests``) at ``r2e_tests``, run ``run_tests.sh`` and
    judge its output as R2E-Gym does."""
    harness = instance.harness
    assert harness is not None and harness.expected_statuses is not None
    repo = shlex.quote(harness.repo_dir)
    if patch:  # R2E-Gym grades the tree as the agent left it: an unchanged one is tested too
        await sandbox.write_file(_PATCH, patch)
        apply = f"cd {repo} && git apply --whitespace=fix {_PATCH}"
        if (await sandbox.exec(["bash", "-c", apply])).exit_code != 0:
            why = "the patch does not apply (R2E-Gym's git apply --whitespace=fix)"
            return SWEGrade(False, reason=why)
    await sandbox.write_file(_TESTS_TAR, tests)
    place = (
        f"cd {repo} && rm -rf r2e_tests && tar -xf {_TESTS_TAR} --no-same-owner "
        f"--no-same-permissions && rm {_TESTS_TAR} && test -d r2e_tests"
    )
    placed = await sandbox.exec(["bash", "-c", place])
    if placed.exit_code != 0:  # the tree is the patch's: r2e_tests may be anything it made
        return SWEGrade(
            False, reason=f"the hidden tests could not be put back: {placed.stderr[-500:]}"
        )
    run = await sandbox.exec(
        ["bash", "-c", f"cd {repo} && bash {RUN_TESTS} 2>&1"],
        timeout=timeout,
        max_output_bytes=_MAX_LOG_BYTES,
    )
    if run.timed_out:
        return SWEGrade(False, reason=f"run_tests.sh ran past {timeout:g} s", log=run.stdout)
    resolved, parsed, why = r2e_verdict(run.stdout, harness.expected_statuses)
    wanted = [name.split(" - ")[0] for name in instance.FAIL_TO_PASS]
    passed = sum(parsed.get(name) == "PASSED" for name in wanted)
    return SWEGrade(
        resolved,
        fail_to_pass=(passed, len(wanted)),
        reason="" if resolved else f"{why} (R2E-Gym's reward)",
        log=run.stdout,
        exit_code=run.exit_code,
    )
