"""Rollouts as a stream: groups are launched under a staleness allowance and queued when complete.

:class:`RolloutStream` runs GRPO groups (``group_size`` episodes sharing a reset seed) against
one :class:`~agentrl.rollout.runner.EpisodeRunner` (or an
:class:`~agentrl.rollout.mixture.EnvMixture` of several) in the background and puts each group on a
queue as soon as all of its episodes finished, samples in order. The trainer takes
``groups_per_step`` groups per step with :meth:`next_groups`, whichever finished first.

Launch allowance (the staleness bound's first half, as in AReaL). At most ``(1 + max_staleness)
* groups_per_step`` groups are launched ahead of what the trainer consumed: each
:meth:`advance` (called after every weight update) allows ``groups_per_step`` more. With
``max_staleness = 0`` the groups of step ``s`` start only once the weights of step ``s`` are in
the engine: synchronous on-policy training, where the queue never holds more than one batch.
With ``k > 0`` rollouts for the next ``k`` steps run while the trainer trains; a group that is
slower than its peers can still be consumed later than planned, so the trainer also applies the
bound per token (:func:`agentrl.algorithms.off_policy.staleness_policy`) when it builds the batch.

Dynamic sampling (DAPO). :meth:`next_groups_with_signal` filters out groups a predicate finds
without signal (all rewards equal) and draws replacements: each replacement is one more launch
allowed, so the launch allowance keeps its meaning (groups ahead of what the trainer consumed),
and with ``max_staleness = 0`` the replacements run under the step's weights too.

Data position. Group ``g`` resets with seed ``seed + g``; the stream's :attr:`state` (the next new
group and the groups launched but not yet consumed) goes into checkpoints, and a stream built
from it launches the unconsumed groups again first, so a resumed run sees the same prompts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Literal

from pydantic import Field

from agentrl.algorithms.off_policy import StalenessMode
from agentrl.config import Config
from agentrl.rollout.runner import RolloutTask, Runner
from agentrl.rollout.trajectory import Trajectory


class StreamConfig(Config):
    """Streaming rollouts into the trainer, staleness and partial rollouts."""

    max_staleness: int = Field(0, ge=0)
    """Policy versions a token may lag the weights being trained; 0 is synchronous on-policy
    training (rollouts for step s start only once the weights of step s are in the engine)."""
    staleness_mode: StalenessMode = "drop"
    """For tokens beyond the bound: ``drop`` their group, ``mask`` the tokens, or keep them for
    ``importance`` correction (by algorithm.importance_correction, or by the ratio to the engine
    with algorithm.old_logprobs=engine)."""
    partial_rollouts: Literal["pause", "abort"] = "pause"
    """At a weight update, in-flight generations are paused and continue under the new weights
    (``pause``), or aborted, keeping their tokens, and re-issued (``abort``)."""


Group = list[Trajectory]


class RolloutStream:
    """Background producer of completed groups (see the module docstring)."""

    def __init__(
        self,
        runner: Runner,
        *,
        group_size: int,
        groups_per_step: int,
        max_staleness: int = 0,
        concurrency: int = 64,
        seed: int = 0,
        next_group: int = 0,
        pending_groups: Iterable[int] = (),
    ) -> None:
        if group_size < 1 or groups_per_step < 1 or max_staleness < 0 or concurrency < 1:
            raise ValueError(
                "need group_size, groups_per_step, concurrency >= 1 and max_staleness >= 0"
            )
        self.runner = runner
        self.group_size = group_size
        self.groups_per_step = groups_per_step
        self.seed = seed
        self._next_group = next_group
        self._relaunch = sorted(pending_groups)
        self._allowance = (1 + max_staleness) * groups_per_step  # launches allowed so far
        self._launches = 0
        self._launched: set[int] = set()  # launched, not yet consumed
        self._slots = asyncio.Semaphore(concurrency)
        self._queue: asyncio.Queue[Group] = asyncio.Queue()
        self._wakeup = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._producer: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._failed = asyncio.Event()

    @property
    def state(self) -> dict[str, Any]:
        """The data position: ``next_group`` and ``pending_groups`` (launched, not consumed)."""
        pending = sorted(self._launched | set(self._relaunch))
        return {"next_group": self._next_group, "pending_groups": pending}

    @property
    def in_flight(self) -> int:
        """Groups launched and not yet complete."""
        return len(self._tasks)

    @property
    def idle(self) -> bool:
        """Whether no group runs and none will start before the next :meth:`advance`."""
        return not self._tasks and self._launches >= self._allowance

    @property
    def ready(self) -> int:
        """Complete groups waiting in the queue."""
        return self._queue.qsize()

    def start(self) -> None:
        if self._producer is None:
            self._producer = asyncio.create_task(self._produce(), name="rollout-stream")

    def advance(self, groups: int | None = None) -> None:
        """Allow ``groups`` (default ``groups_per_step``) more launches (call it after each
        weight update)."""
        self._allowance += self.groups_per_step if groups is None else groups
        self._wakeup.set()

    async def next_groups(
        self, stop: asyncio.Event | None = None, *, count: int | None = None
    ) -> list[Group] | None:
        """The next ``count`` (default ``groups_per_step``) complete groups (in group order), or
        None once ``stop`` is set first (groups already taken go back to the queue). Raises
        ``RuntimeError`` if an episode could not even start (e.g. the environment cannot be
        made)."""
        wanted = self.groups_per_step if count is None else count
        groups: list[Group] = []
        while len(groups) < wanted:
            self._raise_failure()
            if stop is not None and stop.is_set():  # also when groups are ready: stop wins
                for group in groups:
                    self._queue.put_nowait(group)
                return None
            getter = asyncio.ensure_future(self._queue.get())
            others = [asyncio.ensure_future(self._failed.wait())]
            if stop is not None:
                others.append(asyncio.ensure_future(stop.wait()))
            await asyncio.wait([getter, *others], return_when=asyncio.FIRST_COMPLETED)
            for waiter in others:
                waiter.cancel()
            if getter.done():
                groups.append(getter.result())
                continue
            getter.cancel()  # safe: a cancelled get leaves its item in the queue
        groups.sort(key=lambda g: g[0].group)
        for group in groups:
            self._launched.discard(group[0].group)
        return groups

    async def next_groups_with_signal(
        self,
        has_signal: Callable[[Group], bool],
        max_groups: int,
        stop: asyncio.Event | None = None,
    ) -> tuple[list[Group], dict[str, float]] | None:
        """Dynamic sampling: ``groups_per_step`` groups for which ``has_signal`` holds, drawing
        (and launching) replacements for those it rejects until ``max_groups`` were drawn; then
        the groups found so far, perhaps fewer or none. Also returns the counts
        ``dynamic_sampling/drawn``, ``filtered`` and ``cap_hit`` (1 when it stopped short).
        None once ``stop`` is set (the groups kept so far go back to the queue; the filtered
        ones are consumed)."""
        if max_groups < self.groups_per_step:
            raise ValueError(
                f"max_groups ({max_groups}) is below groups_per_step ({self.groups_per_step})"
            )
        kept: list[Group] = []
        drawn = 0
        while len(kept) < self.groups_per_step and drawn < max_groups:
            count = min(self.groups_per_step - len(kept), max_groups - drawn)
            if drawn:  # replacements: launches beyond the step's allowance
                self.advance(count)
            groups = await self.next_groups(stop, count=count)
            if groups is None:
                for group in kept:  # back to the queue and the data position
                    self._launched.add(group[0].group)
                    self._queue.put_nowait(group)
                return None
            drawn += len(groups)
            kept.extend(g for g in groups if has_signal(g))
        kept.sort(key=lambda g: g[0].group)
        metrics = {
            "dynamic_sampling/drawn": float(drawn),
            "dynamic_sampling/filtered": float(drawn - len(kept)),
            "dynamic_sampling/cap_hit": float(len(kept) < self.groups_per_step),
        }
        return kept, metrics

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"rollouts failed: {self._failure!r}") from self._failure

    async def aclose(self) -> None:
        """Cancel the producer and every episode in flight (their environments are closed)."""
        tasks = [t for t in (self._producer, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._producer = None

    async def _produce(self) -> None:
        while True:
            while self._launches >= self._allowance:
                self._wakeup.clear()
                await self._wakeup.wait()
            group = self._relaunch.pop(0) if self._relaunch else self._take_next()
            self._launched.add(group)
            self._launches += 1
            task = asyncio.create_task(self._run_group(group), name=f"group-{group}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take_next(self) -> int:
        group, self._next_group = self._next_group, self._next_group + 1
        return group

    async def _run_group(self, group: int) -> None:
        async def one(sample: int) -> Trajectory:
            async with self._slots:
                return await self.runner.run(RolloutTask(group, sample, self.seed + group))

        try:
            trajectories = await asyncio.gather(*(one(s) for s in range(self.group_size)))
        except Exception as exc:  # the runner records episode errors; this is worse
            self._failure = exc
            self._failed.set()
            return
        self._queue.put_nowait(list(trajectories))
