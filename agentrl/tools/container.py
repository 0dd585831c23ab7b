"""Container sandboxes through the ``docker`` Python SDK: a Docker Engine or Podman's compatible API.

The client comes from ``docker.from_env()`` (``DOCKER_HOST``; for Podman,
``unix:///run/podman/podman.sock``, which ``sandboxes/setup.sh`` starts). Each sandbox is one
container whose first process is the agent (:mod:`agentrl.tools.sandbox_agent`); the host talks to
it over the container's attached stdin/stdout, so a tool call is one round trip on an open socket,
not a new ``exec``. The image needs only ``python3`` (``sandboxes/build.sh`` builds one).

What a :class:`ContainerSandbox` covers (each point has an adversarial test):

* **Network**: ``network_mode="none"`` unless ``limits.network``: only loopback.
* **Filesystem**: a read-only root; ``/work`` and ``/tmp`` are tmpfs mounts of ``limits.disk_mb``
  each that die with the container, so no episode sees another's files.
* **User**: uid/gid 65534, every capability dropped, ``no-new-privileges``.
* **Processes**: the engine's init (``init=True``: catatonit under Podman, tini under Docker) is
  pid 1 and reaps orphans, so a fork bomb's zombies do not keep the pids limit exhausted.
* **Limits**: memory (swap included) and process count from the container's cgroup, CPU quota
  from ``nano_cpus``, ``RLIMIT_FSIZE`` on each file. Over the memory limit the kernel's OOM killer
  acts inside the container (the caller sees exit 137 for the killed command).

* **System calls**: the policy of :mod:`agentrl.tools.seccomp` (the same as bubblewrap's), given
  as the container's seccomp profile in place of the engine's default: no new namespaces, no
  io_uring, bpf, keyrings, userfaultfd, perf events, mounts, ptrace, kernel modules... (``EPERM``).

What it does NOT cover: the kernel is shared with the host (as with every container); the rest of
the hardening (AppArmor or SELinux, masked paths) is the engine's default; the sandboxed code runs
as the same uid as the agent that reports its results.

Containers carry the label ``agentrl.sandbox`` with the owning process, so :func:`remove_orphans`
can clear what a crashed run left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import secrets
import socket
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.tools import seccomp
from agentrl.tools.sandbox import Sandbox, SandboxError, SandboxLimits, agent_command

DEFAULT_IMAGE = "localhost/agentrl-python:latest"
"""The image ``sandboxes/build.sh`` builds: Debian's minimal base with ``python3``."""

LABEL = "agentrl.sandbox"
_USER = "65534:65534"
_READ_LIMIT = 64 << 20
_STDERR_TAIL = 4096
# A box removed under a sandbox (``rm -f``) is first killed: its agent's stream ends while the
# engine still shows it stopping or stopped. Looking again this much later tells that apart from
# a box that died of its own (which stays until the sandbox removes it).
_REMOVAL_GRACE_S = 0.3

log = logging.getLogger(__name__)


