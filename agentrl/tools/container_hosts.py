"""Container sandboxes spread over several Docker-API endpoints, each new one on the least-loaded.

:class:`ContainerHosts` holds a list of endpoints (:class:`HostConfig`: ``unix://`` sockets,
``tcp://`` with or without TLS, ``ssh://``), one ``docker.DockerClient`` per endpoint, and the
sandboxes living on each. :meth:`ContainerHosts.start` places a new :class:`ContainerSandbox`:

* **Placement.** On the healthy host with the fewest live sandboxes (starts in flight count too),
  below its ``max_sandboxes``; ties go to the host listed first.
* **Failure.** A host whose client cannot be made, or on which a start fails (engine unreachable,
  image missing, agent not answering), leaves the rotation: its error is logged once and the start
  is retried on the next healthy host, so one host going down does not fail an episode.
* **Recovery.** A host out of rotation is pinged again (``client.ping()``, ``ping_timeout_s``) by
  the first start at least ``retry_after_s`` after its last check; when it answers it takes
  sandboxes again.
* **Everything down.** :class:`SandboxError` naming every host and its last error.

* **Leftovers.** A sandbox closed while its host's engine does not answer leaves its container
  there; the host removes it at the first start (or :meth:`ContainerHosts.close`) at which the
  engine answers again. A removal request may take ``remove_timeout_s`` (a force removal on a
  loaded engine takes seconds); ``close`` tries an answering host again until that has passed.

Live counts come from the sandboxes themselves (a sandbox that crashed or was closed no longer
counts), so nothing has to report back. What is NOT covered: a sandbox whose host dies mid-episode
dies with it (its calls raise :class:`~agentrl.tools.SandboxLost`, a :class:`SandboxCrashed`, and
its container stays on that host until the leftovers are removed, or ``remove_orphans`` runs there
after this process); placement knows only counts, not the hosts' CPU or
memory; Podman is given the system-call profile as a path written on this machine, so a Podman
reached over ``tcp://`` or ``ssh://`` needs the same file on its own host (a Docker Engine gets the
profile's text and needs nothing).

``AGENTRL_SANDBOX_HOSTS=unix:///run/a.sock,ssh://user@b`` makes :func:`sandbox_factory`
("container") place every sandbox of this process over those hosts; ``tcp://`` hosts take TLS from
``DOCKER_CERT_PATH`` (``ca.pem``, ``cert.pem``, ``key.pem``) when it is set, as ``docker.from_env``
does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agentrl.tools.container import DEFAULT_IMAGE, ContainerSandbox, remove_by_id
from agentrl.tools.sandbox import SandboxError, SandboxLimits

ENV_VAR = "AGENTRL_SANDBOX_HOSTS"
"""Comma-separated endpoint URLs that container sandboxes are spread over (see the module)."""

SCHEMES = ("unix", "tcp", "ssh")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostConfig:
    """One Docker-API endpoint; the URL is checked at construction (``ValueError`` names it)."""

    url: str
    """``unix:///path/to.sock``, ``tcp://host:port`` or ``ssh://[user@]host[:port]``."""
    name: str = ""
    """What logs and errors call the host; default: the URL."""
    max_sandboxes: int | None = None
    """Most sandboxes alive on the host at once; None: no cap."""
    tls_ca_cert: str | None = None
    """tcp only: the CA certificate that signed the engine's certificate (enables TLS)."""
    tls_client_cert: tuple[str, str] | None = None
    """tcp only: (certificate, key) files this client authenticates with (enables TLS)."""
    tls_verify: bool = True
    """tcp with TLS: check the engine's certificate against ``tls_ca_cert``."""

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        problem = None
        if parts.scheme not in SCHEMES:
            problem = f"the scheme must be one of {', '.join(s + '://' for s in SCHEMES)}"
        elif parts.scheme == "unix" and (parts.netloc or not parts.path.startswith("/")):
            problem = "a unix socket URL is unix:// followed by an absolute path"
        elif parts.scheme == "tcp" and (not parts.hostname or not _has_port(parts)):
            problem = "a tcp URL needs a host and a port (tcp://host:2376)"
        elif parts.scheme == "ssh" and not parts.hostname:
            problem = "an ssh URL needs a host (ssh://user@host)"
        elif parts.scheme != "tcp" and self.tls:
            problem = "TLS options apply to tcp:// endpoints only"
        elif missing := [f for f in self._tls_files if not Path(f).is_file()]:
            problem = f"TLS file(s) not found: {', '.join(missing)}"
        elif self.max_sandboxes is not None and self.max_sandboxes < 1:
            problem = f"max_sandboxes must be >= 1, got {self.max_sandboxes}"
        if problem:
            raise ValueError(f"bad container host {self.url!r}: {problem}")
        if not self.name:
            object.__setattr__(self, "name", self.url)

    @property
    def tls(self) -> bool:
        """Whether the client speaks TLS (tcp:// with a CA or a client certificate)."""
        return self.tls_ca_cert is not None or self.tls_client_cert is not None

    @property
    def _tls_files(self) -> list[str]:
        return [f for f in (self.tls_ca_cert, *(self.tls_client_cert or ())) if f is not None]

    @classmethod
    def from_url(cls, url: str) -> HostConfig:
        """``url`` with TLS from ``DOCKER_CERT_PATH`` for a tcp:// URL when that is set."""
        cert_path = os.environ.get("DOCKER_CERT_PATH")
        if not url.startswith("tcp://") or not cert_path:
            return cls(url.strip())
        certs = Path(cert_path)
        return cls(
            url.strip(),
            tls_ca_cert=str(certs / "ca.pem"),
            tls_client_cert=(str(certs / "cert.pem"), str(certs / "key.pem")),
            tls_verify=os.environ.get("DOCKER_TLS_VERIFY", "1") not in ("", "0"),
        )

    def client(self, timeout: float | None = None) -> Any:
        """A new ``docker.DockerClient`` for this endpoint (it connects: call it off the loop).

        ``ssh://`` runs the ``ssh`` program (``~/.ssh/config`` and agent apply), so paramiko is
        not needed. ``timeout`` bounds each API request (default: the SDK's 60 s).
        """
        import docker

        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        if self.tls:
            options["tls"] = docker.tls.TLSConfig(  # the SDK then speaks https to tcp://
                client_cert=self.tls_client_cert, ca_cert=self.tls_ca_cert, verify=self.tls_verify
            )
        return docker.DockerClient(
            base_url=self.url, use_ssh_client=self.url.startswith("ssh://"), **options
        )


