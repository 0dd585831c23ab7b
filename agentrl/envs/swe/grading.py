"""Grading a SWE patch like SWE-bench's harness, and stricter.

:func:`grade` takes the agent's diff and, in a **fresh sandbox** from the project's image, in three
phases (the *phase* decides who a fault is blamed on, below):

**Setup** (nothing of the patch is in the sandbox yet):

1. checks out the base tree (:func:`~agentrl.envs.swe.workspace.checkout`) and moves its ``.git``
   out of the repository, so the patch can reach neither the grader's git configuration, hooks
   nor objects; every git command of the grader reads only its own configuration;
2. saves the *graded files* (:func:`graded_files`: what ``test_patch`` touches, the files of the
   ``FAIL_TO_PASS``/``PASS_TO_PASS`` tests and every file beside them in their test directories)
   and the tree's ``conftest.py`` files (:mod:`~agentrl.envs.swe.tree_guard`);
3. applies ``test_patch`` and asks the installed pytest which rootdir and configuration file it
   chooses for the graded tests (:mod:`~agentrl.envs.swe.pytest_entry` ``--probe``), then reverts
   ``test_patch``;

**Patch** (the patch is applied; none of its code has run):

4. applies the patch (``git apply``, then ``patch --fuzz=5`` as SWE-bench falls back to);
5. puts the graded files, the configuration file and every ``conftest.py`` back as step 2 saved
   them (a ``conftest.py`` the patch added is removed), and refuses a tree holding a symbolic
   link or a ``.git`` entry the base tree did not have; then applies ``test_patch`` over them, as
   SWE-bench does after resetting the test files to ``base_commit``. A patch that edits or
   re-creates a test file (an honest reproduction test where the hidden test goes, say) is
   therefore graded, not refused, and cannot weaken a graded test;

**Tests** (the patch's code runs):

6. records the sha256 of every graded file and runs exactly the ``FAIL_TO_PASS`` and
   ``PASS_TO_PASS`` tests with the project's test command, started through
   :mod:`~agentrl.envs.swe.pytest_entry`: pytest and the report plugin come from the image, not
   from anything the repository can shadow (its directory is appended to ``sys.path``, never put
   first); the configuration is the file step 3 found (``-c``, so pytest reads no other),
   ``--import-mode=append``, plugin autoloading off. The reporting plugin writes each test's
   outcome to a file with a random name that the code under test is never told (the plugin reads
   it from a file it deletes before any project code runs); ``-rA`` prints the outcomes too;
7. scores 1 only when all of these agree: every required test passed by the plugin's report,
   every one reported ``PASSED`` by the ``swebench`` package's ``parse_log_pytest`` on the output,
   the runner exited 0, the report was written at the session's end (a runner killed or exited
   early writes none), and the graded files are unchanged after the run.

A patch that prints fake ``PASSED`` lines (even past pytest's capture, to the real output) and
ends the runner with status 0 fails on the missing report, and cannot write one itself because it
cannot learn its path; a patch that lets the tests fail fails on the report and the exit code; one
that edits the tests or their configuration is undone in step 5 (and caught by the hashes, if it
rewrites them at run time); one that kills the runner fails on the missing report. The changed
paths are read by the grader in its own sandbox, never from the diff's text, so the agent's git
settings (prefixes, quoting, attributes) change nothing. Not covered: code that goes after the
grader inside the test process once the tests import it (patches pytest's reporting in memory, or
finds the plugin's module and its report path): it can forge the report, the output and the exit
code alike, and no check made from the same process can see through that.

**Who a fault is blamed on.** In the setup phase every sandbox failure is an infrastructure fault
(:attr:`SWEGrade.infra_error`, never a 0), and so is ``test_patch`` not applying to the base tree.
From the patch phase on, a lost sandbox (:class:`~agentrl.tools.SandboxLost`: its host or engine
went away, which nothing inside it can cause) is still an infrastructure fault; a sandbox that
dies (:class:`~agentrl.tools.SandboxCrashed`) counts against the patch, which can cause that (a
fork bomb, memory exhaustion, code that kills the sandbox's agent), and in the tests phase so does
any other sandbox failure (a process the tests left behind can exhaust the sandbox's limits).
"""

from __future__ import annotations