class ContainerSandbox(Sandbox):
    """A sandbox in a container; build one with :meth:`start`."""

    def __init__(
        self, client: Any, container: Any, connection: _AttachedStreams, *, owns_client: bool
    ) -> None:
        super().__init__(connection.stdout, connection.writer)
        self._client = client
        self._owns_client = owns_client  # made by start(): closed with the sandbox
        self._container = container
        self._connection = connection
        self.on_not_removed: Callable[[str], None] | None = None
        """Called with the container's id when closing could not remove it (engine unreachable)."""

    @property
    def container_id(self) -> str:
        """The engine's id of this sandbox's container."""
        return self._container.id

    @classmethod
    async def start(
        cls,
        limits: SandboxLimits | None = None,
        *,
        image: str = DEFAULT_IMAGE,
        client: Any = None,
        on_not_removed: Callable[[str], None] | None = None,
        writable_dirs: Sequence[str] = (),
        environment: Mapping[str, str] | None = None,
    ) -> ContainerSandbox:
        """Create and start a container from ``image`` and wait until its agent answers.

        ``client`` is a ``docker.DockerClient`` (default ``docker.from_env()``).
        ``writable_dirs`` are absolute paths that get an empty tmpfs of ``limits.disk_mb``
        owned by the sandbox user (the root file system stays read-only; what the image holds
        there is hidden: Podman is told not to copy it up, a Docker Engine never does), e.g. a
        repository's directory to unpack a copy into (tested with Podman; the Docker Engine
        form, ``uid=``/``gid=`` options, is not tested here). ``environment`` adds variables. Raises
        :class:`SandboxError` when the engine is unreachable, the image is missing or the
        container fails to start; a container that failed to start is removed.
        ``on_not_removed`` is called with the container's name or id when the engine could not
        remove it (it stopped answering during the start, or before the sandbox was closed).
        """
        limits = limits or SandboxLimits()
        owns_client = client is None
        client = client or await asyncio.to_thread(connect)
        name = f"agentrl-{os.getpid()}-{secrets.token_hex(6)}"  # found by name if create fails
        if bad := [d for d in writable_dirs if not d.startswith("/")]:
            raise ValueError(f"writable_dirs must be absolute paths, got {bad}")
        extra = _Extra(tuple(writable_dirs), dict(environment or {}))
        creating = asyncio.ensure_future(
            asyncio.to_thread(_create, client, image, limits, name, extra)
        )
        try:
            container = await asyncio.shield(creating)
        except BaseException:
            # cancelled: the engine call goes on in its thread, or it finished in the same
            # iteration as the cancellation; either way the container it makes is removed (a
            # done future runs the callback soon)
            creating.add_done_callback(_remove_when_made)
            if owns_client:
                client.close()
            if on_not_removed is not None:  # the engine may have made it before failing
                on_not_removed(name)
            raise
        try:
            connection = await _attach(client, container)
            await asyncio.to_thread(container.start)
            sandbox = cls(client, container, connection, owns_client=owns_client)
            sandbox.on_not_removed = on_not_removed
        except BaseException as exc:
            removed = await asyncio.to_thread(_remove, container)
            if not removed and on_not_removed is not None:
                on_not_removed(container.id)
            if owns_client:
                client.close()
            if not isinstance(exc, Exception):  # cancelled or interrupted: not a failed start
                raise
            raise SandboxError(f"the container sandbox did not start: {exc}") from exc
        return await sandbox._until_ready("container")

    async def _shutdown(self) -> None:
        self._connection.close()
        removed = await asyncio.to_thread(_remove, self._container)
        if not removed and self.on_not_removed is not None:
            self.on_not_removed(self.container_id)
        if self._owns_client:
            self._client.close()  # its pooled connections to the engine's socket
        with contextlib.suppress(asyncio.CancelledError):
            self._connection.pump.cancel()
            await self._connection.pump

    async def _death_reason(self) -> str:
        try:
            state = await asyncio.to_thread(_state, self._container)
            await asyncio.sleep(_REMOVAL_GRACE_S)
            state = await asyncio.to_thread(_state, self._container)
        except Exception as exc:  # the engine is down, or removed the container: not the code
            self._lost = True
            return f"the container is gone ({type(exc).__name__}: {exc})"
        code = state.get("ExitCode")
        reason = f"the container stopped (status {state.get('Status')}, exit code {code})"
        if state.get("OOMKilled") or code == 137:
            # Podman on cgroup v1 never sets OOMKilled: 137 (SIGKILL) is the only sign left.
            reason += ": killed, by the out-of-memory killer or a SIGKILL"
        stderr = bytes(self._connection.stderr_tail).decode(errors="replace").strip()
        return f"{reason}; agent stderr: {stderr}" if stderr else reason


def connect() -> Any:
    """``docker.from_env()`` with a clear error when no engine answers."""
    import docker  # the SDK is optional: only this backend needs it

    client = None
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        if client is not None:
            client.close()
        host = os.environ.get("DOCKER_HOST", "the default socket")
        raise SandboxError(
            f"no container engine answers at {host}: {exc}. Start one with "
            "`sudo sandboxes/setup.sh` and set DOCKER_HOST=unix:///run/podman/podman.sock"
        ) from exc
    return client