@dataclass(frozen=True)
class HostStatus:
    """One host as :meth:`ContainerHosts.status` sees it."""

    name: str
    healthy: bool
    live: int
    """Sandboxes alive on it, plus starts in flight."""
    error: str | None
    """Why it is out of rotation (None when healthy)."""


class _Host:
    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.client: Any = None  # made by the first start on the host
        self.sandboxes: weakref.WeakSet[ContainerSandbox] = weakref.WeakSet()
        self.starting = 0
        self.error: str | None = None
        self.next_check = 0.0  # monotonic time before which a down host is not pinged
        self.leftovers: set[str] = set()  # containers of closed sandboxes the engine did not remove
        self.removing = threading.Lock()  # held by the one thread removing the host's leftovers

    @property
    def load(self) -> int:
        return self.starting + sum(1 for sandbox in self.sandboxes if sandbox.alive)

    @property
    def full(self) -> bool:
        cap = self.config.max_sandboxes
        return cap is not None and self.load >= cap


def _host_errors() -> tuple[type[BaseException], ...]:
    import docker
    import requests

    # What a host that is down or broken raises: the SDK raises requests' errors as well as its
    # own when it makes a client; ContainerSandbox.start turns the rest into SandboxError.
    return (SandboxError, OSError, docker.errors.DockerException, requests.RequestException)


