"""The acceptance test of SFT data: tokenizing a rollout's conversation gives the rollout's ids and
loss mask.

Real episodes of multi-turn ``agentrl/Math-v0`` (the python tool in the bubblewrap sandbox) are
rolled out by the embedded engine with SmolLM2; each episode's ``messages`` are then tokenized as
SFT data (:func:`~agentrl.sft.data.tokenize_conversation`) and compared with what the rollout
recorded. Equal by construction where the engine's ids for each assistant turn are the
tokenizer's own encoding of the turn's text (plus the end-of-turn token). Two kinds of episode
differ, for reasons that are not SFT's, and are counted and checked apart:

* a sampled turn that is not the canonical encoding of its text (the same text split into other
  tokens): the text and every template segment are equal, the turn's ids are not;
* a turn cut by ``max_new_tokens`` (finish reason ``length``): the rollout has no end-of-turn
  token there (and closes the turn with mask 0 if the episode went on), while SFT data is a
  finished conversation whose turns all end with a trained end-of-turn token.

SmolLM2 does not call the tool in the tags format on its own (0 of 112 sampled episodes at
temperature 0.7 and 1.0 wrote ``<python>``; it writes Markdown code blocks), so its own episodes
are single-turn. Multi-turn episodes come from a policy that writes the tool call as its first
turn and lets SmolLM2 sample every later turn after the sandbox's real tool message, through the
same :class:`~agentrl.rollout.EpisodeRunner`; and from a fully scripted policy. All 16 sampled
episodes share the engine's batch (one batched decode instead of 16 in a row); batching changes
float rounding, so the counts the test prints can differ between runs, and the assertions ask for
at least one episode of each kind (with 256 new tokens a turn, few episodes are cut).
"""

import asyncio

import gymnasium
import pytest

import agentrl  # noqa: F401
from agentrl.engine_pool import GenerateResult, LocalEngine, SamplingParams
from agentrl.rollout import EpisodeRunner, RolloutTask
from agentrl.sft.data import ConversationError, tokenize_conversation
from agentrl.tokenization import ChatFormat, SegmentKind

pytestmark = pytest.mark.slow

ENV = "agentrl/Math-v0"
KWARGS = {
    "mode": "multi",
    "tool_format": "tags",
    "answer_format": "flexible",
    "generated_difficulty": 2,
    "sandbox": "bwrap",
}
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=256, seed=1)
SMOLLM2_TASKS = [RolloutTask(group, 0, group) for group in range(8)]
TOOL_FIRST_TASKS = [RolloutTask(group, 0, 100 + group) for group in range(8)]
TOOL_CALL = "Let me compute it.\n<python>print(6 * 7)</python>"


def make_env():
    return gymnasium.make(ENV, max_turns=3, **KWARGS)


def env_tools():
    env = make_env()
    try:
        return env.reset(seed=0)[1]["tools"]
    finally:
        env.close()


async def collect(engine, tokenizer, tasks, **kwargs):
    runner = EpisodeRunner(make_env, engine, tokenizer, SAMPLING, env_id=ENV, **kwargs)
    return await runner.collect(tasks, concurrency=len(tasks))


class ScriptedPolicy:
    """An engine that writes ``turns`` in order (the last one again if the episode goes on): the
    tokenizer's encoding of each text plus the end-of-turn token, as an engine that sampled
    exactly that would return. With ``then``, the turns after the scripted ones are that
    engine's."""

    def __init__(self, tokenizer, turns, then=None):
        self.tokenizer, self.turns, self.then = tokenizer, turns, then
        self.end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.turn: dict[str, int] = {}

    async def end_session(self, session_id):
        """Nothing is kept per session."""

    async def generate(self, input_ids, sampling, session_id=None):
        turn = self.turn.get(session_id, 0)
        self.turn[session_id] = turn + 1
        if self.then is not None and turn >= len(self.turns):
            return await self.then.generate(input_ids, sampling, session_id)
        text = self.turns[min(turn, len(self.turns) - 1)]
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end_of_turn]
        return GenerateResult(ids, [0.0] * len(ids), "stop", 0, [0] * len(ids), len(input_ids))