def remove_orphans(client: Any = None) -> int:
    """Remove sandbox containers whose owning process on this host is gone; return how many."""
    owned = client is None
    client = client or connect()
    removed = 0
    try:
        # sparse: the listing's own labels, no inspect per container, which fails (Podman 4.3:
        # 500, not 404) for one that another process removes meanwhile
        listed = client.containers.list(all=True, filters={"label": LABEL}, sparse=True)
        for container in listed:
            labels = container.attrs.get("Labels") or {}
            host, _, pid = labels.get(LABEL, "").rpartition(":")
            if host == socket.gethostname() and pid.isdigit() and _pid_alive(int(pid)):
                continue
            _remove(container)
            removed += 1
    finally:
        if owned:
            client.close()
    return removed


@dataclasses.dataclass(frozen=True)
class _Extra:
    """What a sandbox adds to the standard container: writable directories, variables."""

    writable_dirs: tuple[str, ...] = ()
    environment: dict[str, str] = dataclasses.field(default_factory=dict)


def _create(
    client: Any, image: str, limits: SandboxLimits, name: str, extra: _Extra | None = None
) -> Any:
    import docker
    import requests  # the SDK's transport: an unreachable engine raises its errors

    extra = extra or _Extra()
    tmpfs_options = f"rw,size={limits.disk_mb}m,mode=1777"
    tmpfs = {Sandbox.workdir: tmpfs_options, "/tmp": tmpfs_options}
    if extra.writable_dirs:
        # owned by the sandbox user (git refuses a repository in a directory of another owner):
        # Podman chowns with U (it refuses uid=), a Docker Engine passes uid= to the kernel
        uid, gid = _USER.split(":")
        owner = ",notmpcopyup,U" if _is_podman(client) else f",uid={uid},gid={gid}"
        empty = f"rw,size={limits.disk_mb}m,mode=0755{owner}"
        tmpfs |= dict.fromkeys(extra.writable_dirs, empty)
    try:
        return client.containers.create(
            image,
            agent_command(limits),
            name=name,
            stdin_open=True,
            init=True,  # an init reaps orphans: zombies would otherwise hold the pids limit
            working_dir=Sandbox.workdir,
            user=_USER,
            network_mode="bridge" if limits.network else "none",
            mem_limit=f"{limits.memory_mb}m",
            memswap_limit=f"{limits.memory_mb}m",
            pids_limit=limits.pids,
            nano_cpus=int(limits.cpus * 1e9),
            read_only=True,
            tmpfs=tmpfs,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges", _seccomp_option(client)],
            environment={
                **extra.environment,
                "HOME": Sandbox.workdir,
                "LANG": "C.UTF-8",
                "TMPDIR": "/tmp",
            },
            labels={LABEL: f"{socket.gethostname()}:{os.getpid()}"},
        )
    except docker.errors.ImageNotFound as exc:
        raise SandboxError(
            f"sandbox image {image!r} not found: build it with `sudo sandboxes/build.sh`"
        ) from exc
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise SandboxError(f"cannot create a sandbox container from {image!r}: {exc}") from exc


def _seccomp_option(client: Any) -> str:
    """``seccomp=...`` with :mod:`agentrl.tools.seccomp`'s profile, in the form the engine reads.

    A Docker Engine takes the profile's JSON text (the docker CLI reads the file and sends that).
    Podman's compatible API (4.x) takes only a path on its own host, and answers "file name too
    long" to JSON text; its socket is local, so the profile is written to a file here.
    """
    profile = seccomp.oci_profile_json()
    if not _is_podman(client):
        return f"seccomp={profile}"
    return f"seccomp={_profile_file(profile)}"


def _is_podman(client: Any) -> bool:
    """Whether the engine behind ``client`` is Podman (its compatible API) or a Docker Engine."""
    components = client.version().get("Components") or []
    return any(str(part.get("Name", "")).startswith("Podman") for part in components)


