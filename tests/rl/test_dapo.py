"""DAPO: the soft overlong penalty, and dynamic sampling (zero-variance groups filtered, redrawn)."""

import asyncio

import pytest
import torch

from agentrl.config import ConfigError
from agentrl.rl.batch import build_batch, group_has_signal, overlong_penalties
from agentrl.rl.config import AlgorithmConfig, StreamConfig, TrainConfig
from agentrl.rollout.runner import RolloutTask
from agentrl.rollout.stream import RolloutStream
from agentrl.rollout.trajectory import Trajectory, Turn
from agentrl.tokenization import TokenTrajectory
from agentrl.tokenization.trajectory import Segment, SegmentKind


def episode(group, sample, reward, completion_tokens=2, *, turns=1, error=None):
    """A 2-token prompt, 2 loss tokens; `completion_tokens` split evenly over `turns` turns."""
    tokens = TokenTrajectory(
        input_ids=[1, 2, 10, 11],
        loss_mask=[0, 0, 1, 1],
        logprobs=[0.0, 0.0, -0.5, -0.5],
        versions=[-1, -1, 0, 0],
        prompt_length=2,
        segments=[Segment(SegmentKind.PROMPT, 0, 2), Segment(SegmentKind.COMPLETION, 2, 4)],
    )
    per_turn = [Turn(0, completion_tokens // turns, "stop", 0, 0.0) for _ in range(turns)]
    return Trajectory("t", group, sample, group, tokens, [], per_turn, reward=reward, error=error)


# -- overlong penalty -----------------------------------------------------------------------


def test_the_penalty_is_zero_then_linear_in_the_buffer_then_the_full_factor():
    # L_max = 10, L_cache = 4: free up to 6 tokens; 8 -> -(8 - 6) / 4 = -0.5; 10 -> -1; 12 -> -1
    lengths = torch.tensor([3, 6, 7, 8, 10, 12])
    penalties = overlong_penalties(lengths, max_tokens=10, buffer=4, factor=1.0)
    assert penalties.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    # factor 2: 7 -> -(7 - 6) / 4 * 2 = -0.5
    assert overlong_penalties(torch.tensor([7]), 10, 4, 2.0).tolist() == [-0.5]
    assert overlong_penalties(torch.tensor([50]), 10, 0, 1.0).tolist() == [0.0]  # off


def test_the_penalty_shapes_the_rewards_before_the_advantages():
    # L_max = max_new_tokens = 10, L_cache = 4. Rewards 1, 1 at lengths 4 and 8:
    # shaped 1 + 0 = 1 and 1 - 0.5 = 0.5; dr_grpo centres them: +0.25, -0.25
    algorithm = AlgorithmConfig(advantage="dr_grpo", overlong_buffer=4)
    groups = [[episode(0, 0, 1.0, 4), episode(0, 1, 1.0, 8)]]
    batch = build_batch(groups, algorithm, StreamConfig(), 0, max_response_tokens=10)
    assert [s["advantages"] for s in batch.sequences] == [0.25, -0.25]
    assert batch.metrics["reward/mean"] == 1.0  # the environment's reward, unshaped
    assert batch.metrics["reward/overlong_penalty_mean"] == -0.25  # (0 - 0.5) / 2
    assert batch.metrics["reward/overlong_fraction"] == 0.5
    # off by default: the same group has no signal and no penalty metric
    plain = build_batch(groups, AlgorithmConfig(advantage="dr_grpo"), StreamConfig(), 0)
    assert [s["advantages"] for s in plain.sequences] == [0.0, 0.0]
    assert "reward/overlong_penalty_mean" not in plain.metrics


def test_multi_turn_episodes_count_the_completion_tokens_of_every_turn():
    # 3 turns of 4 tokens = 12 completion tokens; overlong_max_tokens = 16, L_cache = 8:
    # free up to 8, 12 -> -(12 - 8) / 8 = -0.5 (a per-turn budget of 10 would give -1)
    algorithm = AlgorithmConfig(overlong_buffer=8, overlong_max_tokens=16, advantage="dr_grpo")
    groups = [[episode(0, 0, 0.0, 12, turns=3), episode(0, 1, 0.0, 4)]]
    batch = build_batch(groups, algorithm, StreamConfig(), 0, max_response_tokens=10)
    assert batch.metrics["reward/overlong_penalty_mean"] == -0.25  # (-0.5 + 0) / 2
    assert [s["advantages"] for s in batch.sequences] == [-0.25, 0.25]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.overlong_buffer=-1"], r"algorithm\.overlong_buffer: .*greater than or equal"),
        (
            ["rollout.max_new_tokens=64", "algorithm.overlong_buffer=65"],
            r"overlong_buffer \(65\) is larger .* rollout\.max_new_tokens \(64\)",
        ),
        (
            ["algorithm.overlong_buffer=65", "algorithm.overlong_max_tokens=64"],
            r"overlong_buffer \(65\) is larger .* algorithm\.overlong_max_tokens \(64\)",
        ),
        (["algorithm.overlong_max_tokens=64"], r"algorithm\.overlong_buffer=0 turns .* off"),
        (["algorithm.overlong_penalty=0"], r"algorithm\.overlong_penalty: .*greater than 0"),
        (["algorithm.dynamic_sampling_max_draws=0"], r"dynamic_sampling_max_draws: .*greater"),
    ],
)
def test_bad_dapo_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig.load(None, overrides)


