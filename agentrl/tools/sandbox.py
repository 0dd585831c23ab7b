"""The sandbox protocol: run commands and Python, read and write files, inside an isolated box.

A :class:`Sandbox` is an async context manager around one live session with the agent program
(:mod:`agentrl.tools.sandbox_agent`) running inside the box. Every backend (containers in
:mod:`agentrl.tools.container`, bubblewrap in :mod:`agentrl.tools.bwrap`) starts that agent and
hands its stdin/stdout here; the calls below are the same for all of them:

* ``await sandbox.exec(cmd, timeout=, stdin=)`` -- a shell command (``str``) or argv (``list``).
* ``await sandbox.run_python(code, timeout=)`` -- code in a persistent interpreter: globals live
  across calls until the interpreter times out or dies (``result.restarted`` says so).
* ``await sandbox.write_file(path, data)`` / ``await sandbox.read_file(path)`` -- relative paths
  are under the work directory :attr:`Sandbox.workdir`.
* ``await sandbox.close()`` -- idempotent; the box and every process in it are gone afterwards.

Output is capped at ``max_output_bytes`` per stream (default :data:`DEFAULT_MAX_OUTPUT_BYTES`);
``result.truncated`` marks a cut. Whatever the sandboxed code does comes back in the result; the
calls raise only when the sandbox itself fails: :class:`SandboxCrashed` when its agent died or
stopped answering (the sandbox is then unusable, and a pool replaces it; its subclass
:class:`SandboxLost` when the box's host went away with it, which no code in the box can cause),
:class:`SandboxError` for a request the agent refused (e.g. reading a missing file).
"""

from __future__ import annotations

import abc
import asyncio
import base64
import contextlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

DEFAULT_MAX_OUTPUT_BYTES = 16_384
"""How many bytes of stdout and of stderr a call keeps by default; the rest is dropped."""

DEFAULT_MAX_FILE_BYTES = 1 << 20
"""How many bytes :meth:`Sandbox.read_file` returns by default."""

# A reply may be late by this much beyond the call's own timeout before the agent counts as hung.
_DEATH_REASON_WAIT_S = 10.0
"""How long a call that lost its connection waits to learn why the box died."""
_REPLY_GRACE_S = 10.0
_START_TIMEOUT_S = 30.0  # a new box's agent must answer within this
_AGENT_SOURCE = (Path(__file__).with_name("sandbox_agent.py")).read_text()


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one run.

    ``exit_code`` is the process's exit status (negative: killed by that signal), or ``None`` when
    it timed out and was killed. ``truncated`` is true when stdout or stderr exceeded the cap.
    ``restarted`` (Python calls only) is true when the interpreter was killed or died during the
    call, so the variables of earlier calls are gone.
    """

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    duration_s: float
    restarted: bool = False


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits every backend enforces (how, and how far, is stated in each backend)."""

    memory_mb: int = 512
    """Memory for everything in the box, its tmpfs files included; over it the OOM killer acts."""
    pids: int = 128
    """Most processes and threads alive at once in the box (a fork bomb stops here)."""
    cpus: float = 1.0
    """CPU time per wall-clock second (CFS quota), in cores."""
    network: bool = False
    """False: the box has only a loopback interface, so every connection out fails."""
    disk_mb: int = 256
    """Size of the writable work directory and of /tmp (tmpfs), where the backend can cap it."""
    max_file_mb: int = 64
    """Largest file a process in the box may write (RLIMIT_FSIZE)."""

    def __post_init__(self) -> None:
        for name in ("memory_mb", "pids", "cpus", "disk_mb", "max_file_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"SandboxLimits.{name} must be positive, got {getattr(self, name)}"
                )


class SandboxError(RuntimeError):
    """The sandbox refused a request (bad path, unreadable file, ...); the sandbox still works."""


class SandboxCrashed(SandboxError):
    """The sandbox died or stopped answering; it cannot be used again."""


class SandboxLost(SandboxCrashed):
    """The sandbox's host lost it (its engine stopped answering, or the box was removed under
    it): an infrastructure failure, which nothing run inside the box can cause."""


def agent_command(limits: SandboxLimits, python: str = "python3") -> list[str]:
    """The argv that starts the in-sandbox agent with ``python`` (isolated mode, unbuffered).

    The agent lowers ``RLIMIT_FSIZE`` to ``limits.max_file_mb`` for itself and everything it runs.
    """
    return [python, "-I", "-u", "-c", _AGENT_SOURCE, str(limits.max_file_mb << 20)]


