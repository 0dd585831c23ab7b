"""Run environments against an engine concurrently and collect token-exact trajectories.

Each episode: ``areset`` gives the opening messages and tool schemas, from which the
:class:`~agentrl.tokenization.TrajectoryBuilder` renders the prompt; each turn the engine's tokens are
appended as produced, their decoded text is the environment's action, and the messages the
environment returns are appended as chat-template delta tokens. Nothing is re-tokenized. Stop
strings the reset info lists under ``"stop"`` (Search-R1's ``</search>``) end every turn of the
episode, besides the runner's own; the turn keeps the tokens as sampled, the match included.

Episodes run as asyncio tasks bounded by ``concurrency``; GRPO groups are ``group_size`` episodes
reset with the same seed (so the same prompt) and sampled with different seeds. An exception from the
environment, the engine or tokenization ends that episode with ``error`` set (prefixed ``env:``,
``engine:`` or ``tokenization:``); it never ends the batch. A step info with ``"infra_error"`` (the
environment could not judge the episode) is kept in ``infra_error``, and the last step info's
``"submission"`` (the answer in the benchmark's own format) in ``submission``. Timings are recorded
per turn. When an episode ends, however it ends, the engine is told (``end_session``), so it can
drop the episode's cached prefix instead of holding it until evicted.

Partial rollouts. With ``resume_aborted=True`` a generation the engine aborts (the trainer does
that before a weight update when ``stream.partial_rollouts="abort"``) keeps its tokens and is
continued from them with the rest of the turn's token budget, under whatever weights the engine
then has; each token keeps the version that produced it. (Under ``"pause"`` the engine itself
carries running requests across the update and the runner sees one call.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
from pydantic import Field

from agentrl.config import Config
from agentrl.engine_pool import Engine, EngineError, SamplingParams
from agentrl.envs import INFRA_ERROR, AgentEnv, AgentWrapper
from agentrl.rollout.trajectory import Trajectory, Turn
from agentrl.tokenization import SeamPolicy, TemplatePolicy, TokenTrajectory, TrajectoryBuilder


class RolloutConfig(Config):
    """How episodes are sampled."""

    groups_per_step: int = Field(4, ge=1)
    """Prompts (groups) in one training batch."""
    group_size: int = Field(4, ge=1)
    """Samples per prompt (GRPO's G); one group shares its reset seed, hence its prompt."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; the trainer scores tokens at the same temperature."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold (1 disables it; anything else makes log-probs biased)."""
    max_new_tokens: int = Field(256, ge=1)
    """Tokens per assistant turn."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end an assistant turn (kept in its tokens), besides those the environment
    asks for in its reset info (``"stop"``)."""
    max_total_tokens: int = Field(1024, ge=2)
    """Tokens per trajectory (prompt, every turn and every tool result)."""
    concurrency: int = Field(64, ge=1)
    """Episodes in flight at once."""
    template_policy: Literal["keep", "strict"] = "keep"
    """A chat template that is not append-only (``agentrl check-template``): ``keep`` the tokens
    the engine saw, with a warning, or ``strict``: refuse it (each episode then ends with a
    ``tokenization:`` error naming the problem). Templates that cannot be used are refused
    under both."""
    token_seams: Literal["keep", "reencode"] = "keep"
    """Where a full encode splits a prompt/completion boundary differently (token seams):
    ``keep`` the engine's ids, or ``reencode`` them as a full render would (the seam's ids leave
    the loss; counted in ``mismatch/seam_edits`` and ``mismatch/seam_engine_tokens``)."""


EnvMaker = Callable[[], AgentEnv | AgentWrapper]
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class RolloutTask:
    """One episode to run: reset seed and options (the prompt) and its place in its group."""

    group: int
    sample: int
    seed: int
    options: dict[str, Any] | None = None


class Runner(Protocol):
    """Anything that runs one episode per task: an :class:`EpisodeRunner` or an
    :class:`~agentrl.rollout.mixture.EnvMixture`."""

    async def run(self, task: RolloutTask) -> Trajectory: ...


def group_tasks(prompts: int, group_size: int = 1, seed: int = 0) -> list[RolloutTask]:
    """``prompts`` groups of ``group_size`` tasks; group ``g`` resets with seed ``seed + g``."""
    if prompts < 1 or group_size < 1:
        raise ValueError(f"prompts and group_size must be >= 1, got {prompts} and {group_size}")
    return [RolloutTask(g, s, seed + g) for g in range(prompts) for s in range(group_size)]


def turn_seed(base: int, task: RolloutTask, turn: int) -> int:
    """A distinct, reproducible engine seed for each (task, turn)."""
    state = np.random.SeedSequence([base, task.group, task.sample, turn]).generate_state(1)
    return int(state[0])


class ResetInfoError(ValueError):
    """A reset info's ``"stop"`` or ``"tags"`` has the wrong shape."""


def env_stop_strings(info: dict[str, Any]) -> tuple[str, ...]:
    """The stop strings a reset info asks for (``"stop"``: a list of non-empty strings)."""
    stop = info.get("stop") or ()
    if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
        raise ResetInfoError(f'reset info "stop" must be a list of non-empty strings, got {stop!r}')
    return tuple(stop)


def env_tags(info: dict[str, Any]) -> dict[str, str]:
    """The tags a reset info gives its task (``"tags"``: a dict of string keys and values)."""
    tags = info.get("tags") or {}
    if not isinstance(tags, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        raise ResetInfoError(f'reset info "tags" must map strings to strings, got {tags!r}')
    return dict(tags)


class EpisodeRunner:
    """Runs episodes of one environment against one engine (see the module docstring)."""

    def __init__(
        self,
        make_env: EnvMaker,
        engine: Engine,
        tokenizer: Any,
        sampling: SamplingParams,
        *,
        env_id: str = "",
        max_total_tokens: int = 4096,
        resume_aborted: bool = False,
        template_policy: TemplatePolicy | str = TemplatePolicy.KEEP,
        seams: SeamPolicy | str = SeamPolicy.KEEP,
    ):
        self.make_env = make_env
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.env_id = env_id
        self.max_total_tokens = max_total_tokens
        self.resume_aborted = resume_aborted
        self.template_policy = TemplatePolicy(template_policy)
        self.seams = SeamPolicy(seams)

    async def run(self, task: RolloutTask) -> Trajectory:
        env = self.make_env()
        try:
            return await self._episode(env, task)
        finally:
            try:
                await env.aclose()
            finally:
                with contextlib.suppress(EngineError):  # an engine that cannot serve holds nothing
                    await self.engine.end_session(self._session(task))

    async def _episode(self, env: AgentEnv | AgentWrapper, task: RolloutTask) -> Trajectory:
        try:
            messages, info = await env.areset(seed=task.seed, options=task.options)
        except Exception as exc:
            return self._failed(task, "env", exc)
        try:
            stop = env_stop_strings(info)
            tags = env_tags(info)
            builder = TrajectoryBuilder(
                self.tokenizer,
                messages,
                tools=info.get("tools") or None,
                policy=self.template_policy,
                seams=self.seams,
            )
        except Exception as exc:
            return self._failed(
                task, "env" if isinstance(exc, ResetInfoError) else "tokenization", exc, messages
            )
        # tokens and messages are taken from the builder once the episode ends, on every path
        trajectory = Trajectory(
            self.env_id, task.group, task.sample, task.seed, TokenTrajectory.empty(), []
        )
        trajectory.tags = tags
        stage = "engine"
        try:
            while True:
                prompt = builder.prompt_ids()
                budget = self.max_total_tokens - len(prompt)
                if budget <= 0:
                    trajectory.truncated, trajectory.stop_reason = True, "context_length"
                    break
                stage = "engine"
                sampling = self._sampling(task, len(trajectory.turns), budget, stop)
                start = time.perf_counter()
                turn, text = await self._generate_turn(builder, task, sampling, len(prompt))
                turn.generate_s = time.perf_counter() - start
                trajectory.turns.append(turn)
                stage = "env"
                start = time.perf_counter()
                observation, reward, terminated, truncated, info = await env.astep(text)
                turn.env_step_s = time.perf_counter() - start
                turn.reward = float(reward)
                trajectory.reward += float(reward)
                if info.get(INFRA_ERROR) and trajectory.infra_error is None:
                    trajectory.infra_error = str(info[INFRA_ERROR])
                if isinstance(info.get("submission"), dict):
                    trajectory.submission = dict(info["submission"])
                if terminated or truncated:
                    trajectory.terminated, trajectory.truncated = bool(terminated), bool(truncated)
                    trajectory.stop_reason = "terminated" if terminated else "truncated"
                    trajectory.reward_components = dict(info.get("reward_components", {}))
                    break
                stage = "tokenization"
                builder.add_messages(observation)
        except Exception as exc:
            trajectory.error = f"{stage}: {type(exc).__name__}: {exc}"
            trajectory.stop_reason = "error"
        trajectory.tokens = builder.trajectory
        trajectory.messages = builder.messages
        return trajectory

    async def _generate_turn(
        self,
        builder: TrajectoryBuilder,
        task: RolloutTask,
        sampling: SamplingParams,
        prompt_tokens: int,
    ) -> tuple[Turn, str]:
        """One assistant turn into ``builder``: one engine call, or several when
        ``resume_aborted`` continues a generation the engine aborted (a weight update under
        partial rollouts). Returns the turn record and the turn's text (the env's action)."""
        turn_ids: list[int] = []
        pieces = 0
        while True:
            result = await self.engine.generate(
                builder.prompt_ids(), sampling, session_id=self._session(task)
            )
            turn_ids.extend(result.token_ids)
            pieces += 1
            remaining = sampling.max_new_tokens - len(result.token_ids)
            again = self.resume_aborted and result.finish_reason == "abort" and remaining > 0
            # one piece: its own text; pieces: decoded together (a piece boundary may split a
            # multi-byte character), so the builder decodes the whole turn itself
            text = None if again or pieces > 1 else self._decode(result.token_ids)
            builder.add_completion(
                result.token_ids, result.logprobs, result.token_weight_versions, text
            )
            if not again:
                break
            sampling = sampling.continuation(pieces, remaining)
        finish = result.finish_reason
        if finish == "abort" and self.resume_aborted:
            finish = "length"  # the abort came as the token budget ran out
        turn = Turn(prompt_tokens, len(turn_ids), finish, result.weight_version, 0.0, pieces=pieces)
        return turn, text if pieces == 1 and text is not None else self._decode(turn_ids)

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _sampling(
        self, task: RolloutTask, turn: int, budget: int, stop: tuple[str, ...]
    ) -> SamplingParams:
        seed = None if self.sampling.seed is None else turn_seed(self.sampling.seed, task, turn)
        max_new = min(self.sampling.max_new_tokens, budget)
        stop = tuple(dict.fromkeys(self.sampling.stop + stop))  # the runner's first, once each
        return dataclasses.replace(self.sampling, seed=seed, max_new_tokens=max_new, stop=stop)

    def _session(self, task: RolloutTask) -> str:
        return f"{self.env_id}:{task.group}:{task.sample}:{task.seed}"

    def _failed(
        self, task: RolloutTask, stage: str, exc: Exception, messages: Sequence[Any] = ()
    ) -> Trajectory:
        return Trajectory(
            self.env_id,
            task.group,
            task.sample,
            task.seed,
            TokenTrajectory.empty(),
            list(messages),
            stop_reason="error",
            error=f"{stage}: {type(exc).__name__}: {exc}",
        )

    async def stream(
        self, tasks: Iterable[RolloutTask], concurrency: int = 64
    ) -> AsyncIterator[Trajectory]:
        """Yield trajectories as they complete, at most ``concurrency`` episodes at a time."""
        async for trajectory in bounded_as_completed(tasks, self.run, concurrency):
            yield trajectory

    async def stream_groups(
        self, tasks: Iterable[RolloutTask], concurrency: int = 64
    ) -> AsyncIterator[list[Trajectory]]:
        """Yield each group as soon as all of its samples completed, samples in order."""
        tasks = list(tasks)
        sizes: dict[int, int] = defaultdict(int)
        for task in tasks:
            sizes[task.group] += 1
        partial: dict[int, list[Trajectory]] = defaultdict(list)
        async for trajectory in self.stream(tasks, concurrency):
            group = partial[trajectory.group]
            group.append(trajectory)
            if len(group) == sizes[trajectory.group]:
                yield sorted(partial.pop(trajectory.group), key=lambda t: t.sample)

    async def collect(
        self, tasks: Iterable[RolloutTask], concurrency: int = 64
    ) -> list[Trajectory]:
        """All trajectories, in task order."""
        results = [t async for t in self.stream(tasks, concurrency)]
        return sorted(results, key=lambda t: (t.group, t.sample))


async def bounded_as_completed(
    items: Iterable[T], run: Callable[[T], Awaitable[R]], concurrency: int
) -> AsyncIterator[R]:
    """``run(item)`` for every item, at most ``concurrency`` at a time; yield results as they
    complete. Closing the generator early cancels (and awaits) the runs still pending."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    slots = asyncio.Semaphore(concurrency)

    async def bounded(item: T) -> R:
        async with slots:
            return await run(item)

    pending = {asyncio.ensure_future(bounded(item)) for item in items}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                yield future.result()
    finally:
        for future in pending:
            future.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
