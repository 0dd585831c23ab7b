"""Run model-written Python in a separate interpreter process, with a time limit and an output cap.

What :func:`run_python` guarantees:

* The code runs in a fresh ``python -I -X utf8`` process (isolated mode: no ``PYTHON*`` variables,
  no user site-packages, no script directory on ``sys.path``), read from stdin, so code of any
  length works. Its working directory, ``HOME`` and ``TMPDIR`` are a new temporary directory that is
  deleted afterwards; its environment holds only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` (and
  ``LD_LIBRARY_PATH`` if set), so the parent's variables are not handed to it.
* It runs in its own session and process group. When it exits, or when ``timeout`` seconds pass,
  the whole group is killed with ``SIGKILL``, so subprocesses it started do not outlive the call.
* stdout and stderr are read concurrently; at most ``max_output_bytes`` of each are kept and the
  rest is read and discarded, so the child never blocks on a full pipe. Bytes are decoded as UTF-8
  with replacement characters.
* Cancelling the call kills the process group too.

What it does NOT isolate (a sandbox backend replaces this module for untrusted code):

* No filesystem isolation: the code can read and write every file the current user can.
* No network isolation, no memory, CPU or process-count limits: a fork bomb or a huge allocation
  affects the host.
* Processes that leave the process group (``setsid``, double fork into a new session) escape the
  kill; the call stops waiting for their output after a short grace period.
* No secret hiding beyond the trimmed environment: the code runs as the same user and can read
  ``/proc`` of its parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from agentrl.tools.sandbox import ExecResult
from agentrl.tools.sandbox_tools import result_text
from agentrl.tools.tool import Tool

# How long to wait for output after the kill: processes that escaped the group may hold the pipes.
_DRAIN_GRACE_S = 1.0


class _CappedBuffer:
    """Keeps the first ``limit`` bytes written to it and counts the rest as truncated."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.truncated = True
        self.data += chunk[: max(room, 0)]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


class _Collector(asyncio.SubprocessProtocol):
    """Receives the child's output as it arrives (so its pipes never fill) and its exit.

    ``exited`` is set when the child itself has exited, even while processes it started still
    hold its pipes open (``asyncio.subprocess.Process.wait`` would wait for those pipes too);
    ``finished`` is set once the child has exited and every pipe is closed.
    """

    def __init__(self, limit: int) -> None:
        self.output = {1: _CappedBuffer(limit), 2: _CappedBuffer(limit)}  # by file descriptor
        self.exited = asyncio.Event()
        self.finished = asyncio.Event()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.output[fd].add(data)

    def process_exited(self) -> None:
        self.exited.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.finished.set()


async def run_python(
    code: str, *, timeout: float = 10.0, max_output_bytes: int = 16_384
) -> ExecResult:
    """Run ``code`` in a new Python process for at most ``timeout`` seconds (see module docstring).

    Never raises for anything the code does (syntax errors, exceptions, crashes, timeouts all come
    back in the result); raises ``ValueError`` for a non-positive ``timeout`` or negative
    ``max_output_bytes`` and ``OSError`` if the interpreter cannot be started.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if max_output_bytes < 0:
        raise ValueError(f"max_output_bytes must be >= 0, got {max_output_bytes}")
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="agentrl-python-")
    try:
        transport, collector = await asyncio.get_running_loop().subprocess_exec(
            lambda: _Collector(max_output_bytes),
            sys.executable,
            "-I",
            "-X",
            "utf8",
            "-",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=_child_environment(workdir),
            start_new_session=True,
        )
        timed_out = False
        try:
            stdin = transport.get_pipe_transport(0)
            assert isinstance(stdin, asyncio.WriteTransport)
            # surrogatepass keeps lone surrogates as invalid bytes: Python reports a SyntaxError.
            stdin.write(code.encode("utf-8", errors="surrogatepass"))
            stdin.close()  # flushes the buffered code, then closes; the child reads it to EOF
            try:
                await asyncio.wait_for(collector.exited.wait(), timeout)
            except TimeoutError:
                timed_out = True
        finally:
            # On exit, timeout and cancellation alike: nothing left in the group survives.
            _kill_group(transport.get_pid())
            await collector.exited.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(collector.finished.wait(), _DRAIN_GRACE_S)
            transport.close()
    finally:
        await asyncio.to_thread(shutil.rmtree, workdir, ignore_errors=True)
    stdout, stderr = collector.output[1], collector.output[2]
    return ExecResult(
        exit_code=None if timed_out else transport.get_returncode(),
        stdout=stdout.text(),
        stderr=stderr.text(),
        timed_out=timed_out,
        truncated=stdout.truncated or stderr.truncated,
        duration_s=time.monotonic() - started,
    )


def python_tool(*, timeout: float = 10.0, max_output_bytes: int = 16_384) -> Tool:
    """A :class:`Tool` named ``"python"`` with one argument ``code: str`` that runs ``run_python``.

    Its result is the stdout, then the stderr (if any), then one line per condition:
    ``[exit code N]`` when the exit code is non-zero, ``[timed out after N s]``, and
    ``[output truncated to N bytes]``. A run with no output and exit code 0 gives ``""``.
    """

    async def python(code: str) -> str:
        """Run a Python program.

        Args:
            code: The complete program. Only what it prints is returned; use print().
        """
        result = await run_python(code, timeout=timeout, max_output_bytes=max_output_bytes)
        return result_text(result, timeout=timeout, max_output_bytes=max_output_bytes)

    description = (
        "Run a Python program in a fresh interpreter and return its printed output (stdout, then "
        f"stderr) and its exit code if non-zero. Nothing persists between calls. Time limit: "
        f"{timeout:g} s; output is cut after {max_output_bytes} bytes per stream."
    )
    return Tool.from_function(python, description=description)


def _kill_group(pgid: int) -> None:
    # The group id is the child's pid (start_new_session); Linux does not reuse a pid while it
    # still names a process group, so this cannot reach an unrelated group while members remain.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _child_environment(workdir: str) -> dict[str, str]:
    environment = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
    }
    if "LD_LIBRARY_PATH" in os.environ:
        environment["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return environment
