import asyncio

import gymnasium
import pytest
from agentrl_echo import EchoEnv
from gymnasium.utils.env_checker import check_env

from agentrl.envs import AgentEnv, AssistantText, ChatMessages


def test_sync_and_async_forms_agree():
    sync_env, async_env = EchoEnv(), EchoEnv()
    obs, info = sync_env.reset(seed=7)
    aobs, ainfo = asyncio.run(async_env.areset(seed=7))
    assert obs == aobs and info == ainfo
    assert sync_env.step("nope") == asyncio.run(async_env.astep("nope"))


def test_step_result_is_gymnasium_five_tuple():
    env = EchoEnv()
    obs, _ = env.reset(seed=0)
    word = obs[0]["content"].split("'")[1]
    new_obs, reward, terminated, truncated, info = env.step(f"{word}!")
    assert (new_obs, reward, terminated, truncated, info) == ([], 1.0, True, False, {})
    assert type(terminated) is bool and type(truncated) is bool


def test_sync_forms_refuse_to_run_inside_an_event_loop():
    env = EchoEnv()

    async def call_sync():
        env.reset(seed=0)

    with pytest.raises(RuntimeError, match=r"await env\.areset"):
        asyncio.run(call_sync())


def test_close_is_idempotent_and_env_reusable_after_close():
    env = EchoEnv()
    env.reset(seed=0)
    env.close()
    env.close()
    assert env.reset(seed=0)[0]


def test_custom_env_passes_check_env(strict_gymnasium_warnings):
    check_env(EchoEnv(), skip_close_check=True, skip_render_check=True)


def test_astep_not_implemented_on_base():
    with pytest.raises(NotImplementedError):
        AgentEnv().step("x")


@pytest.mark.parametrize("space", [ChatMessages(), AssistantText()])
def test_spaces_contain_their_samples(space):
    space.seed(3)
    for _ in range(50):
        assert space.sample() in space


def test_chat_messages_rejects_malformed():
    space = ChatMessages(roles=("user",))
    assert [{"role": "user", "content": "hi"}] in space
    assert [{"role": "assistant", "content": "hi"}] not in space
    assert [{"role": "user", "content": 3}] not in space
    assert [{"role": "user", "content": "x", "extra": 1}] not in space
    assert {"role": "user", "content": "x"} not in space
    assert [{"role": "user", "content": "x", "name": "n", "tool_call_id": "1"}] in ChatMessages()


def test_gymnasium_is_the_base_class():
    assert issubclass(AgentEnv, gymnasium.Env)
