"""``EnginePool``: many engines behind the one :class:`~agentrl.engine_pool.engine.Engine` protocol.

Routing. A request goes to the healthy engine with the fewest requests in flight; a session (one
trajectory's turns, ``session_id``) stays on the engine that served its last turn, so the engine's
prefix cache holds its context. Each engine takes at most ``max_inflight_per_engine`` requests at
once; more wait for a slot.

Failures. When a request fails with :class:`EngineError` (connection refused or reset, HTTP 5xx,
a malformed response, an engine that died), the engine is evicted and the request is sent again,
from the same input ids and sampling parameters, to another healthy engine: a trajectory is never
lost, and a request that failed returned nothing, so none is duplicated. An engine that hangs is
found by the health loop (a probe every ``health_interval`` seconds, bounded by
``health_timeout``): after ``failures_to_evict`` failed probes it is evicted, and its in-flight
requests are cancelled and rerouted the same way. Evicted engines are probed again with
exponential backoff (up to ``max_backoff``); one that answers is re-admitted only at the pool's
weight version (otherwise it waits, ``"stale"``, for the next weight update, which includes it).
Requests the caller got wrong (``ValueError``) are not retried. When no engine is left,
``generate`` raises :class:`EngineError`.

Weight updates. ``pause``, ``update_weights`` (per bucket), ``resume`` and ``abort`` fan out to
every engine, so ``agentrl.rl.weight_sync.sync_weights(model, [pool], version)`` works
unchanged; :meth:`EnginePool.update_weights_from_disk` does the same from a directory. An engine
whose pause or update fails is evicted rather than left serving old or half-loaded weights, and
``resume`` re-admits only engines that report the new version (asking the server, for HTTP
engines). With ``abort`` before the update (partial rollouts), aborted requests return their
tokens with ``finish_reason="abort"`` and the rollout continues them under the new weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from agentrl.engine_pool.engine import Engine, EngineError, GenerateResult, SamplingParams
from agentrl.engine_pool.sglang_api import parse_version

Status = Literal["healthy", "evicted", "stale"]
_MAX_SESSIONS = 100_000


@dataclass(eq=False)
class PoolMember:
    """One engine in the pool and what the pool knows about it."""

    engine: Engine
    name: str
    semaphore: asyncio.Semaphore
    status: Status = "healthy"
    inflight: int = 0
    served: int = 0
    failed_probes: int = 0
    backoff: float = 0.0
    next_probe: float = 0.0
    last_error: str = ""
    tasks: set[asyncio.Task[GenerateResult]] = field(default_factory=set)


class EnginePool:
    """Routes requests over ``engines`` (see the module docstring); an :class:`Engine` itself."""

    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        max_inflight_per_engine: int = 64,
        health_interval: float = 2.0,
        health_timeout: float = 10.0,
        failures_to_evict: int = 2,
        max_backoff: float = 60.0,
    ) -> None:
        if not engines:
            raise ValueError("an EnginePool needs at least one engine")
        if max_inflight_per_engine < 1:
            raise ValueError(f"max_inflight_per_engine must be >= 1, got {max_inflight_per_engine}")
        self.members = [
            PoolMember(engine, _name(engine, i), asyncio.Semaphore(max_inflight_per_engine))
            for i, engine in enumerate(engines)
        ]
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.failures_to_evict = failures_to_evict
        self.max_backoff = max_backoff
        self.retries = 0
        self._sessions: OrderedDict[str, PoolMember] = OrderedDict()
        self._version = max(engine.weight_version for engine in engines)
        self._health_task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> EnginePool:
        for member in self.members:
            start = getattr(member.engine, "start", None)
            if start is not None:
                await start()
        self._version = max(m.engine.weight_version for m in self.members)
        self._health_task = asyncio.create_task(self._health_loop(), name="EnginePool.health")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the health loop and close every engine."""
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        await asyncio.gather(*(m.engine.aclose() for m in self.members), return_exceptions=True)

    @property
    def healthy(self) -> list[PoolMember]:
        """The members requests may go to now."""
        return [m for m in self.members if m.status == "healthy"]

    # -- the Engine protocol -----------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(
        self, input_ids: Sequence[int], sampling: SamplingParams, session_id: str | None = None
    ) -> GenerateResult:
        ids = list(input_ids)
        while True:
            member = self._choose(session_id)
            async with member.semaphore:
                if member.status != "healthy":  # evicted while this request waited for a slot
                    continue
                member.inflight += 1
                call = asyncio.ensure_future(member.engine.generate(ids, sampling, session_id))
                member.tasks.add(call)
                try:
                    result = await asyncio.shield(call)
                except asyncio.CancelledError:
                    if call.cancelled() and not _cancelling():  # evicted: try another engine
                        self.retries += 1
                        continue
                    call.cancel()
                    raise
                except EngineError as exc:
                    self._evict(member, f"{type(exc).__name__}: {exc}")
                    self.retries += 1
                    continue
                finally:
                    member.inflight -= 1
                    member.tasks.discard(call)
            member.served += 1
            if session_id is not None:
                self._remember(session_id, member)
            return result

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Push one bucket to every healthy (or stale) engine; evict those that fail."""
        tensors = list(named_tensors)
        await self._update(lambda e: e.update_weights(tensors, version), version)

    async def update_weights_from_disk(self, model_path: str, version: int) -> None:
        """Have every engine load ``model_path`` (it must be readable by each of them)."""
        await self._update(lambda e: e.update_weights_from_disk(model_path, version), version)

    def delivered(self, version: int) -> None:
        """Weights of ``version`` reached every healthy engine by other means (one broadcast to
        a :class:`~agentrl.engine_pool.WeightUpdateGroup`); :meth:`resume` checks each."""
        if version < self._version:
            raise ValueError(f"weight version {version} is older than the pool's {self._version}")
        self._version = version

    async def pause(self) -> None:
        await self._fan_out(lambda e: e.pause(), self.healthy)

    async def resume(self) -> None:
        """Re-admit engines that report the pool's version, evict the rest, and resume them."""
        candidates = [m for m in self.members if m.status in ("healthy", "stale")]
        versions = await asyncio.gather(
            *(self._reported_version(m) for m in candidates), return_exceptions=True
        )
        for member, reported in zip(candidates, versions, strict=True):
            if reported == self._version:
                member.status = "healthy"
            else:
                why = reported if isinstance(reported, BaseException) else f"version {reported}"
                self._evict(member, f"does not report weight version {self._version}: {why}")
        await self._fan_out(lambda e: e.resume(), self.healthy)

    async def abort(self, session_id: str | None = None) -> None:
        member = self._sessions.get(session_id) if session_id is not None else None
        targets = [member] if member is not None else self.healthy
        await self._fan_out(lambda e: e.abort(session_id), targets)

    async def end_session(self, session_id: str) -> None:
        """Forget the session's route and tell the engine that served it (if still healthy)."""
        member = self._sessions.pop(session_id, None)
        if member is not None and member.status == "healthy":
            await self._fan_out(lambda e: e.end_session(session_id), [member])

    # -- internals ---------------------------------------------------------------------------

    def _choose(self, session_id: str | None) -> PoolMember:
        sticky = self._sessions.get(session_id) if session_id is not None else None
        if sticky is not None and sticky.status == "healthy":
            return sticky
        healthy = self.healthy
        if not healthy:
            reasons = "; ".join(f"{m.name}: {m.status} ({m.last_error})" for m in self.members)
            raise EngineError(f"no healthy engine in the pool: {reasons}")
        return min(healthy, key=lambda m: (m.inflight, m.served))

    def _remember(self, session_id: str, member: PoolMember) -> None:
        self._sessions[session_id] = member
        self._sessions.move_to_end(session_id)
        if len(self._sessions) > _MAX_SESSIONS:
            self._sessions.popitem(last=False)

    def _evict(self, member: PoolMember, reason: str) -> None:
        if member.status != "evicted":
            member.status = "evicted"
            member.backoff = self.health_interval
            member.next_probe = time.monotonic() + member.backoff
        member.last_error = reason
        for call in list(member.tasks):
            call.cancel()

    async def _update(self, push: Callable[[Any], Awaitable[None]], version: int) -> None:
        if version < self._version:
            raise ValueError(f"weight version {version} is older than the pool's {self._version}")
        targets = [m for m in self.members if m.status in ("healthy", "stale")]
        await self._fan_out(push, targets)
        if not any(m.status in ("healthy", "stale") for m in targets):
            raise EngineError(f"no engine accepted weight version {version}")
        self._version = version

    async def _fan_out(
        self, call: Callable[[Any], Awaitable[None]], members: Sequence[PoolMember]
    ) -> None:
        results = await asyncio.gather(*(call(m.engine) for m in members), return_exceptions=True)
        for member, result in zip(members, results, strict=True):
            if isinstance(result, ValueError):
                raise result
            if isinstance(result, BaseException):
                self._evict(member, f"{type(result).__name__}: {result}")

    async def _reported_version(self, member: PoolMember) -> int:
        info = getattr(member.engine, "model_info", None)
        if info is None:
            return member.engine.weight_version
        return parse_version((await info()).get("weight_version"))

    async def _probe(self, member: PoolMember) -> bool:
        healthy = getattr(member.engine, "healthy", None)
        try:
            if healthy is not None:
                return bool(
                    await asyncio.wait_for(healthy(self.health_timeout), self.health_timeout)
                )
            return bool(getattr(member.engine, "serving", True))
        except Exception:
            return False

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            now = time.monotonic()
            due = [m for m in self.members if m.status != "evicted" or m.next_probe <= now]
            results = await asyncio.gather(*(self._probe(m) for m in due))
            for member, ok in zip(due, results, strict=True):
                await self._after_probe(member, ok)

    async def _after_probe(self, member: PoolMember, ok: bool) -> None:
        if member.status == "evicted":
            if not ok:
                member.backoff = min(member.backoff * 2, self.max_backoff)
                member.next_probe = time.monotonic() + member.backoff
                return
            try:
                at_version = await self._reported_version(member) == self._version
            except Exception:
                return
            member.status = "healthy" if at_version else "stale"
            member.failed_probes = 0
            return
        member.failed_probes = 0 if ok else member.failed_probes + 1
        if member.failed_probes >= self.failures_to_evict:
            self._evict(member, f"failed {member.failed_probes} health checks")


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _name(engine: Engine, index: int) -> str:
    return getattr(engine, "url", None) or f"{type(engine).__name__}[{index}]"
