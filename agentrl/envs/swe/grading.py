"""Grading a SWE patch like SWE-bench's harness, and stricter.

:func:`grade` takes the agent's diff and, in a **fresh sandbox** from the project's image:

1. refuses a patch that is too large or touches a *protected* file (:func:`protected_paths`):
   the files ``test_patch`` touches, the files that hold ``FAIL_TO_PASS``/``PASS_TO_PASS`` tests,
   any ``conftest.py``, pytest's configuration files (``pytest.ini``, ``tox.ini``, ``setup.cfg``,
   ``pyproject.toml``) and Python's start-up hooks (``sitecustomize.py``, ``usercustomize.py``,
   ``*.pth``). SWE-bench lets a patch edit tests and then applies ``test_patch`` over them; here
   such a patch scores 0, so no patch can weaken a test or hook the runner from a config file;
2. checks out the base tree (:func:`~agentrl.envs.swe.workspace.checkout`), applies the patch
   (``git apply``, then ``patch --fuzz=5`` as SWE-bench falls back to), and only then
   ``test_patch``;
3. records the sha256 of every protected file, runs exactly the ``FAIL_TO_PASS`` and
   ``PASS_TO_PASS`` tests with the project's test command, a reporting plugin that writes each
   test's outcome to a file with a random name that the code under test is never told (the
   plugin reads it from a file it deletes before any project code runs), and ``-rA``;
4. scores 1 only when all of these agree: every required test passed by the plugin's report,
   every one reported ``PASSED`` by the ``swebench`` package's ``parse_log_pytest`` on the output,
   the runner exited 0, the report was written at the session's end (a runner killed or exited
   early writes none), and the protected files are unchanged after the run.

A patch that prints fake ``PASSED`` lines (even past pytest's capture, to the real output) and
ends the runner with status 0 fails on the missing report, and cannot write one itself because it
cannot learn its path; a patch that lets the tests fail fails on the report and the exit code; one
that edits the tests fails in step 1 (or on the hashes, if it rewrites them at run time); one that
kills the runner fails on the missing report. Not covered: code that goes after the grader inside
the test process (patches pytest's reporting, or finds the plugin's module and its report path):
it can forge the report, the output and the exit code alike, and no check made from the same
process can see through that.

Infrastructure failures (no sandbox, a base tree that does not rebuild, a ``test_patch`` that does
not apply on a patch that left the test files alone) give :attr:`SWEGrade.infra_error`, never a 0.
A sandbox that dies while the tests run counts as a failed run, as in Code-v0: the patch can cause
that (a fork bomb, memory exhaustion).
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from agentrl.envs.swe.instances import SWEInstance
from agentrl.envs.swe.workspace import REPO_DIR, WorkspaceError, checkout
from agentrl.tools.sandbox import Sandbox, SandboxCrashed, SandboxError
from agentrl.tools.sandbox_pool import SandboxFactory

MAX_PATCH_BYTES = 1 << 20
"""A larger patch scores 0 without being run."""

_PLUGIN = Path(__file__).parent / "taskgen" / "agentrl_taskgen_report.py"
_PLUGIN_NAME = "agentrl_taskgen_report"
_CONFIG_FILES = frozenset({"pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "conftest.py"})
_STARTUP_FILES = frozenset({"sitecustomize.py", "usercustomize.py"})
_DIFF_PATHS = re.compile(r"^diff --git a/(.+?) b/(.+?)$", re.MULTILINE)
_OLD_NEW_PATHS = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(.+?)(?:\t.*)?$", re.MULTILINE)
_MAX_LOG_BYTES = 8 << 20


@dataclass(frozen=True)
class SWEGrade:
    """The verdict on one patch."""

    resolved: bool
    """Every FAIL_TO_PASS and PASS_TO_PASS test passed, on every piece of evidence."""
    fail_to_pass: tuple[int, int] = (0, 0)
    """(passed, total) of FAIL_TO_PASS."""
    pass_to_pass: tuple[int, int] = (0, 0)
    """(passed, total) of PASS_TO_PASS."""
    reason: str = ""
    """Why the patch did not resolve the instance (empty when it did)."""
    infra_error: str | None = None
    """Set when the patch could not be judged; then ``resolved`` means nothing."""
    outcomes: dict[str, str] = field(default_factory=dict, repr=False)
    """Each required test's outcome in the plugin's report (``missing`` when absent)."""
    log_tail: str = field(default="", repr=False)
    """The end of the test run's output."""

    def info(self) -> dict[str, Any]:
        """The step-info entries of this grade."""
        return {
            "resolved": self.resolved,
            "fail_to_pass_passed": self.fail_to_pass[0],
            "fail_to_pass_total": self.fail_to_pass[1],
            "pass_to_pass_passed": self.pass_to_pass[0],
            "pass_to_pass_total": self.pass_to_pass[1],
            "grading_reason": self.reason,
        }


