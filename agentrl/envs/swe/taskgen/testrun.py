"""Running a project's test suite and reading each test's outcome.

The suite runs as ``TEST_COMMAND`` (with ``TEST_ENV``: no third-party pytest plugins, no bytecode
files written into the tree; node ids relative to the tree's root whatever files are selected), the
command a task's environment runs too, plus the small plugin
``agentrl_taskgen_report`` that writes every test's outcome, keyed by its pytest node id, and the
failing statement and exception of each failed test to a JSON file. Outcomes come from that file,
not from parsing printed text; a run that produced no file, or timed out, raises
:class:`SuiteError`.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TEST_COMMAND = "python3 -m pytest -q -p no:cacheprovider -rA --rootdir=."
TEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
_PLUGIN = "agentrl_taskgen_report"


class SuiteError(RuntimeError):
    """The suite did not run to the end (timeout, crash before reporting)."""


@dataclass(frozen=True)
class Failure:
    """How one test failed, from pytest's exception info."""

    statement: str | None
    """The statement of the test function that raised (or called what raised), if known."""
    exception: str
    """The exception as pytest prints its last line(s), e.g. ``"AssertionError: assert 1 == 2"``."""
    output: str = ""
    """What the test printed to stdout (its end, when long)."""


@dataclass(frozen=True)
class SuiteRun:
    """One run of a suite."""

    outcomes: dict[str, str]
    """Node id -> passed, failed, error, skipped, xfail or xpass."""
    failures: dict[str, Failure]
    """Node id -> how it failed (failed and error outcomes)."""
    collect_errors: list[str]
    """Node ids (files, mostly) that failed to collect."""
    exitstatus: int
    seconds: float
    lines: dict[str, dict[str, list[int]]]
    """With ``trace``: node id ("" outside tests) -> real path of a traced file -> lines run."""

    @property
    def passed(self) -> set[str]:
        return {test for test, outcome in self.outcomes.items() if outcome == "passed"}


class SuiteRunner:
    """Runs suites with the interpreter ``python`` (which must have pytest), ``timeout`` seconds
    at most per run. Use as a context manager: it owns a temporary directory for the plugin."""

    def __init__(self, python: str, timeout: float) -> None:
        self.python = python
        self.timeout = timeout
        self._dir = Path(tempfile.mkdtemp(prefix="agentrl-taskgen-"))
        shutil.copy(Path(__file__).with_name(f"{_PLUGIN}.py"), self._dir)

    def __enter__(self) -> SuiteRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    def run(
        self,
        tree: Path,
        *,
        files: list[str] | None = None,
        maxfail: int | None = None,
        trace: list[Path] | None = None,
        explain: bool = True,
    ) -> SuiteRun:
        """Run the suite in ``tree`` (a directory the run may write into): the whole suite, or
        the test ``files`` (relative paths). With ``maxfail``, pytest stops after that many
        failures and errors (later tests then have no outcome); with ``trace``, the lines each
        test runs in those files are recorded. ``explain=False`` turns off pytest's assertion
        rewriting (``--assert=plain``): failures then have no expected/actual explanation, but
        runs with failing tests go much faster (pytest diffs long strings slowly)."""
        report = Path(tempfile.mkstemp(prefix="report-", suffix=".json", dir=self._dir)[1])
        command = [self.python, *shlex.split(TEST_COMMAND)[1:], "--tb=short", "-p", _PLUGIN]
        if maxfail is not None:
            command.append(f"--maxfail={maxfail}")
        if not explain:
            command.append("--assert=plain")
        command += files or []
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")},
            **TEST_ENV,
            "PYTHONPATH": str(self._dir),
            "AGENTRL_TASKGEN_REPORT": str(report),
        }
        if trace:
            env["AGENTRL_TASKGEN_TRACE"] = os.pathsep.join(str(path) for path in trace)
        start = time.monotonic()
        process = subprocess.Popen(
            command,
            cwd=tree,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            report.unlink()
            raise SuiteError(f"the suite in {tree} ran past {self.timeout:.0f} s") from None
        seconds = time.monotonic() - start
        try:
            data = json.loads(report.read_text() or "null")
        finally:
            report.unlink()
        if not data:
            tail = output.decode(errors="replace")[-2000:]
            raise SuiteError(f"the suite in {tree} exited {process.returncode} unfinished:\n{tail}")
        return SuiteRun(
            outcomes=data["outcomes"],
            failures={test: Failure(**failure) for test, failure in data["failures"].items()},
            collect_errors=data["collect_errors"],
            exitstatus=data["exitstatus"],
            seconds=seconds,
            lines=data["lines"],
        )
