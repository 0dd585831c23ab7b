"""A pool of warm sandboxes: one fresh sandbox per episode, started before it is asked for.

``async with pool.acquire() as sandbox:`` hands out a sandbox that no earlier episode has touched
(sandboxes are replaced, never reset, so no file, process or interpreter state can leak from one
episode into the next). While the episode runs, the pool starts its replacement in the background,
so an episode waits for a start only when more are running at once than ``warm``. A sandbox that
died while idle is detected at hand-out (a ping) and replaced; one that crashed during an episode
is counted in ``stats.crashed`` and discarded at release.

Build one with a backend name (:func:`sandbox_factory`) or any ``async () -> Sandbox`` callable::

    async with SandboxPool(sandbox_factory("bwrap"), warm=4) as pool:
        async with pool.acquire() as sandbox:
            await sandbox.run_python("print(1)")
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self

from agentrl.tools.container import DEFAULT_IMAGE
from agentrl.tools.sandbox import Sandbox, SandboxError, SandboxLimits

SandboxFactory = Callable[[], Awaitable[Sandbox]]

BACKENDS = ("bwrap", "container")
"""Backend names :func:`sandbox_factory` accepts."""


def sandbox_factory(
    backend: str, limits: SandboxLimits | None = None, *, image: str = DEFAULT_IMAGE, **options: Any
) -> SandboxFactory:
    """A factory for ``backend`` (``"bwrap"`` or ``"container"``); ``options`` go to its ``start``.

    ``image`` is the container image (the bubblewrap backend has none and ignores it), so one
    environment config serves both backends. Other options: ``client`` (one engine) or ``hosts``
    (a :class:`~agentrl.tools.container_hosts.ContainerHosts`: each sandbox on the least-loaded
    healthy engine) for ``"container"``; without either, ``$AGENTRL_SANDBOX_HOSTS`` names the
    engines when it is set, else ``DOCKER_HOST`` the one. ``python`` for ``"bwrap"``.
    """
    if backend == "bwrap":
        from agentrl.tools.bwrap import BubblewrapSandbox

        return lambda: BubblewrapSandbox.start(limits, **options)
    if backend == "container":
        from agentrl.tools.container import ContainerSandbox
        from agentrl.tools.container_hosts import ENV_VAR, shared_hosts

        hosts = options.pop("hosts", None)
        if hosts is not None and "client" in options:
            raise ValueError("give the container backend a client or hosts, not both")
        if hosts is None and "client" not in options and os.environ.get(ENV_VAR, "").strip():
            hosts = shared_hosts(os.environ[ENV_VAR])
        if hosts is not None:
            return lambda: hosts.start(limits, image=image, **options)
        return lambda: ContainerSandbox.start(limits, image=image, **options)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")


@dataclass
class PoolStats:
    """Counters since the pool opened."""

    started: int = 0
    """Sandboxes started."""
    served: int = 0
    """Sandboxes handed out by :meth:`SandboxPool.acquire`."""
    crashed: int = 0
    """Sandboxes found dead (idle or in use) and replaced."""


class SandboxPool:
    """Keeps ``warm`` started sandboxes ready; each is used by one episode, then destroyed."""

    def __init__(self, factory: SandboxFactory, *, warm: int = 2) -> None:
        if warm < 0:
            raise ValueError(f"warm must be >= 0, got {warm}")
        self._factory = factory
        self._warm = warm
        self._idle: asyncio.Queue[Sandbox] = asyncio.Queue()
        self._refills: set[asyncio.Task[Any]] = set()
        self._closes: set[asyncio.Task[Any]] = set()
        self._closed = False
        self.stats = PoolStats()

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        """The pool itself: it is a live resource shared by reference (gymnasium deep-copies an
        environment's spec, whose kwargs may hold the pool, for every wrapper)."""
        return self

    async def __aenter__(self) -> Self:
        for _ in range(self._warm):
            self._spawn(self._refill(), self._refills)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Sandbox]:
        """A fresh, answering sandbox for one episode; it is destroyed when the block exits."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        sandbox = await self._take()
        self.stats.served += 1
        self._spawn(self._refill(), self._refills)
        try:
            yield sandbox
        finally:
            if not sandbox.alive and not self._closed:
                self.stats.crashed += 1
            await sandbox.close()

    async def close(self) -> None:
        """Destroy every sandbox the pool holds and wait for background starts and closes."""
        self._closed = True
        for task in self._refills:
            task.cancel()
        await asyncio.gather(*self._refills, *self._closes, return_exceptions=True)
        while not self._idle.empty():
            await self._idle.get_nowait().close()

    async def _take(self) -> Sandbox:
        while not self._idle.empty():
            sandbox = self._idle.get_nowait()
            try:
                await sandbox.ping()
                return sandbox
            except SandboxError:
                self.stats.crashed += 1
                self._spawn(sandbox.close(), self._closes)
        return await self._start()

    async def _start(self) -> Sandbox:
        sandbox = await self._factory()
        self.stats.started += 1
        return sandbox

    async def _refill(self) -> None:
        if self._idle.qsize() >= self._warm:
            return
        sandbox = await self._start()
        if self._closed:
            await sandbox.close()
        else:
            self._idle.put_nowait(sandbox)

    def _spawn(self, coroutine: Awaitable[Any], tasks: set[asyncio.Task[Any]]) -> None:
        """Run ``coroutine`` in the background; a failed start surfaces at the next acquire."""
        task = asyncio.ensure_future(coroutine)
        tasks.add(task)
        task.add_done_callback(_forget(tasks))


def _forget(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the failure is not logged as "never retrieved"

    return done


class EpisodeSandbox:
    """The sandbox of one episode: started (or taken from a pool) on first use, destroyed at release.

    ``get`` is the ``get_sandbox`` callable :func:`~agentrl.tools.sandbox_tools.sandbox_tools`
    wants. A sandbox that crashed is replaced by a fresh one on the next ``get`` (its state is
    gone; the tool's error message already said so). Environments call :meth:`release` when an
    episode ends, on reset and in ``aclose``.
    """

    def __init__(self, factory: SandboxFactory, pool: SandboxPool | None = None) -> None:
        self._factory = factory
        self._pool = pool
        self._stack: contextlib.AsyncExitStack | None = None
        self._sandbox: Sandbox | None = None

    @property
    def started(self) -> bool:
        """Whether this episode has a sandbox now."""
        return self._sandbox is not None

    async def get(self) -> Sandbox:
        """The episode's live sandbox, started now if there is none (or it crashed)."""
        if self._sandbox is not None and not self._sandbox.alive:
            await self.release()
        if self._sandbox is None:
            stack = contextlib.AsyncExitStack()
            if self._pool is not None:
                self._sandbox = await stack.enter_async_context(self._pool.acquire())
            else:
                self._sandbox = await stack.enter_async_context(await self._factory())
            self._stack = stack
        return self._sandbox

    async def release(self) -> None:
        """Destroy the episode's sandbox, if any; safe to call at any time."""
        stack, self._stack, self._sandbox = self._stack, None, None
        if stack is not None:
            await stack.aclose()
