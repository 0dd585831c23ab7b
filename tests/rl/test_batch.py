"""From groups of trajectories to training sequences: advantages, failures, staleness, trimming."""

from math import isnan

import pytest
import torch

from agentrl.algorithms.advantages import grpo_advantages
from agentrl.rl.batch import build_batch
from agentrl.rl.config import AlgorithmConfig, StreamConfig
from agentrl.rollout.trajectory import Trajectory
from agentrl.tokenization import TokenTrajectory
from agentrl.tokenization.trajectory import Segment, SegmentKind


def episode(group, sample, reward, versions=(0, 0), *, error=None, trailing=0):
    """A 2-token prompt, completion tokens with `versions`, then `trailing` template tokens."""
    n = len(versions)
    ids = [1, 2, *range(10, 10 + n), *([3] * trailing)]
    segments = [Segment(SegmentKind.PROMPT, 0, 2), Segment(SegmentKind.COMPLETION, 2, 2 + n)]
    if trailing:
        segments.append(Segment(SegmentKind.DELTA, 2 + n, 2 + n + trailing))
    tokens = TokenTrajectory(
        input_ids=ids,
        loss_mask=[0, 0, *[1] * n, *[0] * trailing],
        logprobs=[0.0, 0.0, *[-0.5] * n, *[0.0] * trailing],
        versions=[-1, -1, *versions, *[-1] * trailing],
        prompt_length=2,
        segments=segments,
    )
    return Trajectory("t", group, sample, group, tokens, [], reward=reward, error=error)


def test_grpo_advantages_per_group_and_sequence_columns():
    groups = [[episode(0, 0, 1.0), episode(0, 1, 0.0)], [episode(1, 0, 1.0), episode(1, 1, 1.0)]]
    batch = build_batch(groups, AlgorithmConfig(), StreamConfig(), current_version=0)
    expected = grpo_advantages(torch.tensor([1.0, 0, 1, 1]), torch.tensor([0, 0, 1, 1]))
    assert [s["advantages"] for s in batch.sequences] == pytest.approx(expected.tolist())
    assert batch.sequences[0]["input_ids"] == [1, 2, 10, 11]
    assert batch.sequences[0]["loss_mask"] == [0, 0, 1, 1]
    assert batch.metrics["reward/mean"] == 0.75
    assert batch.metrics["batch/zero_advantage_groups"] == 1
    assert batch.metrics["batch/loss_tokens"] == 8


def test_failed_episodes_leave_the_statistics_and_the_loss():
    groups = [[episode(0, 0, 1.0), episode(0, 1, 0.0), episode(0, 2, 0.0, error="env: boom")]]
    batch = build_batch(groups, AlgorithmConfig(advantage="dr_grpo"), StreamConfig(), 0)
    assert [s["advantages"] for s in batch.sequences] == [0.5, -0.5]
    assert batch.metrics["episodes/errors"] == 1


def test_trailing_tokens_off_the_mask_are_trimmed():
    batch = build_batch([[episode(0, 0, 1.0, trailing=5)]], AlgorithmConfig(), StreamConfig(), 0)
    assert batch.sequences[0]["input_ids"] == [1, 2, 10, 11]


def test_drop_removes_the_whole_group_of_a_stale_trajectory():
    stale = episode(0, 0, 1.0, versions=(1, 3))  # a partial rollout across versions 1..3
    groups = [[stale, episode(0, 1, 0.0, versions=(3, 3))], [episode(1, 0, 1.0, versions=(3, 3))]]
    batch = build_batch(groups, AlgorithmConfig(), StreamConfig(max_staleness=1), current_version=3)
    assert len(batch.sequences) == 1  # group 0 is dropped whole
    assert batch.metrics["staleness/dropped_groups"] == 1
    assert batch.metrics["staleness/staleness_max"] == 2


def test_mask_keeps_the_fresh_tokens_of_a_partial_rollout():
    groups = [[episode(0, 0, 1.0, versions=(1, 3)), episode(0, 1, 0.0, versions=(3, 3))]]
    stream = StreamConfig(max_staleness=1, staleness_mode="mask")
    batch = build_batch(groups, AlgorithmConfig(), stream, current_version=3)
    assert batch.sequences[0]["loss_mask"] == [0, 0, 0, 1]
    assert batch.metrics["staleness/masked_tokens"] == 1


def test_a_batch_with_nothing_to_train_on_is_empty_not_an_error():
    groups = [[episode(0, 0, 1.0, error="engine: dead")]]
    batch = build_batch(groups, AlgorithmConfig(), StreamConfig(), 0)
    assert batch.sequences == [] and batch.metrics["batch/sequences"] == 0


