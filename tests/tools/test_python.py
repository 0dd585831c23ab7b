"""run_python: one test per promised property (output, exit code, timeout, no orphans, output cap)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from agentrl.tools import python_tool, run_python

pytestmark = pytest.mark.slow  # starts processes


def spawn_sleeper(marker: str, then: str) -> str:
    """Code that starts a grandchild sleeping for 300 s (``marker`` in its argv), prints its pid,
    then runs ``then``."""
    return (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', "
        f"{marker!r}])\n"
        "print(child.pid, flush=True)\n"
        f"{then}\n"
    )


def running(pid: int) -> bool:
    """True if ``pid`` is a live process (zombies, which have exited, do not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and marker.encode() in cmdline and running(int(entry.name)):
            found.append(int(entry.name))
    return found


async def test_stdout_stderr_and_exit_code() -> None:
    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)"
    result = await run_python(code)
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert not result.timed_out and not result.truncated
    assert 0 < result.duration_s < 10


async def test_exceptions_and_syntax_errors_are_results() -> None:
    raised = await run_python("1 / 0")
    assert raised.exit_code == 1 and "ZeroDivisionError" in raised.stderr
    broken = await run_python("def (:")
    assert broken.exit_code == 1 and "SyntaxError" in broken.stderr
    surrogate = await run_python("print('\ud800')")
    assert surrogate.exit_code == 1 and "SyntaxError" in surrogate.stderr


async def test_long_code_is_not_passed_on_the_command_line() -> None:
    code = "x = 0\n" + "x += 1\n" * 200_000 + "print(x)"  # 1.4 MB, beyond one argv string's limit
    assert (await run_python(code, timeout=30)).stdout == "200000\n"


async def test_fresh_interpreter_in_a_temporary_directory_with_a_trimmed_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    code = (
        "import os, sys\n"
        "open('made.txt', 'w').write('x')\n"
        "print(os.getcwd()); print(sys.flags.isolated); print(sorted(os.environ))"
    )
    result = await run_python(code)
    workdir, isolated, environment = result.stdout.splitlines()
    assert isolated == "1"
    assert "AGENTRL_TEST_SECRET" not in environment
    assert Path(workdir).name.startswith("agentrl-python-")
    assert not Path(workdir).exists()


async def test_non_utf8_output_is_decoded_with_replacement() -> None:
    result = await run_python("import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe')")
    assert result.stdout == "ok \ufffd\ufffd"


async def test_timeout_kills_the_process_and_its_children() -> None:
    marker = f"agentrl-orphan-{uuid.uuid4()}"
    result = await run_python(spawn_sleeper(marker, "time.sleep(300)"), timeout=1.5)
    assert result.timed_out and result.exit_code is None
    assert 1.5 <= result.duration_s < 5
    grandchild = int(result.stdout)
    assert not running(grandchild)
    assert processes_with(marker) == []


async def test_children_left_behind_by_a_finished_run_are_killed() -> None:
    marker = f"agentrl-orphan-{uuid.uuid4()}"
    result = await run_python(spawn_sleeper(marker, "print('bye')"), timeout=20)
    assert result.exit_code == 0 and not result.timed_out
    assert result.stdout.endswith("bye\n")
    assert result.duration_s < 10  # did not wait for the sleeper's pipes until the timeout
    assert not running(int(result.stdout.split()[0]))
    assert processes_with(marker) == []


async def test_a_process_that_leaves_the_group_survives_but_does_not_hang_the_call() -> None:
    # Documented limit: setsid escapes the group kill. The call still returns after the grace.
    marker = f"agentrl-escaped-{uuid.uuid4()}"
    code = spawn_sleeper(marker, "print('bye')").replace("])", "], start_new_session=True)")
    result = await run_python(code, timeout=20)
    escaped = int(result.stdout.split()[0])
    try:
        assert result.exit_code == 0 and result.stdout.endswith("bye\n")
        assert result.duration_s < 5
        assert running(escaped)
    finally:
        os.kill(escaped, signal.SIGKILL)


async def test_cancelling_the_call_kills_the_process_group() -> None:
    marker = f"agentrl-orphan-{uuid.uuid4()}"
    task = asyncio.create_task(run_python(spawn_sleeper(marker, "time.sleep(300)"), timeout=60))
    deadline = time.monotonic() + 10
    while not processes_with(marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert processes_with(marker), "the grandchild never started"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert processes_with(marker) == []


async def test_huge_output_is_capped_and_marked_while_the_child_runs_to_completion() -> None:
    code = (
        "import sys\n"
        "sys.stdout.write('o' * 20_000_000)\n"
        "sys.stderr.write('e' * 20_000_000)\n"
        "sys.stdout.write('END')"
    )
    result = await run_python(code, max_output_bytes=1000, timeout=30)
    assert result.exit_code == 0 and not result.timed_out
    assert (result.stdout, result.stderr) == ("o" * 1000, "e" * 1000)
    assert result.truncated


@pytest.mark.parametrize(("size", "truncated"), [(100, False), (101, True)])
async def test_truncation_boundary(size: int, truncated: bool) -> None:
    result = await run_python(f"print('x' * {size - 1})", max_output_bytes=100)
    assert len(result.stdout) == min(size, 100)
    assert result.truncated is truncated


async def test_concurrent_runs_are_independent_and_overlap() -> None:
    started = time.monotonic()
    results = await asyncio.gather(
        *(run_python(f"import time; time.sleep(1); print({i})") for i in range(4))
    )
    assert [result.stdout for result in results] == ["0\n", "1\n", "2\n", "3\n"]
    assert time.monotonic() - started < 3.5  # one after the other would take over 4 s


async def test_invalid_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout"):
        await run_python("", timeout=0)
    with pytest.raises(ValueError, match="max_output_bytes"):
        await run_python("", max_output_bytes=-1)


async def test_python_tool_reports_output_exit_code_and_limits() -> None:
    tool = python_tool(timeout=1, max_output_bytes=50)
    assert tool.name == "python"
    assert tool.parameters["required"] == ["code"]
    assert "Time limit: 1 s" in tool.description
    failing = "import sys; print('hi'); sys.stderr.write('oops'); sys.exit(2)"
    assert await tool.acall({"code": failing}) == "hi\noops\n[exit code 2]"
    assert await tool.acall({"code": "pass"}) == ""
    assert await tool.acall({"code": "print('x' * 60)"}) == (
        "x" * 50 + "\n[output truncated to 50 bytes]"
    )
    assert await tool.acall({"code": "print('start', flush=True)\nwhile True: pass"}) == (
        "start\n[timed out after 1 s]"
    )