def protected_paths(instance: SWEInstance) -> set[str]:
    """The files a patch may not touch: those of ``test_patch`` and of the graded tests."""
    paths = set(_diff_paths(instance.test_patch))
    for test in (*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS):
        paths.add(test.split("::", 1)[0])
    return paths


def touched_protected(patch: str, instance: SWEInstance) -> list[str]:
    """The protected files ``patch`` touches (see the module docstring), sorted."""
    protected = protected_paths(instance)
    hits = set()
    for path in _diff_paths(patch):
        name = PurePosixPath(path).name
        if (
            path in protected
            or name in _CONFIG_FILES
            or name in _STARTUP_FILES
            or name.endswith(".pth")
        ):
            hits.add(path)
    return sorted(hits)


async def grade(
    instance: SWEInstance,
    patch: str,
    *,
    sandboxes: SandboxFactory,
    archive: bytes,
    test_command: str,
    test_env: dict[str, str],
    timeout: float = 600.0,
) -> SWEGrade:
    """Grade ``patch`` (a git diff against ``base_commit``) for ``instance``; see the module
    docstring. ``archive`` is the base tree (:class:`~agentrl.envs.swe.workspace.BaseTrees`),
    ``sandboxes`` starts the fresh grading sandbox, ``timeout`` bounds the test run."""
    if len(patch.encode()) > MAX_PATCH_BYTES:
        return _unresolved(instance, reason=f"the patch is larger than {MAX_PATCH_BYTES} bytes")
    touched = touched_protected(patch, instance)
    if touched:
        return _unresolved(
            instance, reason=f"the patch changes test or runner files: {', '.join(touched)}"
        )
    try:
        sandbox = await sandboxes()
    except Exception as exc:
        return _unresolved(instance, infra_error=f"no grading sandbox: {exc}")
    try:
        return await _grade_in(sandbox, instance, patch, archive, test_command, test_env, timeout)
    finally:
        await sandbox.close()


async def _grade_in(
    sandbox: Sandbox,
    instance: SWEInstance,
    patch: str,
    archive: bytes,
    test_command: str,
    test_env: dict[str, str],
    timeout: float,
) -> SWEGrade:
    f2p, p2p = instance.FAIL_TO_PASS, instance.PASS_TO_PASS
    nonce = secrets.token_hex(8)
    scratch = f"/tmp/agentrl-grader-{nonce}"
    try:
        await checkout(sandbox, instance, archive)
    except (WorkspaceError, SandboxError) as exc:
        return _unresolved(instance, infra_error=f"the base tree: {exc}")
    try:
        if patch.strip():
            await sandbox.write_file(f"{scratch}/model.patch", patch)
            applied = await _apply(sandbox, f"{scratch}/model.patch")
            if not applied:
                return _unresolved(instance, reason="the patch does not apply to base_commit")
        if instance.test_patch:
            await sandbox.write_file(f"{scratch}/test.patch", instance.test_patch)
            if not await _apply(sandbox, f"{scratch}/test.patch", fuzzy=False):
                return _unresolved(instance, infra_error="test_patch does not apply")
        guarded = sorted(protected_paths(instance))
        before = await _hashes(sandbox, guarded)
        await sandbox.write_file(f"{scratch}/{_PLUGIN_NAME}.py", _PLUGIN.read_bytes())
        report_path = f"{scratch}/report-{secrets.token_hex(8)}.json"
        # The path goes through a file the plugin deletes as it loads: the environment and
        # /proc/self/environ show the code under test only that deleted file's name.
        await sandbox.write_file(f"{scratch}/where", report_path)
        env = {**test_env, "PYTHONPATH": scratch, "AGENTRL_TASKGEN_REPORT_FILE": f"{scratch}/where"}
        argv = [
            "env",
            *(f"{key}={value}" for key, value in env.items()),
            *shlex.split(test_command),
            "-p",
            _PLUGIN_NAME,
            *f2p,
            *p2p,
        ]
        run = await sandbox.exec(
            ["sh", "-c", f'cd {REPO_DIR} && exec "$@"', "sh", *argv],
            timeout=timeout,
            max_output_bytes=_MAX_LOG_BYTES,
        )
        after = await _hashes(sandbox, guarded)
        report = await _read_report(sandbox, report_path)
    except SandboxCrashed as exc:
        return _unresolved(instance, reason=f"the sandbox died while the tests ran: {exc}")
    except SandboxError as exc:
        return _unresolved(instance, infra_error=f"grading failed: {exc}")
    log = run.stdout + run.stderr
    outcomes = {test: report.get(test, "missing") for test in (*f2p, *p2p)} if report else {}
    reason = _verdict(
        run.exit_code, run.timed_out, run.truncated, report, outcomes, log, before, after
    )
    return SWEGrade(
        not reason,
        fail_to_pass=(sum(outcomes.get(t) == "passed" for t in f2p), len(f2p)),
        pass_to_pass=(sum(outcomes.get(t) == "passed" for t in p2p), len(p2p)),
        reason=reason,
        outcomes=outcomes,
        log_tail=log[-4000:],
    )