def test_reencoded_token_seams_are_counted_in_the_mismatch_metrics(tokenizer):
    from agentrl.tokenization import TrajectoryBuilder, builtin_template

    # "[/INST] " + "Hi": the seam takes the engine's first token
    builder = TrajectoryBuilder(
        tokenizer,
        [{"role": "user", "content": "x"}],
        chat_template=builtin_template("system_first_user"),
        seams="reencode",
    )
    ids = [*tokenizer.encode("Hi there", add_special_tokens=False), 0]
    builder.add_completion(ids, [-0.5] * len(ids), 0)
    tokens = builder.trajectory
    seamed = Trajectory("t", 0, 0, 0, tokens, [], reward=1.0)
    batch = build_batch([[seamed, episode(0, 1, 0.0)]], AlgorithmConfig(), StreamConfig(), 0)
    assert batch.metrics["mismatch/seam_edits"] == 1
    assert batch.metrics["mismatch/seam_engine_tokens"] == 1
    assert batch.sequences[0]["loss_mask"].count(1) == len(ids) - 1


def test_infrastructure_failures_leave_the_statistics_and_the_loss():
    judged = [episode(0, 0, 1.0), episode(0, 1, 0.0)]
    unjudged = episode(0, 2, 0.0)
    unjudged.infra_error = "no grading sandbox could start"
    batch = build_batch([[*judged, unjudged]], AlgorithmConfig(), StreamConfig(), 0)
    assert len(batch.sequences) == 2  # the 0.0 of the unjudged episode is not a reward
    assert [s["advantages"] for s in batch.sequences] == pytest.approx([0.7071, -0.7071], 1e-3)
    assert batch.metrics["episodes/infra_errors"] == 1
    assert batch.metrics["episodes/errors"] == 0
    assert batch.metrics["batch/small_groups"] == 0
    # the mean is over the judged episodes: (1 + 0) / 2, not (1 + 0 + 0) / 3
    assert batch.metrics["reward/mean"] == 0.5 and batch.metrics["episodes/judged"] == 2


@pytest.mark.parametrize(("policy", "sequences"), [("drop", 3), ("keep", 4)])
def test_groups_left_with_one_valid_sample(policy, sequences):
    lone = [episode(0, 0, 1.0), episode(0, 1, 0.0, error="engine: dead")]
    whole = [episode(1, 0, 1.0), episode(1, 1, 0.0)]
    single = [episode(2, 0, 1.0)]  # group_size 1: never a "small" group
    algorithm = AlgorithmConfig(small_groups=policy, advantage="reinforce_pp")
    batch = build_batch([lone, whole, single], algorithm, StreamConfig(), 0)
    assert batch.metrics["batch/small_groups"] == 1
    assert len(batch.sequences) == sequences


def test_metrics_per_environment():
    math = [episode(0, 0, 1.0), episode(0, 1, 0.0)]
    code = [episode(1, 0, 0.0), episode(1, 1, 0.0, error="env: boom")]
    for t in math:
        t.env_id = "agentrl/Math-v0"
    for t in code:
        t.env_id = "code"
    code[0].infra_error = "no sandbox"
    batch = build_batch([math, code], AlgorithmConfig(), StreamConfig(), 0)
    m = batch.metrics
    assert (m["env/Math-v0/episodes"], m["env/Math-v0/reward_mean"]) == (2, 0.5)
    assert (m["env/code/errors"], m["env/code/infra_errors"], m["env/code/turns_mean"]) == (1, 1, 0)
    assert isnan(m["env/code/reward_mean"])  # nothing of it was judged


def test_reinforce_pp_whitens_over_the_loss_tokens():
    # Rewards 1 and 0 with 1 and 3 completion tokens, whitened over the 4 tokens: mean 1/4,
    # variance (0.75^2 + 3 * 0.25^2) / 4 = 3/16, std 0.433013 -> 0.75 / 0.433013 = 1.732051 and
    # -0.25 / 0.433013 = -0.577350 (per trajectory, as before, it was +1 and -1).
    groups = [[episode(0, 0, 1.0, versions=(0,)), episode(0, 1, 0.0, versions=(0, 0, 0))]]
    batch = build_batch(groups, AlgorithmConfig(advantage="reinforce_pp"), StreamConfig(), 0)
    assert [s["advantages"] for s in batch.sequences] == pytest.approx(
        [3**0.5, -(3**-0.5)], rel=1e-5
    )


