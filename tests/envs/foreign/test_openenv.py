"""``agentrl/OpenEnv-v0`` against OpenEnv's echo environment on OpenEnv's own server
(``openenv_echo_server.py`` in ``.venv-openenv``, made by ``scripts/setup-openenv-env``): the
mapping of text and observations, token-exact rollouts with SmolLM2 in which the server echoes
exactly the decoded text, and one training step through ``agentrl train``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import gymnasium
import pytest
from foreign_checks import assert_token_exact, train_one_step

from agentrl.config import ConfigError
from agentrl.engine_pool import SamplingParams
from agentrl.engine_pool.sglang_engine import free_port
from agentrl.rollout import EpisodeRunner, group_tasks

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
SIDE_VENV = ROOT / ".venv-openenv"
SERVER = Path(__file__).with_name("openenv_echo_server.py")
ECHO = {"action_field": "message", "observation_field": "echoed_message"}


@pytest.fixture(scope="module")
def echo_url(tmp_path_factory):
    """OpenEnv's echo environment served by OpenEnv's create_app (8 sessions); its URL."""
    if not (SIDE_VENV / ".openenv-env-installed").exists():
        pytest.fail(f"the openenv venv is missing ({SIDE_VENV}): run scripts/setup-openenv-env")
    port = free_port()
    workdir = tmp_path_factory.mktemp("echo")
    command = [SIDE_VENV / "bin" / "python", SERVER, workdir, str(port), "8"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        pytest.fail(f"the echo server did not start: {line}{process.communicate()[1]}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


async def test_text_goes_into_the_action_field_and_the_observation_comes_back(echo_url):
    env = gymnasium.make("agentrl/OpenEnv-v0", url=echo_url, system_prompt="Say hi.", **ECHO)
    try:
        messages, info = await env.areset(seed=0)
        assert messages == [
            {"role": "system", "content": "Say hi."},
            {"role": "user", "content": "Echo Env environment ready!"},
        ]
        assert info == {"tools": []}
        result = await env.astep("hello")
        metadata = {"original_message": "hello", "step": 1}
        assert result == (
            [{"role": "user", "content": "hello"}],
            0.5,
            False,
            False,
            {"metadata": metadata},
        )
    finally:
        await env.aclose()


async def test_the_whole_observation_as_json_in_a_tool_message(echo_url):
    env = gymnasium.make("agentrl/OpenEnv-v0", url=echo_url, observation_role="tool")
    try:
        await env.areset()
        messages, reward, *_ = await env.astep("a much longer message")
        assert messages[0]["role"] == "tool" and reward == 1.0
        assert json.loads(messages[0]["content"]) == {
            "echoed_message": "a much longer message",
            "message_length": 21,
        }
    finally:
        await env.aclose()


async def test_bad_mappings_fail_naming_the_field(echo_url):
    with pytest.raises(ValueError, match="action_fields sets 'message'"):
        gymnasium.make("agentrl/OpenEnv-v0", url=echo_url, action_fields={"message": "x"})
    with pytest.raises(ConfigError, match="observation_role"):
        gymnasium.make("agentrl/OpenEnv-v0", url=echo_url, observation_role="assistant")
    env = gymnasium.make("agentrl/OpenEnv-v0", url=echo_url, observation_field="nope")
    try:
        with pytest.raises(ValueError, match=r"observation_field 'nope'.*echoed_message"):
            await env.areset()
    finally:
        await env.aclose()
    env = gymnasium.make("agentrl/OpenEnv-v0", url=echo_url, action_field="text")
    try:
        await env.areset()
        with pytest.raises(Exception, match="message"):  # OpenEnv's own validation refuses it
            await env.astep("hello")
    finally:
        await env.aclose()


async def test_rollouts_are_token_exact_and_the_server_got_the_decoded_text(
    echo_url, engine, tokenizer
):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=1)
    runner = EpisodeRunner(
        lambda: gymnasium.make("agentrl/OpenEnv-v0", url=echo_url, max_turns=2, **ECHO),
        engine,
        tokenizer,
        sampling,
        env_id="agentrl/OpenEnv-v0",
    )
    trajectories = await runner.collect(group_tasks(2, group_size=2, seed=3), concurrency=4)
    assert len(trajectories) == 4
    for trajectory in trajectories:
        assert_token_exact(trajectory, tokenizer)
        assert trajectory.truncated and len(trajectory.turns) == 2
        # the turn limit ends the episode after the second turn: its echo is not rendered
        opening, first, echoed, second = trajectory.messages
        assert opening == {"role": "user", "content": "Echo Env environment ready!"}
        assert echoed == {"role": "user", "content": first["content"]}
        rewards = [min(len(turn["content"]) * 0.1, 1.0) for turn in (first, second)]
        assert [turn.reward for turn in trajectory.turns] == pytest.approx(rewards)


@pytest.mark.timeout(600)
def test_one_training_step_on_the_echo_environment(echo_url, tmp_path):
    row = train_one_step(tmp_path, "agentrl/OpenEnv-v0", {"url": echo_url, "max_turns": 2, **ECHO})
    assert row["episodes/count"] == 4 and row["episodes/errors"] == 0, row