class Sandbox(abc.ABC):
    """One live sandbox session. Subclasses start the box and implement :meth:`_shutdown`."""

    workdir: str = "/work"
    """The directory commands start in and relative paths resolve against."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | Any) -> None:
        """Serve requests over the agent's stdout (``reader``) and stdin (``writer``)."""
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._failure: str | None = None
        self._lost = False  # set by a backend's _death_reason: the host, not the box, failed
        self._closed = False
        self._replies = asyncio.create_task(self._read_replies())

    @property
    def alive(self) -> bool:
        """False once the sandbox has crashed, stopped answering or been closed."""
        return self._failure is None and not self._closed

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float = 30.0,
        stdin: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        """Run ``cmd`` (a string goes to ``/bin/sh -c``) for at most ``timeout`` seconds.

        Its whole process group is killed when it exits or times out, so nothing it started
        outlives the call.
        """
        _check_limits(timeout, max_output_bytes)
        reply = await self._call(
            "exec", timeout, cmd=cmd, timeout=timeout, stdin=stdin, max_output=max_output_bytes
        )
        return ExecResult(**reply)

    async def run_python(
        self, code: str, *, timeout: float = 30.0, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    ) -> ExecResult:
        """Run ``code`` in the sandbox's persistent interpreter (a trailing expression is printed).

        An exception gives exit code 1 and its traceback on stderr; ``sys.exit(n)`` gives ``n``.
        On a timeout the interpreter is killed and the next call starts a fresh one.
        """
        _check_limits(timeout, max_output_bytes)
        reply = await self._call(
            "python", timeout, code=code, timeout=timeout, max_output=max_output_bytes
        )
        return ExecResult(**reply)

    async def write_file(self, path: str, data: str | bytes) -> None:
        """Write ``data`` (text is UTF-8 encoded) to ``path``, creating parent directories."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await self._call("write_file", 60.0, path=path, data=base64.b64encode(raw).decode())

    async def read_file(self, path: str, *, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> bytes:
        """The first ``max_bytes`` bytes of ``path``; raises :class:`SandboxError` if unreadable."""
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        result = await self._call("read_file", 60.0, path=path, max_bytes=max_bytes)
        return base64.b64decode(result["data"])

    async def ping(self, timeout: float = 5.0) -> None:
        """Round trip to the agent; raises :class:`SandboxCrashed` if it does not answer in time."""
        await self._call("ping", timeout, reply_grace=0.0)

    async def close(self) -> None:
        """Stop the agent and destroy the box; safe to call twice, never raises for a dead box."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._writer.close()
        try:
            await self._shutdown()
        finally:
            self._replies.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replies
            self._fail_pending("the sandbox was closed")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _until_ready(self, backend: str) -> Self:
        """Wait for the agent's first answer; otherwise destroy the box and raise SandboxError."""
        try:
            await self.ping(timeout=_START_TIMEOUT_S)
        except BaseException as exc:
            if not isinstance(exc, Exception):  # cancelled or interrupted: destroyed, not failed
                await self.close()
                raise
            reason = await self._death_reason()
            await self.close()
            raise SandboxError(f"the {backend} sandbox did not start: {reason}") from None
        return self

    @abc.abstractmethod
    async def _shutdown(self) -> None:
        """Kill the box and everything in it, and release its resources."""

    async def _death_reason(self) -> str:
        """Why the agent's stream ended, as far as the backend can tell (exit code, OOM)."""
        return "the sandbox agent exited"

    async def _call(
        self, op: str, wait: float, *, reply_grace: float = _REPLY_GRACE_S, **fields: Any
    ) -> dict[str, Any]:
        """Send one request; ``wait`` is how long it may take before ``reply_grace`` is added."""
        if self._closed:
            raise SandboxCrashed("the sandbox was closed")
        if self._failure is not None:
            raise self._crash(self._failure)
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            line = json.dumps({"id": request_id, "op": op, **fields}) + "\n"
            self._writer.write(line.encode("utf-8", errors="surrogatepass"))
            await self._writer.drain()
            reply = await asyncio.wait_for(asyncio.shield(future), wait + reply_grace)
        except TimeoutError:
            self._failure = (
                f"the sandbox did not answer a {op!r} call within {wait + reply_grace:g} s"
            )
            self._fail_pending(self._failure)
            raise SandboxCrashed(self._failure) from None
        except (ConnectionError, RuntimeError) as exc:
            if isinstance(exc, SandboxError):
                raise
            # Let the reply reader find out why the stream ended (the backend may ask its
            # engine whether the box still exists: that decides crashed or lost).
            await asyncio.wait({self._replies}, timeout=_DEATH_REASON_WAIT_S)
            raise self._crash(self._failure or f"lost the sandbox: {exc}") from exc
        finally:
            self._pending.pop(request_id, None)
            if future.done() and not future.cancelled():
                # failed by _fail_pending after this call stopped waiting for it (its timeout, a
                # cancellation): the call raises for it, so mark its exception as seen
                future.exception()
        if not reply["ok"]:
            raise SandboxError(reply["error"])
        return reply["result"]

    async def _read_replies(self) -> None:
        try:
            while line := await self._reader.readline():
                reply = json.loads(line)
                future = self._pending.get(reply.get("id"))
                if future is not None and not future.done():
                    future.set_result(reply)
        except (ValueError, ConnectionError, asyncio.LimitOverrunError) as exc:
            self._failure = f"the sandbox agent sent a bad reply: {exc}"
        else:
            if not self._closed:
                self._failure = await self._death_reason()
        self._fail_pending(self._failure or "the sandbox was closed")

    def _fail_pending(self, reason: str) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self._crash(reason))

    def _crash(self, reason: str) -> SandboxCrashed:
        return (SandboxLost if self._lost else SandboxCrashed)(reason)


def _check_limits(timeout: float, max_output_bytes: int) -> None:
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if max_output_bytes < 0:
        raise ValueError(f"max_output_bytes must be >= 0, got {max_output_bytes}")