def test_reinforce_pp_whitens_what_the_staleness_bound_leaves():
    # Group 0 (fresh): rewards 1 and 0 on 1 and 3 tokens. Group 1 (stale at bound 0, dropped):
    # rewards 1 and 1 on 2 tokens each. Whitened over group 0's 4 tokens only: 1.732051 and
    # -0.577350 as above. Statistics over all 8 tokens (rewards 1, 0, 0, 0, 1, 1, 1, 1: mean 5/8,
    # std sqrt(15/64) = 0.484123) would give 0.774597 and -1.290994: not whitened.
    fresh = [episode(0, 0, 1.0, versions=(3,)), episode(0, 1, 0.0, versions=(3, 3, 3))]
    stale = [episode(1, 0, 1.0, versions=(2, 2)), episode(1, 1, 1.0, versions=(2, 2))]
    algorithm = AlgorithmConfig(advantage="reinforce_pp")
    batch = build_batch([fresh, stale], algorithm, StreamConfig(max_staleness=0), 3)
    assert len(batch.sequences) == 2
    assert [s["advantages"] for s in batch.sequences] == pytest.approx(
        [3**0.5, -(3**-0.5)], rel=1e-5
    )
    assert batch.metrics["advantage/mean"] == pytest.approx((3**0.5 - 3**-0.5) / 2, rel=1e-5)
    # Masking instead: a stale token leaves its trajectory's count. Rewards 1, 0 on tokens
    # (v3, v2) and (v3, v3, v3) at bound 0: counts 1 and 3 again, so the same advantages.
    masked = [episode(0, 0, 1.0, versions=(3, 2)), episode(0, 1, 0.0, versions=(3, 3, 3))]
    stream = StreamConfig(max_staleness=0, staleness_mode="mask")
    batch = build_batch([masked], algorithm, stream, 3)
    assert [s["advantages"] for s in batch.sequences] == pytest.approx(
        [3**0.5, -(3**-0.5)], rel=1e-5
    )


def test_tool_calls_are_counted_from_the_tool_messages():
    calls = [episode(0, 0, 1.0), episode(0, 1, 0.0), episode(0, 2, 0.0), episode(0, 3, 0.0)]
    tool = {"role": "tool", "name": "python", "content": "42\n"}
    calls[0].messages = [{"role": "user", "content": "?"}, tool, tool]
    calls[1].messages = [{"role": "user", "content": "?"}, tool]
    calls[2].messages = [{"role": "user", "content": "no call"}]
    assert [t.tool_calls for t in calls] == [2, 1, 0, 0]
    m = build_batch([calls], AlgorithmConfig(), StreamConfig(), 0).metrics
    assert (m["episodes/tool_calls_mean"], m["episodes/tool_use_fraction"]) == (0.75, 0.5)


def test_an_episodes_earlier_segments_train_as_sequences_with_its_advantage():
    # An agent rewrote its history once: episode (0, 0) has an earlier segment of 2 completion
    # tokens before its last one of 1. Both are trained with the episode's advantage, and the
    # token-weighted whitening counts 3 tokens for it: the same as one trajectory of 3 tokens.
    rewritten = episode(0, 0, 1.0, versions=(0,))
    rewritten.earlier = [episode(0, 0, 1.0, versions=(0, 0)).tokens]
    groups = [[rewritten, episode(0, 1, 0.0, versions=(0,))]]
    algorithm = AlgorithmConfig(advantage="reinforce_pp")
    batch = build_batch(groups, algorithm, StreamConfig(), 0)
    assert [s["input_ids"] for s in batch.sequences] == [[1, 2, 10, 11], [1, 2, 10], [1, 2, 10]]
    whole = [[episode(0, 0, 1.0, versions=(0, 0, 0)), episode(0, 1, 0.0, versions=(0,))]]
    expected = [s["advantages"] for s in build_batch(whole, algorithm, StreamConfig(), 0).sequences]
    advantages = [s["advantages"] for s in batch.sequences]
    assert advantages == pytest.approx([expected[0], expected[0], expected[1]])
    assert batch.metrics["batch/sequences"] == 3 and batch.metrics["batch/loss_tokens"] == 4
    # a stale earlier segment (versions 0, its episode's last segment and sibling at 2) drops
    # the episode's group under `drop`
    fresh = episode(0, 0, 1.0, versions=(2,))
    fresh.earlier = [episode(0, 0, 1.0, versions=(0, 0)).tokens]
    stale = [[fresh, episode(0, 1, 0.0, versions=(2,))], [episode(1, 0, 1.0, versions=(2,))]]
    batch = build_batch(stale, algorithm, StreamConfig(max_staleness=1), current_version=2)
    assert len(batch.sequences) == 1 and batch.metrics["staleness/dropped_groups"] == 1
    # under GAE each segment carries the reward on its last loss token
    batch = build_batch(groups, AlgorithmConfig(advantage="gae"), StreamConfig(), 0)
    assert [s["token_rewards"] for s in batch.sequences] == [[0, 0, 0, 1], [0, 0, 1], [0, 0, 0]]