import io
import json
import re
import secrets
import shlex
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from agentrl.envs.swe import pytest_entry, tree_guard
from agentrl.envs.swe.instances import SWEInstance
from agentrl.envs.swe.workspace import REPO_DIR, WorkspaceError, checkout
from agentrl.tools.sandbox import Sandbox, SandboxCrashed, SandboxError, SandboxLost
from agentrl.tools.sandbox_pool import SandboxFactory

MAX_PATCH_BYTES = 1 << 20
"""A larger patch scores 0 without being run."""

_HERE = Path(__file__).parent
_PLUGIN = (_HERE / "taskgen" / "agentrl_taskgen_report.py").read_bytes()
_TREE_GUARD = Path(tree_guard.__file__).read_bytes()
_PYTEST_ENTRY = Path(pytest_entry.__file__).read_bytes()
_MAX_LOG_BYTES = 8 << 20
# The paths of ``test_patch`` (instance data, written by git with a/ and b/ prefixes).
_DIFF_PATHS = re.compile(r"^diff --git a/(.+?) b/(.+?)$", re.MULTILINE)
_OLD_NEW_PATHS = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(.+?)(?:\t.*)?$", re.MULTILINE)
# The grader's git: its own repository directory (moved out of the tree), no system or global
# configuration, no hooks, no fsmonitor.
GIT_ENV = "GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null"
GIT_OPTIONS = "-c core.hooksPath=/dev/null -c core.fsmonitor=false"


class GradingFault(Exception):
    """The patch could not be judged: an infrastructure fault (see the module docstring)."""


class _Refused(Exception):
    """The patch scores 0 for this reason, without its tests being run."""


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
    log: str = field(default="", repr=False)
    """The test run's output (stdout, then stderr); empty when the tests did not run."""
    exit_code: int | None = field(default=None, repr=False)
    """The test runner's exit status (None when it did not run or was killed)."""

    @property
    def log_tail(self) -> str:
        """The end of the test run's output."""
        return self.log[-4000:]

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

    def swebench_log(self) -> str:
        """The test run as SWE-bench's harness logs it (the output between its start and end
        markers, then the exit code), for ``swebench.harness.grading.get_logs_eval``."""
        from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE

        code = "" if self.exit_code is None else f"{TEST_EXIT_CODE}: {self.exit_code}\n"
        return f"{START_TEST_OUTPUT}\n{self.log}\n{END_TEST_OUTPUT}\n{code}"


def graded_files(instance: SWEInstance, base_files: set[str]) -> set[str]:
    """The files the grade depends on: those ``test_patch`` touches, those holding
    ``FAIL_TO_PASS``/``PASS_TO_PASS`` tests, and every file of ``base_files`` (the base tree's)
    in the directory of such a test file, unless that is the repository's root."""
    paths = set(_diff_paths(instance.test_patch))
    test_files = {
        test.split("::", 1)[0] for test in (*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS)
    }
    paths |= test_files
    directories = {PurePosixPath(path).parent for path in test_files} - {PurePosixPath(".")}
    paths |= {path for path in base_files if PurePosixPath(path).parent in directories}
    return paths


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
    try:
        python, runner_args = runner_command(test_command)
    except ValueError as exc:
        return _unresolved(instance, infra_error=str(exc))
    try:
        sandbox = await sandboxes()
    except Exception as exc:
        return _unresolved(instance, infra_error=f"no grading sandbox: {exc}")
    grading = _Grading(sandbox, instance, python, runner_args, test_env)
    try:
        return await grading.run(patch, archive, timeout)
    except GradingFault as exc:
        return _unresolved(instance, infra_error=str(exc))
    except _Refused as exc:
        return _unresolved(instance, reason=str(exc))
    finally:
        await sandbox.close()


def runner_command(test_command: str) -> tuple[str, list[str]]:
    """``(python, pytest options)`` of a project's test command (``python3 -m pytest ...`` or
    ``pytest ...``); SWE-v0 grades with pytest only."""
    argv = shlex.split(test_command)
    if argv[:1] and PurePosixPath(argv[0]).name == "pytest":
        return "python3", argv[1:]
    if argv[1:3] == ["-m", "pytest"]:
        return argv[0], argv[3:]
    raise ValueError(
        f"SWE-v0 grades with pytest: the test command must be `python3 -m pytest ...` or "
        f"`pytest ...`, not {test_command!r}"
    )