def _profile_file(profile: str) -> Path:
    """``profile`` in a file named by its hash, in a directory only this user can write."""
    directory = Path(tempfile.gettempdir()) / f"agentrl-seccomp-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise SandboxError(f"{directory} is not a private directory of uid {os.getuid()}")
    path = directory / f"profile-{hashlib.sha256(profile.encode()).hexdigest()[:16]}.json"
    if not path.exists():  # a temporary name per writer: sandboxes start from several threads
        fd, partial = tempfile.mkstemp(dir=directory, prefix=f"{path.name}.")
        with os.fdopen(fd, "w") as file:
            file.write(profile)
        os.replace(partial, path)  # concurrent writers write the same bytes
    return path


class _AttachedStreams:
    """The container's attached stdio: a writer for stdin, a reader of the demultiplexed stdout.

    Without a TTY the engine multiplexes stdout and stderr on one socket in frames of an 8-byte
    header (stream id, 3 zero bytes, big-endian length) and a payload (Docker Engine API, "Attach
    to a container"); ``pump`` splits them, feeding stdout to ``stdout`` and keeping stderr's tail.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, response: Any
    ) -> None:
        self.writer = writer
        self.response = response  # the SDK's file object over the socket: it holds the fd open
        self.stdout = asyncio.StreamReader(limit=_READ_LIMIT)
        self.stderr_tail = bytearray()
        self.pump = asyncio.create_task(self._demultiplex(reader))

    async def _demultiplex(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                header = await reader.readexactly(8)
                stream, length = header[0], struct.unpack(">I", header[4:])[0]
                payload = await reader.readexactly(length)
                if stream == 2:
                    self.stderr_tail += payload
                    del self.stderr_tail[:-_STDERR_TAIL]
                else:
                    self.stdout.feed_data(payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.stdout.feed_eof()

    def close(self) -> None:
        self.writer.close()
        self.response.close()  # the socket's fd closes once both are closed


async def _attach(client: Any, container: Any) -> _AttachedStreams:
    params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
    response = await asyncio.to_thread(client.api.attach_socket, container.id, params)
    raw = response._sock if hasattr(response, "_sock") else response
    raw.setblocking(False)
    if raw.family == socket.AF_UNIX:
        reader, writer = await asyncio.open_unix_connection(sock=raw, limit=_READ_LIMIT)
    else:
        reader, writer = await asyncio.open_connection(sock=raw, limit=_READ_LIMIT)
    return _AttachedStreams(reader, writer, response)


def _state(container: Any) -> dict[str, Any]:
    container.reload()
    return container.attrs.get("State", {})


def _remove_when_made(creating: asyncio.Future[Any]) -> None:
    """Remove the container a cancelled start's engine call made after all (in a thread)."""
    if not creating.cancelled() and creating.exception() is None:
        threading.Thread(target=_remove, args=(creating.result(),), daemon=True).start()


def _remove(container: Any) -> bool:
    """Force-remove ``container`` (an SDK container object); see :func:`remove_by_id`."""
    return remove_by_id(container.client, container.id)


def remove_by_id(client: Any, container_id: str) -> bool:
    """Force-remove container ``container_id`` on ``client``'s engine, by id alone: no inspect
    first, which Podman 4.3 can answer with a 500 for a container its SIGKILLed service left
    half-way (its DELETE still works). It answers 500 for one that just exited: retried.

    An engine that no longer answers cannot remove anything: that is logged, not raised (closing
    a sandbox never raises for a dead box), and False is returned; ``ContainerHosts`` removes it
    when the engine answers again, ``remove_orphans`` once this process is gone. Another engine
    error raises ``docker.errors.APIError`` after five tries.
    """
    import docker
    import requests

    attempts = 0
    while True:
        try:
            client.api.remove_container(container_id, force=True)
            return True
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError:
            attempts += 1
            if attempts == 5:
                raise
            time.sleep(0.1 * attempts)
        except requests.exceptions.ConnectionError as exc:
            log.warning(
                "container %s was not removed, its engine is unreachable: %s", container_id, exc
            )
            return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
