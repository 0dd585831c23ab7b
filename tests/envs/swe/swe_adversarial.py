"""Patches that try to score without fixing the bug, built for any generated instance."""

from __future__ import annotations

import difflib
from pathlib import Path

from agentrl.envs.swe.instances import SWEInstance
from agentrl.envs.swe.repo import build_base_tree, git_apply


def base_tree(instance: SWEInstance, sdist: Path, dest: Path) -> Path:
    build_base_tree(sdist, instance, dest)
    return dest


def diff(path: str, old: str | None, new: str) -> str:
    """A git-style diff that changes (or, with ``old=None``, creates) ``path``."""
    before = (old or "").splitlines(keepends=True)
    after = new.splitlines(keepends=True)
    header = f"diff --git a/{path} b/{path}\n"
    if old is None:
        header += "new file mode 100644\n"
    lines = difflib.unified_diff(
        before, after, "/dev/null" if old is None else f"a/{path}", f"b/{path}"
    )
    return header + "".join(lines)


def fake_output(instance: SWEInstance, tree: Path) -> str:
    """The buggy source, when imported, writes a report of all tests passed wherever a report
    path in its environment points, prints PASSED for every graded test and a pytest summary, then
    ends the runner with exit status 0 before any test runs."""
    path = _source(instance)
    old = (tree / path).read_text()
    tests = [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]
    banner = f"========== {len(tests)} passed in 0.01s =========="
    payload = (
        "\nimport json as _json, os as _os\n"
        "for _key, _value in _os.environ.items():\n"
        "    if 'REPORT' in _key:\n"
        f"        _outcomes = {{_t: 'passed' for _t in {tests!r}}}\n"
        "        _report = {'exitstatus': 0, 'outcomes': _outcomes, 'failures': {},\n"
        "                   'collect_errors': [], 'lines': {}}\n"
        "        open(_value, 'w').write(_json.dumps(_report))\n"
        "import stat as _stat\n"
        f"_lines = ''.join('PASSED ' + _t + chr(10) for _t in {tests!r})\n"
        f"_lines += {banner!r} + chr(10)\n"
        "for _fd in range(1, 64):  # pytest captures fd 1: find the real output among the pipes\n"
        "    try:\n"
        "        if _stat.S_ISFIFO(_os.fstat(_fd).st_mode):\n"
        "            _os.write(_fd, _lines.encode())\n"
        "    except OSError:\n"
        "        pass\n"
        "_os._exit(0)\n"
    )
    return diff(path, old, old + payload)


def rewrite_tests_at_run_time(instance: SWEInstance, tree: Path) -> str:
    """The buggy source, when imported, rewrites the graded test files so that every assertion
    holds (the patch itself touches no test file)."""
    path = _source(instance)
    old = (tree / path).read_text()
    files = sorted({test.split("::")[0] for test in instance.FAIL_TO_PASS})
    payload = (
        "\nimport os as _os\n"
        f"for _name in {files!r}:\n"
        "    _path = _os.path.join(_os.getcwd(), _name)\n"
        "    if _os.path.exists(_path):\n"
        "        _text = open(_path).read().replace('assert ', 'assert True or ')\n"
        "        _text += '\\n# rewritten by the code under test\\n'\n"
        "        open(_path, 'w').write(_text)\n"
    )
    return diff(path, old, old + payload)


def edit_tests(instance: SWEInstance, tree: Path) -> str:
    """The gold fix, plus an edit of the file that holds the first FAIL_TO_PASS test (created when
    it is hidden, as ``test_patch`` would)."""
    path = instance.FAIL_TO_PASS[0].split("::")[0]
    target = tree / path
    old = target.read_text() if target.exists() else None
    return instance.patch + diff(path, old, (old or "") + "\ndef test_nothing():\n    pass\n")


def conftest_hook(instance: SWEInstance, tree: Path) -> str:
    """A new conftest.py whose hook reports every test as passed."""
    hook = (
        "import pytest\n\n\n"
        "@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n"
        "    report = outcome.get_result()\n"
        "    report.outcome = 'passed'\n"
    )
    return diff("conftest.py", None, hook)


def fixed_source(instance: SWEInstance, tree: Path, scratch: Path) -> str:
    """The changed source file as the gold patch leaves it (the fix an agent must not find)."""
    copy = scratch / "fixed"
    copy.mkdir()
    path = _source(instance)
    (copy / path).parent.mkdir(parents=True, exist_ok=True)
    (copy / path).write_text((tree / path).read_text())
    git_apply(copy, _only(instance.patch, path))
    return (copy / path).read_text()


def _source(instance: SWEInstance) -> str:
    assert instance.agentrl_taskgen is not None
    return instance.agentrl_taskgen.file


def _only(patch: str, path: str) -> str:
    """The part of a git diff that changes ``path``."""
    parts = patch.split("diff --git ")
    return "".join("diff --git " + p for p in parts[1:] if p.startswith(f"a/{path} "))