class _Grading:
    """One grading run in its sandbox (the phases of the module docstring)."""

    def __init__(
        self,
        sandbox: Sandbox,
        instance: SWEInstance,
        python: str,
        runner_args: list[str],
        test_env: dict[str, str],
    ):
        self.sandbox, self.instance = sandbox, instance
        self.python, self.runner_args, self.test_env = python, runner_args, test_env
        self.scratch = f"/tmp/agentrl-grader-{secrets.token_hex(8)}"
        self.tests = [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]
        self.phase = "setup"

    async def run(self, patch: str, archive: bytes, timeout: float) -> SWEGrade:
        try:
            graded, config = await self._setup(archive)
            self.phase = "patch"
            await self._apply_patch(patch)
            self.phase = "tests"
            return await self._run_tests(graded, config, timeout)
        except SandboxError as exc:
            raise self._blame(exc) from exc

    def _blame(self, exc: SandboxError) -> Exception:
        """The fault ``exc`` raised in the current phase, as the module docstring assigns it."""
        if self.phase == "setup" or isinstance(exc, SandboxLost):
            return GradingFault(f"grading failed ({self.phase} phase): {exc}")
        if self.phase == "patch" and not isinstance(exc, SandboxCrashed):
            return GradingFault(f"grading failed ({self.phase} phase): {exc}")
        return _Refused(f"the sandbox failed while the {self.phase} ran: {exc}")

    async def _setup(self, archive: bytes) -> tuple[list[str], list[str]]:
        """Steps 1-3: the base tree, the saved graded files, pytest's configuration."""
        try:
            await checkout(self.sandbox, self.instance, archive)
        except WorkspaceError as exc:
            raise GradingFault(f"the base tree: {exc}") from exc
        scratch = self.scratch
        await self._sh(f"mkdir -p {scratch}/config && mv {REPO_DIR}/.git {scratch}/git")
        for name, data in (
            ("tree_guard.py", _TREE_GUARD),
            ("pytest_entry.py", _PYTEST_ENTRY),
            (f"{pytest_entry.PLUGIN_MODULE}.py", _PLUGIN),
            ("config/pytest.ini", b""),
            ("test.patch", self.instance.test_patch.encode()),
        ):
            await self.sandbox.write_file(f"{scratch}/{name}", data)
        graded = sorted(graded_files(self.instance, _archive_files(archive)))
        await self._guard("save", *graded)
        has_test_patch = bool(self.instance.test_patch.strip())
        if has_test_patch and not await self._git_apply("test.patch"):
            raise GradingFault("test_patch does not apply to base_commit")
        config, inifile = await self._probe()
        if inifile is not None and inifile not in graded:
            await self._guard("save", inifile)  # the same in the base tree: test_patch left it
            graded.append(inifile)
        if has_test_patch and not await self._git_apply("test.patch", "-R"):
            raise GradingFault("test_patch does not revert")
        return graded, config

    async def _probe(self) -> tuple[list[str], str | None]:
        """pytest's options that fix its configuration to what the base tree (with
        ``test_patch``) gives, and the configuration file's path in the repository."""
        result = await self._exec(
            self._runner("--noconftest", *self.tests, probe=True), timeout=120
        )
        found = None
        for line in result.stdout.splitlines():
            if line.startswith(pytest_entry.PROBE_MARK):
                found = json.loads(line[len(pytest_entry.PROBE_MARK) :])
        if found is None:
            raise GradingFault(
                f"pytest would not start on the base tree (exit {result.exit_code}): "
                f"{(result.stdout + result.stderr).strip()[-1000:]}"
            )
        rootdir, inifile = found["rootdir"], found["inifile"]
        options = ["--rootdir", rootdir, "--import-mode=append"]
        if inifile is None:
            return [
                *options,
                "-c",
                f"{self.scratch}/config/pytest.ini",
                "--confcutdir",
                rootdir,
            ], None
        relative = PurePosixPath(inifile).relative_to(REPO_DIR).as_posix()
        return [*options, "-c", inifile], relative

    async def _apply_patch(self, patch: str) -> None:
        """Steps 4-5: the patch, the graded files put back, ``test_patch`` over them."""
        if patch.strip():
            await self.sandbox.write_file(f"{self.scratch}/model.patch", patch)
            if not await self._git_apply("model.patch", fuzzy=True):
                raise _Refused("the patch does not apply to base_commit")
        restored = json.loads((await self._guard("restore")).stdout)
        if "refused" in restored:
            raise _Refused(restored["refused"])
        if self.instance.test_patch.strip() and not await self._git_apply("test.patch"):
            raise _Refused("test_patch does not apply over the patch")

    async def _run_tests(self, graded: list[str], config: list[str], timeout: float) -> SWEGrade:
        """Steps 6-7."""
        before = await _hashes(self.sandbox, graded)
        report_path = f"{self.scratch}/report-{secrets.token_hex(8)}.json"
        # The path goes through a file the plugin deletes as it loads: the environment and
        # /proc/self/environ show the code under test only that deleted file's name.
        await self.sandbox.write_file(f"{self.scratch}/where", report_path)
        env = {
            **self.test_env,
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "AGENTRL_TASKGEN_REPORT_FILE": f"{self.scratch}/where",
        }
        argv = ["env", *(f"{key}={value}" for key, value in env.items())]
        argv += self._runner(*config, *self.tests)
        run = await self._exec(argv, timeout=timeout, max_output_bytes=_MAX_LOG_BYTES)
        after = await _hashes(self.sandbox, graded)
        report = await _read_report(self.sandbox, report_path)
        log = run.stdout + run.stderr
        f2p, p2p = self.instance.FAIL_TO_PASS, self.instance.PASS_TO_PASS
        outcomes = {test: report.get(test, "missing") for test in self.tests} if report else {}
        reason = _verdict(
            run.exit_code, run.timed_out, run.truncated, report, outcomes, log, before, after
        )
        return SWEGrade(
            not reason,
            fail_to_pass=(sum(outcomes.get(t) == "passed" for t in f2p), len(f2p)),
            pass_to_pass=(sum(outcomes.get(t) == "passed" for t in p2p), len(p2p)),
            reason=reason,
            outcomes=outcomes,
            log=log,
            exit_code=None if run.timed_out else run.exit_code,
        )

    def _runner(self, *args: str, probe: bool = False) -> list[str]:
        """The argv that starts pytest through :mod:`~agentrl.envs.swe.pytest_entry`."""
        scratch = self.scratch
        entry = [self.python, "-s", f"{scratch}/pytest_entry.py", REPO_DIR]
        plugin = f"{scratch}/{pytest_entry.PLUGIN_MODULE}.py"
        options = ["--probe"] if probe else []
        return [*entry, plugin, *options, "--", *self.runner_args, *args]

    async def _guard(self, command: str, *paths: str) -> Any:
        """Run :mod:`~agentrl.envs.swe.tree_guard` in the sandbox; its failure is a fault."""
        argv = ["python3", "-I", f"{self.scratch}/tree_guard.py", command, REPO_DIR]
        result = await self._exec([*argv, f"{self.scratch}/store", *paths], timeout=120)
        if result.exit_code != 0:
            message = f"tree_guard {command} failed: {result.stderr.strip()[-1000:]}"
            raise GradingFault(message) if self.phase == "setup" else _Refused(message)
        return result

    async def _git_apply(self, name: str, *flags: str, fuzzy: bool = False) -> bool:
        """Apply ``scratch/name`` in the repository; with ``fuzzy``, ``patch --fuzz=5`` as a
        fallback (SWE-bench's order)."""
        git = f"{GIT_ENV} git --git-dir={self.scratch}/git --work-tree=. {GIT_OPTIONS}"
        path = f"{self.scratch}/{name}"
        commands = [f"{git} apply --whitespace=nowarn {' '.join(flags)} {path}"]
        if fuzzy:
            commands.append(f"patch --batch --fuzz=5 -p1 -i {path}")
        for command in commands:
            if (await self._sh(command, check=False)).exit_code == 0:
                return True
        return False

    async def _sh(self, script: str, *, check: bool = True) -> Any:
        result = await self._exec(["sh", "-c", script], timeout=120)  # in REPO_DIR
        if check and result.exit_code != 0:
            raise GradingFault(f"`{script}` failed: {result.stderr.strip()[-1000:]}")
        return result

    async def _exec(self, argv: list[str], **kwargs: Any) -> Any:
        return await self.sandbox.exec(
            ["sh", "-c", f'cd {REPO_DIR} && exec "$@"', "sh", *argv], **kwargs
        )


def _archive_files(archive: bytes) -> set[str]:
    """The regular files of a base-tree archive, as paths relative to the tree."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {PurePosixPath(m.name).as_posix() for m in tar.getmembers() if m.isfile()}


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
