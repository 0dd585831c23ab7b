"""Agents as a rollout source: a user's openai-SDK agent against the real engine, its calls recorded
by the gateway as the episode's trajectory, graded by the environment; every way an episode can
fail, classified (judged, error, infra_error); aborted generations continued."""

import asyncio
from pathlib import Path

import gymnasium
import openai
import pytest

import agentrl  # noqa: F401  (registers environments)
from agentrl.config import ConfigError
from agentrl.engine_pool import LocalEngine
from agentrl.models import load_model
from agentrl.rollout import group_tasks
from agentrl.rollout.agent import AgentConfig, AgentRunner, load_agent
from agentrl.rollout.runner import RolloutTask
from agentrl.rollout.stream import RolloutStream
from agentrl.tokenization import SegmentKind

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).parents[2] / "examples" / "math_agent.py"


def math_env():
    return gymnasium.make("agentrl/Math-v0", answer_format="flexible")


def runner(agent, engine, tokenizer, **kwargs):
    kwargs = {"max_new_tokens": 24, "max_total_tokens": 1024, **kwargs}
    return AgentRunner(agent, math_env, engine, tokenizer, env_id="agentrl/Math-v0", **kwargs)


@pytest.fixture
async def tiny_engine(tiny_policy_dir, tokenizer):
    model = load_model(tiny_policy_dir)
    async with LocalEngine(model, tokenizer=tokenizer, max_batch_size=16) as engine:
        yield engine


async def test_the_example_agent_trains_on_token_exact_graded_trajectories(engine, tokenizer):
    seen = []  # (token ids the endpoint answered with, reply text) of every call

    async def recording(task, client):
        original = client.chat.completions.create

        async def create(**kwargs):
            response = await original(**kwargs)
            choice = response.choices[0]
            seen.append((task.group, task.sample, choice.model_extra["token_ids"]))
            return response

        client.chat.completions.create = create
        solve = load_agent(f"{EXAMPLE}:solve")
        return await solve(task, client)

    async with runner(recording, engine, tokenizer) as agents:
        stream = RolloutStream(agents, group_size=2, groups_per_step=2, concurrency=4)
        stream.start()
        try:
            groups = await stream.next_groups()
        finally:
            await stream.aclose()
    assert [[(t.group, t.sample) for t in g] for g in groups] == [
        [(0, 0), (0, 1)],
        [(1, 0), (1, 1)],
    ]
    for group in groups:
        assert group[0].messages[1] == group[1].messages[1]  # one task per group
        for t in group:
            assert t.judged and t.reward in (0.0, 1.0), (t.error, t.infra_error)
            assert t.stop_reason == "terminated" and "correct" in t.reward_components
            tokens = t.tokens
            calls = [ids for g, s, ids in seen if (g, s) == (t.group, t.sample)]
            assert 1 <= len(t.turns) == len(calls) <= 3
            # the trained ids are the ids the endpoint answered with, call by call, mask 1
            completions = [p for p in tokens.segments if p.kind is SegmentKind.COMPLETION]
            assert [tokens.input_ids[p.start : p.end] for p in completions] == calls
            assert sum(tokens.loss_mask) == t.completion_tokens == sum(map(len, calls))
            assert all(tokens.versions[i] == 0 for p in completions for i in range(p.start, p.end))
            assert all(turn.completion_tokens <= 24 for turn in t.turns)  # agent asked 96
    assert agents.metrics() == {
        "agent/episodes": 4.0,
        "agent/segments_dropped": 0.0,
        "agent/segments_earlier": 0.0,
        "agent/splits": 0.0,
    }


