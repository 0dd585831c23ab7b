import asyncio

import gymnasium
import pytest
from agentrl_echo import EchoEnv
from hypothesis import given
from hypothesis import strategies as st

from agentrl.envs import (
    AgentWrapper,
    EpisodeGuard,
    ObservationLengthLimit,
    RewardShaping,
    TurnLimit,
)
from agentrl.envs.wrappers import truncate_middle


def test_turn_limit_truncates_after_max_turns():
    env = TurnLimit(EchoEnv(attempts=10), max_turns=2)
    env.reset(seed=0)
    assert env.step("no")[3] is False
    _, _, terminated, truncated, _ = env.step("no")
    assert (terminated, truncated) == (False, True)
    env.reset(seed=0)
    assert env.step("no")[3] is False, "the count restarts at reset"


class FinalTurnProbe(EchoEnv):
    """Records, at each step, whether the turn limit said it was the last."""

    seen: list[bool]

    async def astep(self, action):
        self.seen.append(self.final_turn)
        return await super().astep(action)


def test_turn_limit_tells_the_env_which_step_is_the_last():
    inner = FinalTurnProbe(attempts=10)
    inner.seen = []
    env = TurnLimit(inner, max_turns=3)
    env.reset(seed=0)
    for _ in range(3):
        env.step("no")
    env.reset(seed=0)
    assert inner.final_turn is False, "reset clears it"
    env.step("no")
    assert inner.seen == [False, False, True, False]
    assert EchoEnv().final_turn is False, "without a turn limit no step is marked"


def test_turn_limit_does_not_truncate_a_terminated_step():
    env = TurnLimit(EchoEnv(), max_turns=1)
    obs, _ = env.reset(seed=0)
    word = obs[0]["content"].split("'")[1]
    assert env.step(word)[2:4] == (True, False)


def test_observation_length_limit_cuts_env_messages_only():
    env = ObservationLengthLimit(EchoEnv(), max_chars=64)
    obs, _ = env.reset(seed=0)
    obs, _, _, _, info = env.step("x" * 10)
    assert all(len(m["content"]) <= 64 for m in obs)
    assert "observation_chars_cut" not in info  # feedback is short

    long_env = ObservationLengthLimit(LongFeedback(EchoEnv()), max_chars=100)
    long_env.reset(seed=0)
    obs, _, _, _, info = long_env.step("x")
    assert len(obs[0]["content"]) <= 100
    assert info["observation_chars_cut"] > 0
    assert obs[0]["content"].startswith("No.") and "characters truncated" in obs[0]["content"]


class LongFeedback(AgentWrapper):
    """Appends a long tail to the environment's feedback."""

    async def astep(self, action):
        obs, reward, terminated, truncated, info = await self.env.astep(action)
        return (
            [{**m, "content": m["content"] + "z" * 500} for m in obs],
            reward,
            terminated,
            truncated,
            info,
        )


@given(st.text(), st.integers(min_value=64, max_value=400))
def test_truncate_middle_respects_the_limit_and_keeps_ends(text, max_chars):
    out, cut = truncate_middle(text, max_chars)
    assert len(out) <= max_chars
    if len(text) <= max_chars:
        assert (out, cut) == (text, 0)
    else:
        keep = max_chars - 48
        assert out.startswith(text[: keep - keep // 2])
        assert out.endswith(text[len(text) - keep // 2 :])
        assert cut == len(text) - (keep - keep // 2) - keep // 2


def test_reward_shaping_keeps_raw_reward():
    env = RewardShaping(EchoEnv(), lambda r, info: r - 0.5)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("no")
    assert reward == -0.5 and info["raw_reward"] == 0.0


def test_episode_guard_rejects_out_of_order_steps():
    env = EpisodeGuard(EchoEnv(attempts=1))
    with pytest.raises(gymnasium.error.ResetNeeded, match="before reset"):
        env.step("x")
    env.reset(seed=0)
    assert env.step("x")[2] is True
    with pytest.raises(gymnasium.error.ResetNeeded, match="after the episode ended"):
        env.step("x")


def test_wrappers_work_through_async_verbs():
    async def run():
        env = TurnLimit(RewardShaping(EchoEnv(attempts=5), lambda r, i: r + 1), max_turns=1)
        await env.areset(seed=0)
        return await env.astep("no")

    _, reward, _, truncated, _ = asyncio.run(run())
    assert reward == 1.0 and truncated is True


def test_wrapping_a_plain_gymnasium_env_is_refused():
    with pytest.raises(TypeError, match="wraps an AgentEnv"):
        TurnLimit(gymnasium.make("CartPole-v1"), 3)


def test_bad_wrapper_arguments():
    with pytest.raises(ValueError, match="max_turns"):
        TurnLimit(EchoEnv(), 0)
    with pytest.raises(ValueError, match="max_chars"):
        ObservationLengthLimit(EchoEnv(), 10)