class ContainerHosts:
    """Places container sandboxes over several engines (see the module docstring).

    Safe to share between event loops and threads (one lock guards the counts and health state);
    :meth:`close` closes the clients.
    """

    def __init__(
        self,
        hosts: Sequence[HostConfig | str],
        *,
        retry_after_s: float = 10.0,
        ping_timeout_s: float = 3.0,
        remove_timeout_s: float = 30.0,
    ) -> None:
        configs = [h if isinstance(h, HostConfig) else HostConfig(h) for h in hosts]
        if not configs:
            raise ValueError("ContainerHosts needs at least one host")
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise ValueError(f"container host names must be unique, got {names}")
        self._hosts = [_Host(c) for c in configs]
        self._retry_after_s = retry_after_s
        self._ping_timeout_s = ping_timeout_s
        self._remove_timeout_s = remove_timeout_s
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, value: str | None = None, **options: Any) -> ContainerHosts:
        """Hosts from a comma-separated list of URLs (default: ``$AGENTRL_SANDBOX_HOSTS``)."""
        value = os.environ.get(ENV_VAR, "") if value is None else value
        urls = [url for url in value.split(",") if url.strip()]
        if not urls:
            raise ValueError(f"{ENV_VAR} names no container host: {value!r}")
        return cls([HostConfig.from_url(url) for url in urls], **options)

    def pick(self, exclude: Iterable[str] = ()) -> str:
        """The least-loaded healthy host with room (first listed on ties), by name.

        Raises :class:`SandboxError` naming every host and why it cannot take a sandbox.
        """
        with self._lock:
            return self._pick(set(exclude)).config.name

    def mark_down(self, name: str, error: str) -> None:
        """Take host ``name`` out of rotation until a ping after ``retry_after_s`` succeeds."""
        with self._lock:
            host = self._host(name)
            if host.error is None:
                log.warning("container host %s is out of rotation: %s", name, error)
            host.error = error
            host.next_check = time.monotonic() + self._retry_after_s

    def status(self) -> list[HostStatus]:
        """Every host's health and load, in the configured order."""
        with self._lock:
            return [
                HostStatus(h.config.name, h.error is None, h.load, h.error) for h in self._hosts
            ]

    def host_of(self, sandbox: ContainerSandbox) -> str | None:
        """The name of the host ``sandbox`` was placed on (None: not placed by these hosts)."""
        with self._lock:
            return next((h.config.name for h in self._hosts if sandbox in h.sandboxes), None)

    async def check(self) -> None:
        """Ping, concurrently, each host out of rotation whose retry time has come; then remove
        the containers a host could not remove while it was down, once it answers."""
        now = time.monotonic()
        with self._lock:
            due = [h for h in self._hosts if h.error is not None and h.next_check <= now]
            for host in due:  # claimed: concurrent starts do not ping the same host again
                host.next_check = now + self._retry_after_s
        await asyncio.gather(*(asyncio.to_thread(self._ping, host) for host in due))
        with self._lock:
            tidy = [
                h
                for h in self._hosts
                if h.leftovers and h.error is None and (h in due or h.next_check <= now)
            ]
        await asyncio.gather(*(asyncio.to_thread(self._remove_leftovers, h) for h in tidy))

    async def start(
        self, limits: SandboxLimits | None = None, *, image: str = DEFAULT_IMAGE
    ) -> ContainerSandbox:
        """A new sandbox on the least-loaded healthy host; a host that fails is skipped."""
        await self.check()
        host_errors = _host_errors()
        tried: set[str] = set()
        while True:
            with self._lock:
                host = self._pick(tried)
                host.starting += 1
            tried.add(host.config.name)
            try:
                if host.client is None:
                    host.client = await asyncio.to_thread(host.config.client)
                sandbox = await ContainerSandbox.start(
                    limits,
                    image=image,
                    client=host.client,
                    on_not_removed=functools.partial(self._left_over, host),
                )
            except host_errors as exc:
                self.mark_down(host.config.name, f"{type(exc).__name__}: {exc}")
                continue
            finally:
                with self._lock:
                    host.starting -= 1
            with self._lock:
                host.sandboxes.add(sandbox)
            return sandbox

    def close(self) -> None:
        """Remove the containers a host could not remove while down, where it answers now, and
        close every host's client (sandboxes still open keep working until closed).

        A host that answers but fails a removal (a loaded engine times out, or answers 500 for a
        container whose start its restart cut short) is tried again for up to
        ``remove_timeout_s``; a host that does not answer is left at once, with a warning.
        """
        for host in self._hosts:
            deadline = time.monotonic() + self._remove_timeout_s
            reason = self._remove_leftovers(host)  # waits for a removal in flight there
            while host.leftovers and time.monotonic() < deadline:
                self._ping(host)
                if host.error is not None:
                    reason = f"it does not answer ({host.error})"
                    break
                time.sleep(1.0)
                reason = self._remove_leftovers(host)
            if host.leftovers:
                log.warning(
                    "%d sandbox containers are left on container host %s (%s): remove_orphans() "
                    "there removes them once this process has exited",
                    len(host.leftovers),
                    host.config.name,
                    reason,
                )
            if host.client is not None:
                host.client.close()

    def _left_over(self, host: _Host, container_id: str) -> None:
        with self._lock:
            host.leftovers.add(container_id)

    def _remove_leftovers(self, host: _Host) -> str | None:
        """Remove the containers left on ``host``; those that cannot be go back to its leftovers
        and why is returned (None: nothing is left). One remover at a time: a second caller waits
        for the first, then finds what the first could not remove."""
        import docker
        import requests

        with host.removing:
            with self._lock:
                ids, host.leftovers = host.leftovers, set()
            if not ids:
                return None
            client, reason = None, None
            try:
                client = host.config.client(timeout=self._remove_timeout_s)
                for container_id in sorted(ids):
                    try:
                        removed = remove_by_id(client, container_id)
                    except (docker.errors.APIError, requests.Timeout) as exc:  # this one only
                        reason = f"{type(exc).__name__}: {exc}"
                        continue
                    if not removed:
                        reason = "its engine does not answer"
                        break
                    ids.discard(container_id)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
            finally:
                if client is not None:
                    client.close()
                if ids:
                    log.info(
                        "container host %s could not remove %d leftovers yet: %s",
                        host.config.name,
                        len(ids),
                        reason,
                    )
                    with self._lock:
                        host.leftovers |= ids
                        host.next_check = time.monotonic() + self._retry_after_s
            return reason if ids else None

    def _ping(self, host: _Host) -> None:
        client = None
        try:
            client = host.config.client(timeout=self._ping_timeout_s)
            client.ping()
        except Exception as exc:
            with self._lock:
                host.error = f"{type(exc).__name__}: {exc}"
            return
        finally:
            if client is not None:
                client.close()
        with self._lock:
            host.error = None
        log.info("container host %s is back in rotation", host.config.name)

    def _pick(self, exclude: set[str]) -> _Host:
        candidates = [
            (h.load, i)
            for i, h in enumerate(self._hosts)
            if h.error is None and not h.full and h.config.name not in exclude
        ]
        if candidates:
            return self._hosts[min(candidates)[1]]
        reasons = "; ".join(f"{h.config.name}: {self._why_not(h, exclude)}" for h in self._hosts)
        raise SandboxError(f"no container host can take a sandbox ({reasons})")

    def _why_not(self, host: _Host, exclude: set[str]) -> str:
        if host.error is not None:
            return f"down ({host.error})"
        if host.full:
            return f"full ({host.config.max_sandboxes} sandboxes)"
        return "failed just now" if host.config.name in exclude else "available"

    def _host(self, name: str) -> _Host:
        for host in self._hosts:
            if host.config.name == name:
                return host
        raise KeyError(f"no container host named {name!r}")


def _has_port(parts: Any) -> bool:
    try:
        return parts.port is not None
    except ValueError:  # a port that is not a number
        return False


_shared: dict[str, ContainerHosts] = {}
_shared_lock = threading.Lock()


def shared_hosts(value: str) -> ContainerHosts:
    """The process's one :class:`ContainerHosts` for ``value`` (a comma-separated URL list).

    Environments built from the same ``AGENTRL_SANDBOX_HOSTS`` share the counts, so placement sees
    every sandbox of the process.
    """
    with _shared_lock:
        if value not in _shared:
            _shared[value] = ContainerHosts.from_env(value)
        return _shared[value]
