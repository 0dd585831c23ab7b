"""Rollouts with the real SmolLM2 engine and real environments."""

import asyncio

import gymnasium
import pytest
from agentrl_echo import EchoEnv

import agentrl  # noqa: F401
from agentrl.engine_pool import LocalEngine, SamplingParams
from agentrl.envs import AgentWrapper
from agentrl.rollout import EpisodeRunner, Trajectory, group_tasks

pytestmark = pytest.mark.slow

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=24, seed=1)


def math_runner(engine, tokenizer, **kwargs):
    return EpisodeRunner(
        lambda: gymnasium.make("agentrl/Math-v0", mode="multi", max_turns=2),
        engine,
        tokenizer,
        SAMPLING,
        env_id="agentrl/Math-v0",
        **kwargs,
    )


def assert_token_exact(trajectory, tokenizer):
    tokens = trajectory.tokens
    n = len(tokens.input_ids)
    assert len(tokens.loss_mask) == len(tokens.logprobs) == len(tokens.versions) == n
    engine_tokens = sum(tokens.loss_mask)
    assert engine_tokens == trajectory.completion_tokens
    assert all(v == 0 for v, m in zip(tokens.versions, tokens.loss_mask, strict=True) if m)
    for turn in trajectory.turns:
        assert turn.prompt_tokens < n


async def test_groups_share_a_prompt_and_differ_in_samples(engine, tokenizer):
    runner = math_runner(engine, tokenizer)
    trajectories = await runner.collect(group_tasks(2, group_size=3, seed=5), concurrency=8)
    assert [(t.group, t.sample) for t in trajectories] == [
        (g, s) for g in range(2) for s in range(3)
    ]
    for t in trajectories:
        assert t.error is None and t.turns and t.stop_reason in ("terminated", "truncated")
        assert_token_exact(t, tokenizer)
    first = [t for t in trajectories if t.group == 0]
    assert len({t.messages[1]["content"] for t in first}) == 1, "same problem within a group"
    assert len({tuple(t.tokens.input_ids) for t in first}) > 1, "different samples"
    assert trajectories[0].messages[1] != trajectories[3].messages[1]


class ExplodingEnv(AgentWrapper):
    async def astep(self, action):
        raise RuntimeError("env exploded")


class Recording:
    """The engine, recording what the runner asks of it."""

    def __init__(self, engine):
        self.engine = engine
        self.fed, self.sampled, self.ended = [], [], []

    async def generate(self, input_ids, sampling, session_id=None):
        self.fed.append((session_id, list(input_ids)))
        self.sampled.append(sampling)
        return await self.engine.generate(input_ids, sampling, session_id)

    async def end_session(self, session_id):
        self.ended.append(session_id)
        await self.engine.end_session(session_id)


async def test_prompt_of_each_turn_is_a_prefix_of_the_final_ids(engine, tokenizer):
    recording = Recording(engine)
    runner = EpisodeRunner(lambda: EchoEnv(attempts=3), recording, tokenizer, SAMPLING)
    (trajectory,) = await runner.collect(group_tasks(1))
    ids = trajectory.tokens.input_ids
    assert len(recording.fed) == len(trajectory.turns) >= 1
    for _, prompt in recording.fed:
        assert ids[: len(prompt)] == prompt


async def test_an_ended_episode_leaves_nothing_in_the_engines_prefix_cache(engine, tokenizer):
    """Each episode, however it ends, ends its session on the engine once, which drops the
    episode's prefix-cache entry; its later turns were served from that entry while it ran."""
    recording = Recording(engine)
    runner = EpisodeRunner(
        lambda: EchoEnv(attempts=3),
        recording,
        tokenizer,
        SamplingParams(temperature=1.0, max_new_tokens=4, seed=1),  # too short to echo: 3 turns
    )
    trajectories = await runner.collect(group_tasks(2, group_size=2))
    assert all(len(t.turns) > 1 and t.error is None for t in trajectories)
    assert engine.stats.prefix_hit_tokens > 0, "later turns reused the earlier turns' KV"
    sessions = {session for session, _ in recording.fed}
    assert len(sessions) == 4 and sorted(recording.ended) == sorted(sessions)
    assert engine.prefix_cache.tokens == 0

    failing = Recording(engine)
    runner = EpisodeRunner(lambda: ExplodingEnv(EchoEnv()), failing, tokenizer, SAMPLING)
    (trajectory,) = await runner.collect(group_tasks(1))
    assert trajectory.error == "env: RuntimeError: env exploded"
    assert failing.ended == [failing.fed[0][0]] and engine.prefix_cache.tokens == 0


