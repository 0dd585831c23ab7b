"""A pytest plugin that records each test's outcome and failure as JSON (stdlib only).

The task generator loads it with ``-p agentrl_taskgen_report`` from a directory on PYTHONPATH and
reads the file named by ``$AGENTRL_TASKGEN_REPORT`` when the session ends.
``$AGENTRL_TASKGEN_REPORT_FILE`` instead names a file that holds that path; the plugin reads and
deletes it when it is imported, before any conftest or project code runs, and takes both variables
out of ``os.environ``, so the code under test cannot learn where the report goes (SWE-v0's grading
uses this: a patch must not be able to write a report of its own). It works with pytest 7.2
(Debian bookworm's) through 9. Outcomes: ``passed``, ``failed``, ``error`` (setup or teardown
failed), ``skipped``, ``xfail``, ``xpass``; a test counts as passing only when ``passed``.

With ``$AGENTRL_TASKGEN_TRACE`` (absolute paths joined by ``os.pathsep``) it also records which
lines of those files each test executed (``sys.settrace``; threads started later included, child
processes not); lines run outside any test (imports during collection) are recorded under ``""``.
"""

import json
import os
import sys
import threading

_outcomes: dict[str, str] = {}
_failures: dict[str, dict[str, str | None]] = {}
_collect_errors: list[str] = []
_lines: dict[str, set[tuple[str, int]]] = {}
_current = [""]


def _take_report_path():
    path = os.environ.pop("AGENTRL_TASKGEN_REPORT", None)
    pointer = os.environ.pop("AGENTRL_TASKGEN_REPORT_FILE", None)
    if pointer:
        with open(pointer) as handle:
            path = handle.read().strip()
        os.unlink(pointer)
    return path


_REPORT_PATH = _take_report_path()


def pytest_configure(config):
    paths = os.environ.get("AGENTRL_TASKGEN_TRACE")
    if paths:
        _trace({os.path.realpath(path) for path in paths.split(os.pathsep)})


def _trace(wanted):
    known = {}

    def local(frame, event, arg):
        if event == "line":
            _lines.setdefault(_current[0], set()).add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def on_call(frame, event, arg):
        name = frame.f_code.co_filename
        if name not in known:
            known[name] = os.path.realpath(name) in wanted
        return local if known[name] else None

    threading.settrace(on_call)
    sys.settrace(on_call)


def pytest_runtest_logstart(nodeid, location):
    _current[0] = nodeid


def pytest_runtest_logfinish(nodeid, location):
    _current[0] = ""


def pytest_runtest_logreport(report):
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            outcome = "xfail" if report.skipped else "xpass"
        else:
            outcome = report.outcome
        if _outcomes.get(report.nodeid) != "error":
            _outcomes[report.nodeid] = outcome
    elif report.failed:
        _outcomes[report.nodeid] = "error"
    elif report.skipped and report.when == "setup":
        _outcomes[report.nodeid] = "xfail" if hasattr(report, "wasxfail") else "skipped"


def pytest_collectreport(report):
    if report.failed:
        _collect_errors.append(report.nodeid)


def pytest_exception_interact(node, call, report):
    """The failing statement of the test function itself and the exception, for bug reports."""
    if call.excinfo is None or not hasattr(node, "path") or node.nodeid in _failures:
        return
    test_file = str(node.path)
    statement = None
    for entry in call.excinfo.traceback:
        if str(entry.path) == test_file:
            try:
                statement = str(entry.statement).strip()
            except Exception:
                statement = None
    _failures[node.nodeid] = {
        "statement": statement,
        "exception": call.excinfo.exconly(),
        "output": report.capstdout[-4000:],
    }


def pytest_sessionfinish(session, exitstatus):
    sys.settrace(None)
    threading.settrace(None)
    lines = {}
    for nodeid, seen in _lines.items():
        per_file = lines.setdefault(nodeid, {})
        for filename, line in seen:
            per_file.setdefault(os.path.realpath(filename), []).append(line)
    if _REPORT_PATH is None:
        raise RuntimeError("agentrl_taskgen_report: no AGENTRL_TASKGEN_REPORT(_FILE) was given")
    with open(_REPORT_PATH, "w") as handle:
        json.dump(
            {
                "exitstatus": int(exitstatus),
                "outcomes": _outcomes,
                "failures": _failures,
                "collect_errors": _collect_errors,
                "lines": lines,
            },
            handle,
        )