def _unresolved(
    instance: SWEInstance, *, reason: str = "", infra_error: str | None = None
) -> SWEGrade:
    """A grade with nothing passed: the patch was refused, or the run never happened."""
    return SWEGrade(
        False,
        fail_to_pass=(0, len(instance.FAIL_TO_PASS)),
        pass_to_pass=(0, len(instance.PASS_TO_PASS)),
        reason=reason,
        infra_error=infra_error,
    )


def _verdict(
    exit_code: int | None,
    timed_out: bool,
    truncated: bool,
    report: dict[str, str] | None,
    outcomes: dict[str, str],
    log: str,
    before: dict[str, str],
    after: dict[str, str],
) -> str:
    """Why the run does not resolve the instance, or ``""``."""
    if timed_out:
        return "the test run timed out"
    if before != after:
        changed = sorted(
            path for path in before.keys() | after.keys() if before.get(path) != after.get(path)
        )
        return f"test files changed while the tests ran: {', '.join(changed)}"
    if report is None:
        return f"the test run ended without its report (exit code {exit_code}): the runner was killed or exited early"
    failing = sorted(test for test, outcome in outcomes.items() if outcome != "passed")
    if failing:
        shown = ", ".join(f"{test} ({outcomes[test]})" for test in failing[:5])
        more = f" and {len(failing) - 5} more" if len(failing) > 5 else ""
        return f"{len(failing)} required test(s) did not pass: {shown}{more}"
    if truncated:
        return "the test output was too long to check"
    printed = _parse_log(log)
    unconfirmed = [test for test in outcomes if printed.get(test.split()[0]) != "PASSED"]
    if unconfirmed:
        return f"the runner's output does not show {unconfirmed[0]} as PASSED"
    if exit_code != 0:
        return f"the runner exited with {exit_code} although every required test passed"
    return ""


def _parse_log(log: str) -> dict[str, str]:
    """``swebench``'s pytest log parser (the package is this environment's dependency)."""
    try:
        from swebench.harness.log_parsers.python import parse_log_pytest
    except ImportError as exc:  # pragma: no cover - a broken install
        raise RuntimeError(
            "agentrl/SWE-v0 grades with the swebench package's log parsers: "
            "pip install 'agentrl[swe]'"
        ) from exc
    return parse_log_pytest(log, None)


async def _apply(sandbox: Sandbox, patch_file: str, *, fuzzy: bool = True) -> bool:
    """``git apply`` the patch in the repository; with ``fuzzy``, ``patch --fuzz=5`` as a fallback
    (SWE-bench's order)."""
    commands = [f"git apply --whitespace=nowarn {patch_file}"]
    if fuzzy:
        commands.append(f"patch --batch --fuzz=5 -p1 -i {patch_file}")
    for command in commands:
        result = await sandbox.exec(["sh", "-c", f"cd {REPO_DIR} && {command}"], timeout=60)
        if result.exit_code == 0:
            return True
    return False


async def _hashes(sandbox: Sandbox, paths: list[str]) -> dict[str, str]:
    """sha256 of each of ``paths`` in the repository (``"absent"`` for a missing one)."""
    script = (
        f'cd {REPO_DIR} && for f in "$@"; do '
        'if [ -f "$f" ]; then printf "%s\\t" "$f"; sha256sum < "$f" | cut -d" " -f1; '
        'else printf "%s\\tabsent\\n" "$f"; fi; done'
    )
    result = await sandbox.exec(["sh", "-c", script, "sh", *paths], timeout=60)
    hashes = {}
    for line in result.stdout.splitlines():
        path, _, digest = line.rpartition("\t")
        hashes[path] = digest
    return hashes


async def _read_report(sandbox: Sandbox, path: str) -> dict[str, str] | None:
    try:
        data = await sandbox.read_file(path, max_bytes=64 << 20)
    except SandboxCrashed:
        raise
    except SandboxError:
        return None
    try:
        outcomes = json.loads(data)["outcomes"]
    except (ValueError, KeyError, TypeError):
        return None
    return outcomes if isinstance(outcomes, dict) else None


def _diff_paths(diff: str) -> list[str]:
    """Every path a git or unified diff names (old and new), without ``a/``/``b/``."""
    paths: set[str] = set()
    for old, new in _DIFF_PATHS.findall(diff):
        paths.update((old, new))
    for path in _OLD_NEW_PATHS.findall(diff):
        if path != "/dev/null":
            paths.add(path)
    return sorted(paths)
