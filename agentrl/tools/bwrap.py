"""A daemon-less sandbox: the agent runs under bubblewrap, in new namespaces, as an unprivileged user.

What a :class:`BubblewrapSandbox` covers (each point has an adversarial test):

* **Network**: a new network namespace with only loopback (unless ``limits.network``); connections
  out fail with ``ENETUNREACH``.
* **Filesystem**: the host's ``/usr`` (with the ``/bin``, ``/lib``... links into it) is mounted
  read-only and nothing else of the host is visible; the root is read-only too. ``/work`` (the work
  directory) and ``/tmp`` are private tmpfs mounts that vanish with the sandbox, so no episode sees
  another's files.
* **Processes**: a new pid namespace whose init is bubblewrap's, with ``--die-with-parent`` and
  ``--new-session``; killing the sandbox kills every process in it. Commands run as uid 65534
  with no capabilities (as root, through ``setpriv``; otherwise as the calling user).
* **Limits**: when the host has a writable cgroup v1 hierarchy (root on a cgroup v1 machine, as on
  this project's CI), a cgroup per sandbox caps memory (tmpfs files included: the OOM killer acts
  inside the sandbox), process count and CPU quota. Otherwise the limits fall back to rlimits:
  ``RLIMIT_AS`` for memory (address space, not resident memory: coarser) and ``RLIMIT_NPROC`` for
  processes (counted per uid across the host, so sandboxes sharing a uid share the budget).
  ``RLIMIT_FSIZE`` (set by the agent) caps each written file in both cases.
* **System calls**: bubblewrap loads the seccomp filter of :mod:`agentrl.tools.seccomp` (the same
  policy as the container backend's) before the agent starts: no new user namespaces (``unshare
  -U`` fails), no io_uring, bpf, keyrings, userfaultfd, perf events, mounts, ptrace, kernel
  modules... (``EPERM``). An unsupported architecture refuses to start.

What it does NOT cover:

* The system-call filter narrows the kernel surface, it does not remove it: a bug in an allowed
  call is still an escape (see :mod:`agentrl.tools.seccomp` for what it leaves out).
* The host's ``/usr`` is readable: installed programs and their versions are visible.
* cgroup v2 hierarchies are not used yet (the limits then come from rlimits, as above), and without
  cgroups the work directory's tmpfs is bounded only by ``RLIMIT_FSIZE`` per file.
* The sandboxed code runs as the same uid as the agent that reports its results, so it can lie
  to its own agent; graders should rely on evidence the code cannot forge (see Code-v0).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
from pathlib import Path

from agentrl.tools import seccomp
from agentrl.tools.sandbox import Sandbox, SandboxError, SandboxLimits, agent_command

SANDBOX_UID = 65534
"""The uid (and gid) the sandbox runs as when started by root: ``nobody``."""

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_CGROUP_CONTROLLERS = ("memory", "pids", "cpu")
_CGROUP_PARENT = "agentrl"
_CPU_PERIOD_US = 100_000
_STDERR_TAIL = 4096
_READ_LIMIT = 64 << 20  # the longest reply line the agent may send
_names = itertools.count()
_sweeps = itertools.count()  # the first sandbox of a process sweeps groups left by dead ones


class BubblewrapSandbox(Sandbox):
    """A sandbox in bubblewrap namespaces; build one with :meth:`start`."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        cgroups: list[Path],
        stderr_tail: bytearray,
        stderr_task: asyncio.Task[None],
    ) -> None:
        assert process.stdout is not None and process.stdin is not None
        super().__init__(process.stdout, process.stdin)
        self._process = process
        self._cgroups = cgroups
        self._stderr_tail = stderr_tail
        self._stderr_task = stderr_task

    @property
    def pid(self) -> int:
        """The host pid of the sandbox's outermost process (its process group id too)."""
        return self._process.pid

    @classmethod
    async def start(
        cls, limits: SandboxLimits | None = None, *, python: str = "/usr/bin/python3"
    ) -> BubblewrapSandbox:
        """Start a sandbox and wait until its agent answers.

        ``python`` is the interpreter (under the host's ``/usr``) the agent runs with. Raises
        :class:`SandboxError` when bubblewrap or ``python`` is missing or the sandbox fails.
        """
        limits = limits or SandboxLimits()
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxError(
                "bubblewrap is not installed: run `sudo sandboxes/setup.sh` "
                "(or `apt-get install bubblewrap`)"
            )
        if not python.startswith("/usr/") or not os.access(python, os.X_OK):
            raise SandboxError(f"no Python interpreter at {python!r} (it must live under /usr)")
        program = seccomp.filter_fd()  # the system-call filter, read by bubblewrap
        try:
            cgroups = _make_cgroups(limits)
            argv = _command(bwrap, python, limits, cgroups, program)
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=_READ_LIMIT,
                start_new_session=True,
                pass_fds=(program,),
            )
        finally:
            os.close(program)
        tail = bytearray()
        sandbox = cls(process, cgroups, tail, asyncio.create_task(_keep_tail(process, tail)))
        return await sandbox._until_ready("bubblewrap")

    async def _shutdown(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        await self._process.wait()
        with contextlib.suppress(asyncio.CancelledError):
            self._stderr_task.cancel()
            await self._stderr_task
        await _remove_cgroups(self._cgroups)

    async def _death_reason(self) -> str:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._process.wait(), 2.0)
        reason = f"the bubblewrap sandbox exited (code {self._process.returncode})"
        if self._cgroups and _oom_killed(self._cgroups[0]):
            reason += ", killed by the out-of-memory killer at its memory limit"
        stderr = self._stderr()
        return f"{reason}: {stderr}" if stderr else reason

    def _stderr(self) -> str:
        return self._stderr_tail.decode(errors="replace").strip()


