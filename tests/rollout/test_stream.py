"""The rollout stream: launch allowance (staleness), group-complete batches, stop, data position."""

import asyncio

import gymnasium
import pytest

import agentrl  # noqa: F401  (registers environments)
from agentrl.engine_pool import LocalEngine, SamplingParams
from agentrl.models import load_model
from agentrl.rollout.runner import EpisodeRunner, RolloutTask
from agentrl.rollout.stream import RolloutStream


@pytest.fixture
async def tiny_engine(tiny_policy_dir, tokenizer):
    model = load_model(tiny_policy_dir)
    async with LocalEngine(model, tokenizer=tokenizer, max_batch_size=16) as engine:
        yield engine


def make_runner(engine, tokenizer, make_env=None, **kwargs):
    return EpisodeRunner(
        make_env or (lambda: gymnasium.make("agentrl/Math-v0")),
        engine,
        tokenizer,
        SamplingParams(max_new_tokens=4, seed=0),
        env_id="agentrl/Math-v0",
        **kwargs,
    )


async def settle(stream):
    for _ in range(200):
        await asyncio.sleep(0.01)
        if stream.in_flight == 0:
            return


async def test_synchronous_mode_launches_one_batch_per_weight_update(tiny_engine, tokenizer):
    stream = RolloutStream(make_runner(tiny_engine, tokenizer), group_size=2, groups_per_step=3)
    stream.start()
    try:
        assert not stream.idle  # its launches are allowed, if not made yet
        groups = await stream.next_groups()
        assert [g[0].group for g in groups] == [0, 1, 2]
        assert all([t.sample for t in g] == [0, 1] for g in groups)
        assert all(t.seed == g[0].group for g in groups for t in g)  # one prompt per group
        await settle(stream)
        assert stream.in_flight == 0 and stream.ready == 0  # nothing before the update
        assert stream.idle  # and nothing will start: what lets a trainer free the engine
        assert stream.state == {"next_group": 3, "pending_groups": []}
        stream.advance()
        assert not stream.idle
        groups = await stream.next_groups()
        assert [g[0].group for g in groups] == [3, 4, 5]
    finally:
        await stream.aclose()


async def test_a_staleness_bound_of_one_runs_one_step_ahead(tiny_engine, tokenizer):
    runner = make_runner(tiny_engine, tokenizer)
    stream = RolloutStream(runner, group_size=1, groups_per_step=2, max_staleness=1)
    stream.start()
    try:
        consumed = {g[0].group for g in await stream.next_groups()}  # the first two to finish
        await settle(stream)
        assert stream.ready == 2  # the next step's groups ran meanwhile
        pending = sorted({0, 1, 2, 3} - consumed)
        assert stream.state == {"next_group": 4, "pending_groups": pending}
        stop = asyncio.Event()
        stop.set()
        assert await stream.next_groups(stop) is None  # a stop request wins over ready groups
        assert stream.ready == 2
    finally:
        await stream.aclose()


async def test_stop_interrupts_the_wait_and_keeps_the_groups(tiny_engine, tokenizer):
    stream = RolloutStream(make_runner(tiny_engine, tokenizer), group_size=1, groups_per_step=4)
    stop = asyncio.Event()
    await tiny_engine.pause()  # nothing can finish
    stream.start()
    try:
        waiting = asyncio.create_task(stream.next_groups(stop))
        await asyncio.sleep(0.1)
        stop.set()
        assert await waiting is None
        assert stream.state["pending_groups"] == [0, 1, 2, 3]
    finally:
        await stream.aclose()
        await tiny_engine.resume()


async def test_resumed_stream_relaunches_pending_groups_first(tiny_engine, tokenizer):
    stream = RolloutStream(
        make_runner(tiny_engine, tokenizer),
        group_size=1,
        groups_per_step=2,
        next_group=7,
        pending_groups=[5],
    )
    stream.start()
    try:
        assert [g[0].group for g in await stream.next_groups()] == [5, 7]
    finally:
        await stream.aclose()


async def test_an_environment_that_cannot_be_made_fails_the_wait_clearly(tiny_engine, tokenizer):
    def broken():
        raise OSError("dataset file vanished")

    stream = RolloutStream(
        make_runner(tiny_engine, tokenizer, make_env=broken), group_size=1, groups_per_step=1
    )
    stream.start()
    try:
        with pytest.raises(RuntimeError, match="dataset file vanished"):
            await stream.next_groups()
    finally:
        await stream.aclose()


async def test_aborted_turns_continue_under_new_weights(tiny_engine, tokenizer):
    """Partial rollouts with abort: the turn keeps its tokens and finishes under version 1."""
    sampling = SamplingParams(max_new_tokens=64, ignore_eos=True, seed=3)
    runner = EpisodeRunner(
        lambda: gymnasium.make("agentrl/Math-v0"),
        tiny_engine,
        tokenizer,
        sampling,
        resume_aborted=True,
    )
    episode = asyncio.create_task(runner.run(RolloutTask(0, 0, 0)))
    while tiny_engine.stats.tokens_generated < 5:  # mid-generation
        await asyncio.sleep(0.001)
    await tiny_engine.pause()
    await tiny_engine.abort()
    await tiny_engine.update_weights([], version=1)
    await tiny_engine.resume()
    trajectory = await episode
    assert trajectory.error is None
    turn = trajectory.turns[0]
    assert turn.pieces == 2 and turn.completion_tokens == 64 and turn.finish_reason == "length"
    versions = [
        v for v, m in zip(trajectory.tokens.versions, trajectory.tokens.loss_mask, strict=True) if m
    ]
    assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