async def test_env_and_engine_errors_are_recorded_not_raised(engine, tokenizer):
    runner = EpisodeRunner(lambda: ExplodingEnv(EchoEnv()), engine, tokenizer, SAMPLING)
    (trajectory,) = await runner.collect(group_tasks(1))
    assert trajectory.error == "env: RuntimeError: env exploded"
    assert trajectory.turns and sum(trajectory.tokens.loss_mask) > 0, "tokens so far are kept"

    bad = SamplingParams(max_new_tokens=8, stop_token_ids=(), seed=0)
    closed = LocalEngine(engine.model, tokenizer=tokenizer)
    await closed.aclose()
    runner = EpisodeRunner(EchoEnv, closed, tokenizer, bad)
    trajectories = await runner.collect(group_tasks(3))
    assert all(t.error and t.error.startswith("engine:") for t in trajectories)


async def test_context_budget_bounds_every_generation(engine, tokenizer):
    prompt = (await math_runner(engine, tokenizer, max_total_tokens=10).collect(group_tasks(1)))[0]
    assert prompt.truncated and prompt.stop_reason == "context_length" and not prompt.turns

    budget = prompt.tokens.prompt_length + 30
    runner = math_runner(engine, tokenizer, max_total_tokens=budget)
    trajectories = await runner.collect(group_tasks(4))
    for t in trajectories:
        assert t.turns and t.error is None
        assert all(turn.prompt_tokens + turn.completion_tokens <= budget for turn in t.turns)
        if t.stop_reason == "context_length":
            assert t.truncated


async def test_concurrency_limit_is_respected(engine, tokenizer):
    active = peak = 0

    class Counting(AgentWrapper):
        async def areset(self, *, seed=None, options=None):
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            return await self.env.areset(seed=seed, options=options)

        async def aclose(self):
            nonlocal active
            active -= 1
            await self.env.aclose()

    runner = EpisodeRunner(lambda: Counting(EchoEnv(attempts=1)), engine, tokenizer, SAMPLING)
    trajectories = await runner.collect(group_tasks(9), concurrency=3)
    assert len(trajectories) == 9 and peak == 3 and active == 0


async def test_stream_groups_yields_whole_groups(engine, tokenizer):
    runner = EpisodeRunner(lambda: EchoEnv(attempts=1), engine, tokenizer, SAMPLING)
    groups = [g async for g in runner.stream_groups(group_tasks(3, group_size=2), concurrency=4)]
    assert sorted(g[0].group for g in groups) == [0, 1, 2]
    assert all([t.sample for t in g] == [0, 1] for g in groups)
    await asyncio.sleep(0)


async def test_template_policy_and_seams_reach_the_builder(engine, tokenizer):
    import copy

    from agentrl.tokenization import builtin_template

    # a generation prompt ending in "\n\n" (as Llama 3's): one token at the end of a prompt, two
    # once the generated text follows it
    seamed = copy.deepcopy(tokenizer)
    seamed.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n\\n' + m['content'] }}"
        "{{ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n\\n' }}{% endif %}"
    )
    runner = math_runner(engine, seamed, seams="reencode")
    trajectories = await runner.collect(group_tasks(1, group_size=4, seed=3))
    assert all(t.error is None for t in trajectories)
    assert any(t.tokens.seams for t in trajectories)
    for t in trajectories:
        for e in t.tokens.seams:  # the prompt's "\n\n" (and any engine id merged with it)
            new = t.tokens.input_ids[e.start : e.end]
            assert e.replaced[0] == 1116 and new != list(e.replaced)
            assert seamed.decode(new) == seamed.decode(list(e.replaced))
            assert t.tokens.loss_mask[e.start : e.end] == [0] * len(new)

    strict = copy.deepcopy(tokenizer)
    strict.chat_template = builtin_template("reasoning_stripped")
    (t,) = await math_runner(engine, strict, template_policy="strict").collect(group_tasks(1))
    assert t.error.startswith("tokenization: TemplateNotAppendOnlyError")
    assert "reasoning_dropped" in t.error and not t.turns