def test_dapo_settings_load_and_default_off():
    assert AlgorithmConfig().overlong_buffer == 0 and not AlgorithmConfig().dynamic_sampling
    config = TrainConfig.load(
        None,
        [
            "rollout.max_new_tokens=64",
            "algorithm.overlong_buffer=64",
            "algorithm.dynamic_sampling=true",
        ],
    )
    assert config.algorithm.overlong_buffer == 64 and config.algorithm.dynamic_sampling


# -- dynamic sampling -----------------------------------------------------------------------


def test_a_group_has_signal_when_its_valid_rewards_differ():
    algorithm = AlgorithmConfig()
    assert group_has_signal([episode(0, 0, 1.0), episode(0, 1, 0.0)], algorithm)
    assert not group_has_signal([episode(0, 0, 1.0), episode(0, 1, 1.0)], algorithm)
    # the failed sample's reward does not count; one valid sample is no signal
    assert not group_has_signal([episode(0, 0, 1.0), episode(0, 1, 0.0, error="boom")], algorithm)
    # equal rewards made different by the overlong penalty (L_max 10, L_cache 4: 8 -> -0.5)
    shaped = AlgorithmConfig(overlong_buffer=4)
    group = [episode(0, 0, 1.0, 4), episode(0, 1, 1.0, 8)]
    assert group_has_signal(group, shaped, max_response_tokens=10)


class RewardTable:
    """A runner whose group ``g`` gets ``rewards[g]`` (one per sample); it records launches."""

    def __init__(self, rewards):
        self.rewards = rewards
        self.groups = []

    async def run(self, task: RolloutTask) -> Trajectory:
        if task.sample == 0:
            self.groups.append(task.group)
        await asyncio.sleep(0)
        return episode(task.group, task.sample, self.rewards[task.group][task.sample])


def has_signal(group):
    return group_has_signal(group, AlgorithmConfig())


async def test_zero_variance_groups_are_filtered_and_replaced():
    # groups 0 and 2 have equal rewards; 1, 3 and 4 have signal: 2 groups per step take
    # 0, 1 (0 filtered), then one more: 2 (filtered), then one more: 3
    runner = RewardTable([[1, 1], [1, 0], [0, 0], [0, 1], [1, 0], [1, 0]])
    stream = RolloutStream(runner, group_size=2, groups_per_step=2)
    stream.start()
    try:
        groups, metrics = await stream.next_groups_with_signal(has_signal, max_groups=6)
        assert [g[0].group for g in groups] == [1, 3]
        assert metrics == {
            "dynamic_sampling/drawn": 4.0,
            "dynamic_sampling/filtered": 2.0,
            "dynamic_sampling/cap_hit": 0.0,
        }
        assert runner.groups == [0, 1, 2, 3]  # replacements only as needed, nothing ahead
        assert stream.state == {"next_group": 4, "pending_groups": []}
        stream.advance()  # the next step draws from group 4 on
        groups = await stream.next_groups()
        assert [g[0].group for g in groups] == [4, 5]
    finally:
        await stream.aclose()


async def test_the_cap_stops_drawing_and_the_step_keeps_what_it_has():
    # every group but 1 has equal rewards; cap 3 groups: draws 0, 1 then 2, keeps only 1
    runner = RewardTable([[1, 1], [1, 0], [0, 0], [0, 0], [1, 0]])
    stream = RolloutStream(runner, group_size=2, groups_per_step=2)
    stream.start()
    try:
        groups, metrics = await stream.next_groups_with_signal(has_signal, max_groups=3)
        assert [g[0].group for g in groups] == [1]
        assert metrics["dynamic_sampling/drawn"] == 3
        assert metrics["dynamic_sampling/filtered"] == 2
        assert metrics["dynamic_sampling/cap_hit"] == 1
        assert runner.groups == [0, 1, 2]  # group 3 was never launched
    finally:
        await stream.aclose()


async def test_a_stop_during_dynamic_sampling_returns_the_kept_groups_to_the_queue():
    # group 1 is kept, then the replacement draw is stopped before group 2 is taken
    runner = RewardTable([[1, 1], [1, 0], [1, 0]])
    stream = RolloutStream(runner, group_size=2, groups_per_step=2)
    stream.start()
    stop = asyncio.Event()

    def stop_after(group):
        stop.set()
        return has_signal(group)

    try:
        assert await stream.next_groups_with_signal(stop_after, max_groups=4, stop=stop) is None
        assert 1 in stream.state["pending_groups"]
        stop.clear()
        groups = await stream.next_groups(count=2)
        assert sorted(g[0].group for g in groups) == [1, 2]
    finally:
        await stream.aclose()