async def test_a_rewritten_history_trains_every_segment_and_siblings_none(tiny_engine, tokenizer):
    """Call 0, then call 1 on a rewritten history (its reply dropped: a new segment), then call 2
    extending it with n=2: the episode trains call 0's segment as earlier history and calls 1-2's
    as its trajectory; choice 1 of call 2, a sibling the agent did not follow, is not trained."""
    replies = []

    async def summarising(task, client):
        first = await client.chat.completions.create(model=task.model, messages=task.messages)
        replies.append(first.choices[0].model_extra["token_ids"])
        question = task.messages[-1]["content"]
        history = [*task.messages[:-1], {"role": "user", "content": f"In short: {question}"}]
        second = await client.chat.completions.create(model=task.model, messages=history)
        replies.append(second.choices[0].model_extra["token_ids"])
        history += [
            {"role": "assistant", "content": second.choices[0].message.content or ""},
            {"role": "user", "content": "Go on."},
        ]
        third = await client.chat.completions.create(model=task.model, messages=history, n=2)
        replies.append(third.choices[0].model_extra["token_ids"])
        return 0.5

    async with runner(summarising, tiny_engine, tokenizer, max_new_tokens=8) as agents:
        trajectory = await agents.run(group_tasks(1, 1)[0])
    assert trajectory.judged and trajectory.reward == 0.5, trajectory.error
    (earlier,) = trajectory.earlier
    pieces = [
        [t.input_ids[p.start : p.end] for p in t.segments if p.kind is SegmentKind.COMPLETION]
        for t in (earlier, trajectory.tokens)
    ]
    assert pieces == [replies[:1], replies[1:]]
    assert len(trajectory.turns) == 3
    assert trajectory.completion_tokens == sum(map(len, replies))
    metrics = agents.metrics()
    assert (metrics["agent/segments_earlier"], metrics["agent/segments_dropped"]) == (1.0, 1.0)


async def test_the_trainers_sampling_wins_over_the_agents(tiny_engine, tokenizer):
    async def greedy_and_long(task, client):
        response = await client.chat.completions.create(
            model=task.model, messages=task.messages, temperature=0.0, max_tokens=500
        )
        return response.choices[0].message.content or ""

    async with runner(greedy_and_long, tiny_engine, tokenizer, max_new_tokens=12) as agents:
        trajectories = await asyncio.gather(*(agents.run(t) for t in group_tasks(1, 4)))
    assert all(t.judged and t.turns[0].completion_tokens <= 12 for t in trajectories)
    # sampled at the trainer's temperature 1.0: four draws from one prompt are not all greedy
    assert len({tuple(t.tokens.input_ids) for t in trajectories}) > 1


async def test_each_kind_of_failure_is_classified(tiny_engine, tokenizer):
    async def one_call(task, client):
        await client.chat.completions.create(model=task.model, messages=task.messages)

    async def raises(task, client):
        await one_call(task, client)
        raise ValueError("the agent's own bug")

    async def returns_a_reward(task, client):
        await one_call(task, client)
        return 0.25

    async def returns_a_dict(task, client):
        await one_call(task, client)
        return {"answer": 1}

    async def never_calls(task, client):
        return "42"

    async def too_slow(task, client):
        await one_call(task, client)
        await asyncio.sleep(30)

    async def outgrows_the_context(task, client):
        await one_call(task, client)
        filler = {"role": "user", "content": "words " * 2000}
        await client.chat.completions.create(model=task.model, messages=[*task.messages, filler])

    task = RolloutTask(0, 0, 7)
    results = {}
    for agent in (raises, returns_a_reward, returns_a_dict, never_calls, outgrows_the_context):
        async with runner(agent, tiny_engine, tokenizer) as agents:
            results[agent.__name__] = await agents.run(task)
    async with runner(too_slow, tiny_engine, tokenizer, timeout_s=2) as agents:
        results["too_slow"] = await agents.run(task)

    assert results["raises"].error == "agent: ValueError: the agent's own bug"
    assert results["raises"].infra_error is None and results["raises"].tokens.input_ids
    assert results["returns_a_reward"].judged and results["returns_a_reward"].reward == 0.25
    assert "returned dict" in results["returns_a_dict"].error
    assert results["never_calls"].error == "agent: it made no chat call in its session"
    assert "agent.timeout_s=2" in results["too_slow"].error
    overflow = results["outgrows_the_context"]  # the policy's doing: judged, reward 0
    assert overflow.judged and overflow.truncated and overflow.reward == 0.0
    assert overflow.stop_reason == "context_length" and len(overflow.turns) == 1