async def test_a_grading_infrastructure_failure_is_excluded_from_the_loss(engine, tokenizer):
    from agentrl.envs import AgentWrapper
    from agentrl.envs.code import CodeEnv, load_problems
    from agentrl.rl.batch import build_batch
    from agentrl.rl.config import AlgorithmConfig, StreamConfig
    from agentrl.tools import SandboxPool, sandbox_factory

    problem = load_problems()[0]
    solution = f"```python\n{problem.prompt}{problem.canonical_solution}```"

    class Submits(AgentWrapper):
        """Submits the reference solution whatever the model wrote (the model is not under test)."""

        async def astep(self, action):
            return await self.env.astep(solution)

    pool = SandboxPool(sandbox_factory("bwrap"), warm=0)
    await pool.close()  # no grading sandbox can start: an infrastructure failure
    runner = EpisodeRunner(
        lambda: Submits(CodeEnv(sandbox_pool=pool)),
        engine,
        tokenizer,
        SAMPLING,
        env_id="agentrl/Code-v0",
    )
    trajectories = await runner.collect(group_tasks(1, group_size=2))
    for t in trajectories:
        assert t.error is None and t.reward == 0.0 and "pool is closed" in t.infra_error
        assert type(t).from_record(t.to_record()).infra_error == t.infra_error
    batch = build_batch([trajectories], AlgorithmConfig(), StreamConfig(), 0)
    assert batch.sequences == [] and batch.metrics["episodes/infra_errors"] == 2
    assert batch.metrics["batch/small_groups"] == 1


class AsksToStop(AgentWrapper):
    """An environment whose reset info asks for stop strings, as Search-R1's protocol does, and
    tags its task."""

    def __init__(self, env, stop, tags=None):
        super().__init__(env)
        self.stop, self.tags = stop, tags or {"kind": "echo"}

    async def areset(self, *, seed=None, options=None):
        messages, info = await self.env.areset(seed=seed, options=options)
        return messages, {**info, "stop": self.stop, "tags": self.tags}


async def test_the_environments_stop_strings_end_its_turns_token_exactly(engine, tokenizer):
    recording = Recording(engine)
    runner = EpisodeRunner(
        lambda: AsksToStop(EchoEnv(attempts=3), [" ", "."]),
        recording,
        tokenizer,
        SamplingParams(temperature=1.0, max_new_tokens=24, seed=1, stop=("\n", " ")),
    )
    trajectories = await runner.collect(group_tasks(2, group_size=2))
    assert {s.stop for s in recording.sampled} == {
        ("\n", " ", ".")
    }  # the runner's first, each once
    turns = [turn for t in trajectories for turn in t.turns]
    assert any(turn.finish_reason == "stop" for turn in turns)
    for trajectory in trajectories:
        assert trajectory.error is None and trajectory.tags == {"kind": "echo"}
        assert Trajectory.from_record(trajectory.to_record()).tags == {"kind": "echo"}
        assert_token_exact(trajectory, tokenizer)
        ids, mask = trajectory.tokens.input_ids, trajectory.tokens.loss_mask
        for turn in trajectory.turns:
            completion = ids[turn.prompt_tokens : turn.prompt_tokens + turn.completion_tokens]
            assert all(mask[turn.prompt_tokens : turn.prompt_tokens + turn.completion_tokens])
            if turn.finish_reason == "stop" and completion[-1] != tokenizer.eos_token_id:
                text = tokenizer.decode(completion)
                assert any(s in text for s in ("\n", " ", ".")), text
                assert not any(s in tokenizer.decode(completion[:-1]) for s in ("\n", " ", "."))

    runner = EpisodeRunner(lambda: AsksToStop(EchoEnv(), "</search>"), engine, tokenizer, SAMPLING)
    (trajectory,) = await runner.collect(group_tasks(1))
    assert trajectory.error is not None and trajectory.error.startswith("env: ResetInfoError")
    assert "list of non-empty strings" in trajectory.error
    runner = EpisodeRunner(
        lambda: AsksToStop(EchoEnv(), [], tags={"level": 3}), engine, tokenizer, SAMPLING
    )
    (trajectory,) = await runner.collect(group_tasks(1))
    assert trajectory.error is not None and "must map strings to strings" in trajectory.error
