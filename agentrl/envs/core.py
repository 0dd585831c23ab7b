"""`AgentEnv`: a Gymnasium environment for chat agents whose native interface is async.

The whole contract:

- **Observation**: a list of chat messages (:data:`~agentrl.envs.spaces.Message`). ``reset`` returns
  the opening messages (system prompt, task); ``step`` returns only the messages the environment adds
  after the assistant's turn (tool results, feedback), possibly none.
- **Action**: the assistant's text for one turn, exactly as decoded from the engine's tokens.
- **Info**: ``reset``'s info carries ``"tools"``, the JSON schemas (OpenAI style) of the tools the agent
  may call, as fresh objects on every call, and may carry ``"stop"``, strings that end each
  assistant turn of the episode (Search-R1's ``</search>``; the rollout runner adds them to its
  sampling's ``stop``, and the turn keeps its tokens as sampled, the match included), and
  ``"tags"``, what the task is (``{"difficulty": "<15 min fix"}``), which ``agentrl eval``
  reports per value. Step infos are deterministic for a given seed and action
  (no timings: rollouts measure those) so that ``check_env`` passes.
- **Async first**: subclasses implement :meth:`areset` and :meth:`astep` (and :meth:`aclose` if they
  hold resources). Blocking work (verifiers, subprocesses) is awaited off the event loop, so thousands
  of environments share one loop. ``reset``/``step``/``close`` are Gymnasium's synchronous forms; they
  run their async twins on one event loop the environment keeps until ``close`` (so a sandbox or a
  connection opened in ``reset`` still works in ``step``), and refuse to run inside a running loop.
- **Infrastructure failures**: a step whose outcome could not be judged for a reason that is not
  the agent's fault (no grading sandbox could start, a verifier worker died or hung) sets
  ``info[INFRA_ERROR]`` (``"infra_error"``) to a message, scores 0 and usually ends the episode.
  Its reward means nothing: the rollout runner records the message in ``Trajectory.infra_error``
  and the trainer leaves the episode out of the group statistics and the loss, counting it in
  ``episodes/infra_errors``.
- **Submissions**: a step that judges the agent's answer may put it, in its benchmark's own
  format, under ``info["submission"]`` (a dict: Code-v0 a HumanEval sample ``{"task_id",
  "completion"}``); the rollout runner keeps the last one in ``Trajectory.submission`` and
  ``agentrl eval`` writes them out, one file per environment, for the benchmark's own tools.
- **The last turn**: :class:`~agentrl.envs.wrappers.TurnLimit` (``max_turns``) sets
  :attr:`AgentEnv.final_turn` before the step after which it will truncate the episode, so an
  environment that judges the work at the end (SWE-v0 grades the repository) judges it on that step
  instead of being cut off unjudged.
- **Tasks**: an environment whose tasks form a list (problems, questions, instances) takes
  ``options={"index": i}`` in ``reset`` and says how many there are in :attr:`num_tasks`, so
  ``agentrl eval`` can enumerate them; ``reset`` without an index draws one with its seed.
- **Seeding**: subclasses call ``await super().areset(seed=seed, options=options)`` first, the async
  twin of Gymnasium's ``super().reset(seed=seed)``; it seeds :attr:`np_random`.

An episode runs on one event loop: the synchronous verbs share the environment's own loop, and the
async ones must be awaited on a single loop from ``areset`` to the episode's end (the rollout
runner does), because environments may hold loop-bound objects (sandboxes, subprocess transports)
for an episode.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Coroutine
from typing import Any, SupportsFloat, TypeVar

import gymnasium

from agentrl.envs.spaces import AssistantText, ChatMessages, Message

T = TypeVar("T")

StepResult = tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]
INFRA_ERROR = "infra_error"
"""The step-info key that marks an episode that could not be judged (see the module docstring)."""
ResetResult = tuple[list[Message], dict[str, Any]]


class AgentEnv(gymnasium.Env[list[Message], str]):
    """Base class of every agentrl environment (see the module docstring for the contract)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (an instance variable in gymnasium.Env)
    observation_space = ChatMessages()
    action_space = AssistantText()
    final_turn: bool = False
    """True during the step after which a turn limit will truncate the episode (see the module
    docstring); False otherwise."""

    @property
    def num_tasks(self) -> int | None:
        """How many tasks ``reset(options={"index": i})`` picks from (``0 <= i < num_tasks``), so
        an evaluation can enumerate them; None for an environment that cannot."""
        return None

    async def anum_tasks(self) -> int | None:
        """:attr:`num_tasks`, for an environment that must ask elsewhere (``Remote-v0`` asks its
        server); what ``agentrl eval`` calls."""
        return self.num_tasks

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        """Start an episode. The base implementation seeds :attr:`np_random`; subclasses call it first."""
        gymnasium.Env.reset(self, seed=seed)
        return [], {}

    async def astep(self, action: str) -> StepResult:
        """Take the assistant's text; return (new messages, reward, terminated, truncated, info)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release resources; must be safe to call more than once."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        return self.run_sync(self.areset(seed=seed, options=options))

    def step(self, action: str) -> StepResult:
        return self.run_sync(self.astep(action))

    def close(self) -> None:
        try:
            self.run_sync(self.aclose())
        finally:
            loop = self.__dict__.pop("_sync_loop", None)
            if loop is not None:
                _close_loop(loop)

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this environment's own event loop (kept until ``close``); refuse
        inside a running loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            loop = self.__dict__.get("_sync_loop")
            if loop is None:
                loop = self.__dict__["_sync_loop"] = asyncio.new_event_loop()
                weakref.finalize(self, loop.close)  # an environment dropped without close()
            return loop.run_until_complete(coro)
        coro.close()
        raise RuntimeError(
            f"{type(self).__name__}: the synchronous reset/step/close were called inside a running "
            "event loop; use `await env.areset()`, `await env.astep(action)`, `await env.aclose()`"
        )


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on ``loop``, finish its async generators and worker threads, close it."""
    try:
        leftovers = asyncio.all_tasks(loop)
        for task in leftovers:
            task.cancel()
        if leftovers:
            loop.run_until_complete(asyncio.wait(leftovers))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()