async def _keep_tail(process: asyncio.subprocess.Process, tail: bytearray) -> None:
    """Keep the last bytes of bubblewrap's stderr for error messages."""
    assert process.stderr is not None
    while chunk := await process.stderr.read(4096):
        tail += chunk
        del tail[:-_STDERR_TAIL]


def _command(
    bwrap: str, python: str, limits: SandboxLimits, cgroups: list[Path], seccomp_fd: int
) -> list[str]:
    rlimits = ["--nofile=1024", "--core=0"]
    if not cgroups:
        rlimits += [f"--as={limits.memory_mb << 20}", f"--nproc={limits.pids}"]
    box = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if limits.network:
        box.append("--share-net")
    box += ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / top
        if host.is_symlink():
            box += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            box += ["--ro-bind", str(host), str(host)]
    for extra in ("/etc/alternatives", "/etc/ld.so.cache", "/etc/localtime"):
        box += ["--ro-bind-try", extra, extra]
    box += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", Sandbox.workdir]
    box += ["--remount-ro", "/", "--chdir", Sandbox.workdir, "--clearenv"]
    box += ["--seccomp", str(seccomp_fd)]
    environment = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": Sandbox.workdir,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
    }
    for key, value in environment.items():
        box += ["--setenv", key, value]
    box += ["--", *agent_command(limits, python)]
    unprivileged = []
    if os.geteuid() == 0:  # drop to nobody before bubblewrap: no capabilities, a real uid
        unprivileged = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}"]
        unprivileged += ["--clear-groups", "--"]
    launch = ["prlimit", *rlimits, "--", *unprivileged, *box]
    if not cgroups:
        return launch
    # The shell joins the cgroups before anything of the sandbox exists, then becomes it.
    joins = "".join(f'echo $$ > "{group}/cgroup.procs" && ' for group in cgroups)
    return ["/bin/sh", "-c", joins + 'exec "$@"', "agentrl-sandbox", *launch]


def _make_cgroups(limits: SandboxLimits) -> list[Path]:
    """One cgroup v1 group per controller for a new sandbox, or ``[]`` when not possible here."""
    roots = [_CGROUP_ROOT / controller for controller in _CGROUP_CONTROLLERS]
    if os.geteuid() != 0 or not all((root / "tasks").exists() for root in roots):
        return []
    if next(_sweeps) == 0:
        _remove_stale_cgroups(roots)
    name = f"sandbox-{os.getpid()}-{next(_names)}"
    groups = [root / _CGROUP_PARENT / name for root in roots]
    memory, pids, cpu = groups
    try:
        for group in groups:
            group.mkdir(parents=True, exist_ok=True)
        memory_bytes = str(limits.memory_mb << 20)
        (memory / "memory.limit_in_bytes").write_text(memory_bytes)
        swap = memory / "memory.memsw.limit_in_bytes"
        if swap.exists():
            swap.write_text(memory_bytes)
        (pids / "pids.max").write_text(str(limits.pids))
        (cpu / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
        (cpu / "cpu.cfs_quota_us").write_text(str(int(limits.cpus * _CPU_PERIOD_US)))
    except OSError as exc:
        for group in groups:
            with contextlib.suppress(OSError):
                group.rmdir()
        raise SandboxError(
            f"cannot set up the sandbox's cgroups under {_CGROUP_ROOT}: {exc}"
        ) from exc
    return groups


def _remove_stale_cgroups(roots: list[Path]) -> None:
    """Remove empty groups whose owning process is gone (a run that was killed, not closed)."""
    for root in roots:
        for group in (root / _CGROUP_PARENT).glob("sandbox-*-*"):
            pid = group.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):  # still holds processes: leave it
                    group.rmdir()


def _oom_killed(memory_group: Path) -> bool:
    try:
        control = (memory_group / "memory.oom_control").read_text()
    except OSError:
        return False
    counts = dict(line.split() for line in control.splitlines() if len(line.split()) == 2)
    return int(counts.get("oom_kill", "0")) > 0


async def _remove_cgroups(groups: list[Path]) -> None:
    """Remove the groups once their last process is gone (a killed process can take a moment)."""
    for _ in range(100):
        remaining = []
        for group in groups:
            try:
                group.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                remaining.append(group)
        if not remaining:
            return
        groups = remaining
        await asyncio.sleep(0.05)