async def test_a_dead_engine_is_an_infra_error_whatever_the_agent_does(tokenizer, tiny_policy_dir):
    async def gives_up(task, client):
        await client.chat.completions.create(model=task.model, messages=task.messages)

    async def swallows_it(task, client):
        try:
            await gives_up(task, client)
        except openai.APIError:
            return 1.0

    model = load_model(tiny_policy_dir)
    engine = LocalEngine(model, tokenizer=tokenizer)
    await engine.start()
    await engine.aclose()
    for agent, raised in ((gives_up, True), (swallows_it, False)):
        async with runner(agent, engine, tokenizer) as agents:
            trajectory = await agents.run(RolloutTask(0, 0, 0))
        assert not trajectory.judged and trajectory.error is None
        assert trajectory.infra_error.startswith(
            "agent: InternalServerError" if raised else "gateway: HTTP 503"
        )


async def test_an_aborted_generation_is_continued_into_one_reply(tiny_engine, tokenizer):
    replies = []

    async def one_long_call(task, client):
        response = await client.chat.completions.create(
            model=task.model, messages=task.messages, max_tokens=64, seed=3
        )
        replies.append(response.choices[0])
        return 0.0

    async with runner(one_long_call, tiny_engine, tokenizer, max_new_tokens=64) as agents:
        episode = asyncio.create_task(agents.run(RolloutTask(0, 0, 0)))
        while tiny_engine.stats.tokens_generated < 5:  # mid-generation
            await asyncio.sleep(0.001)
        await tiny_engine.pause()
        await tiny_engine.abort()
        await tiny_engine.update_weights([], version=1)
        await tiny_engine.resume()
        trajectory = await episode
    assert trajectory.judged and replies[0].finish_reason != "abort"
    tokens = trajectory.tokens
    versions = [v for v, m in zip(tokens.versions, tokens.loss_mask, strict=True) if m]
    assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
    assert len(versions) == len(replies[0].model_extra["token_ids"])


def test_agents_are_named_as_module_or_file_and_refused_clearly(tmp_path, monkeypatch):
    (tmp_path / "my_agent.py").write_text(
        "async def solve(task, client):\n    return 1.0\n\ndef blocking(task, client):\n    return 1.0\n"
    )
    monkeypatch.chdir(tmp_path)
    assert load_agent("my_agent:solve").__name__ == "solve"
    assert load_agent(f"{tmp_path}/my_agent.py:solve").__name__ == "solve"
    with pytest.raises(ConfigError, match=r"agent\.entry 'my_agent:missing'"):
        load_agent("my_agent:missing")
    with pytest.raises(ConfigError, match="not an async function"):
        load_agent("my_agent:blocking")
    with pytest.raises(ConfigError, match=r"agent\.entry 'nowhere\.py:solve'"):
        load_agent("nowhere.py:solve")
    with pytest.raises(ValueError, match="module:function"):
        AgentConfig(entry="no_colon")


async def test_a_call_still_running_when_its_agent_times_out_leaves_no_session(
    tiny_engine, tokenizer
):
    async def stuck(task, client):
        await client.chat.completions.create(model=task.model, messages=task.messages)

    async with runner(stuck, tiny_engine, tokenizer, timeout_s=1) as agents:
        await tiny_engine.pause()  # the call waits until the episode has timed out
        trajectory = await agents.run(RolloutTask(0, 0, 0))
        assert "agent.timeout_s=1" in trajectory.error
        await tiny_engine.resume()
        for _ in range(500):  # the call finishes and its session is dropped, not kept open
            if not agents._running:
                break
            await asyncio.sleep(0.01)
        assert len(agents.gateway.sessions) == 0 and not agents._running
        assert tiny_engine.prefix_cache.tokens == 0  # and the engine was told: its KV is gone