@pytest.fixture(scope="module")
def rollouts(smollm2, tokenizer):
    """SmolLM2's own episodes, and episodes whose first turn is a tool call and whose later
    turns SmolLM2 samples."""

    async def run():
        async with LocalEngine(smollm2, tokenizer=tokenizer, max_batch_size=16) as engine:
            tool_first = ScriptedPolicy(tokenizer, [TOOL_CALL], then=engine)
            return await asyncio.gather(
                collect(engine, tokenizer, SMOLLM2_TASKS),
                collect(tool_first, tokenizer, TOOL_FIRST_TASKS),
            )

    return asyncio.run(run())


def compare(fmt, trajectory, tools):
    """``"exact"``, ``"resampled"`` (a turn's ids are not its text's encoding) or ``"cut"`` (a
    turn ended by the token budget); asserts what must hold in each case."""
    rollout = trajectory.tokens
    sft = tokenize_conversation(fmt, trajectory.messages, tools)
    if any(turn.finish_reason != "stop" for turn in trajectory.turns):
        return "cut"
    if sft.input_ids == rollout.input_ids:
        assert sft.loss_mask == rollout.loss_mask
        return "exact"
    # the same segments in the same order: template ids equal, completions the same text
    assert [s.kind for s in sft.segments] == [s.kind for s in rollout.segments]
    for mine, theirs in zip(sft.segments, rollout.segments, strict=True):
        ids = sft.input_ids[mine.start : mine.end]
        recorded = rollout.input_ids[theirs.start : theirs.end]
        if mine.kind is SegmentKind.COMPLETION:
            assert fmt.decode(ids) == fmt.decode(recorded)
        else:
            assert ids == recorded
    return "resampled"


def test_sft_tokens_of_rollout_conversations_are_the_rollouts(rollouts, tokenizer):
    fmt, tools = ChatFormat.of(tokenizer), env_tools()
    own, tool_first = rollouts
    counts = {}
    for name, trajectories in (("smollm2", own), ("tool first", tool_first)):
        kinds = {"exact": 0, "resampled": 0, "cut": 0, "exact multi-turn": 0}
        for trajectory in trajectories:
            assert trajectory.error is None and trajectory.stop_reason in (
                "terminated",
                "truncated",
            )
            assert trajectory.messages[-1]["role"] == "assistant"
            kind = compare(fmt, trajectory, tools)
            kinds[kind] += 1
            roles = [m["role"] for m in trajectory.messages]
            if kind == "exact" and roles.count("assistant") > 1 and "tool" in roles:
                kinds["exact multi-turn"] += 1
        counts[name] = kinds
    print(counts)
    assert counts["smollm2"]["exact"] >= 1
    assert counts["tool first"]["exact multi-turn"] >= 1
    for trajectory in tool_first:  # the tool ran in the sandbox; SmolLM2 wrote what followed
        assert trajectory.messages[3] == {"role": "tool", "name": "python", "content": "42\n"}


def test_scripted_tool_episodes_through_the_runner(tokenizer):
    fmt, tools = ChatFormat.of(tokenizer), env_tools()
    tasks = [RolloutTask(group, 0, group) for group in range(4)]
    scripted = ScriptedPolicy(tokenizer, [TOOL_CALL, "So it is \\boxed{42}."])
    trajectories = asyncio.run(collect(scripted, tokenizer, tasks))
    for trajectory in trajectories:
        assert trajectory.error is None and [m["role"] for m in trajectory.messages] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        assert trajectory.messages[3]["content"].strip().endswith("42")  # the sandbox ran it
        assert compare(fmt, trajectory, tools) == "exact"


def test_an_episode_cut_by_the_context_budget_is_refused(tokenizer):
    """The budget runs out after the tool result: the episode ends with a tool message."""
    fmt, tools = ChatFormat.of(tokenizer), env_tools()
    scripted = ScriptedPolicy(tokenizer, [TOOL_CALL, "So it is \\boxed{42}."])
    (full,) = asyncio.run(collect(scripted, tokenizer, [RolloutTask(0, 0, 0)]))
    budget = full.turns[1].prompt_tokens  # the second turn's prompt fills the budget
    scripted.turn.clear()
    (cut,) = asyncio.run(
        collect(scripted, tokenizer, [RolloutTask(0, 0, 0)], max_total_tokens=budget)
    )
    assert cut.stop_reason == "context_length" and cut.truncated
    assert [m["role"] for m in cut.messages][-2:] == ["assistant", "tool"]
    with pytest.raises(ConversationError, match="ends with a 'tool' message, not an assistant"):
        tokenize_conversation(fmt, cut.messages, tools)
