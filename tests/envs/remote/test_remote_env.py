"""``agentrl/Remote-v0`` against real ``agentrl env serve`` processes on loopback: the same
episodes as in-process, sessions spread over two servers, and a server lost mid-episode (killed,
or its session expired) as an infra_error, never a reward."""

from __future__ import annotations

import asyncio
import signal

import gymnasium
import pytest
from env_serving import env_servers
from gymnasium.utils.env_checker import check_env

from agentrl.engine_pool import SamplingParams
from agentrl.envs import INFRA_ERROR, make_env
from agentrl.envs.remote import RemoteEnv, RemoteEnvError
from agentrl.envs.remote.env import ServerGone
from agentrl.evaluation.run import task_count
from agentrl.rollout import EpisodeRunner, group_tasks
from agentrl.rollout.mixture import EnvSpec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers():
    with env_servers(
        wide=["agentrl/Math-v0", "--max-sessions", "2"],
        narrow=["agentrl/Math-v0", "--max-sessions", "1", "--session-timeout-s", "1"],
        infra=["tests/InfraFault-v0"],
        turns=["tests/Turns-v0"],
        limited=["tests/Turns-v0", "max_turns=3"],
    ) as started:
        yield started


def url(servers, name: str) -> str:
    return servers[name][1]


def test_remote_math_passes_check_env_and_matches_the_local_env(servers):
    remote = gymnasium.make("agentrl/Remote-v0", url=url(servers, "wide"))
    local = make_env("agentrl/Math-v0")
    try:
        check_env(remote.unwrapped, skip_render_check=True)
        for seed, options, right in ((3, None, True), (11, {"index": 7}, False)):
            opening = remote.reset(seed=seed, options=options)
            assert opening == local.reset(seed=seed, options=options)
            answer = opening[1]["gold_answer"] if right else "-12345"
            text = f"The answer is \\boxed{{{answer}}}"
            result = remote.step(text)
            assert result == local.step(text) and result[1] == float(right)
    finally:
        remote.close()
        local.close()
    assert RemoteEnv.sessions_by_url[url(servers, "wide")] == 0


async def test_a_turn_limit_on_either_side_reaches_the_remote_environment(servers):
    async def final_turns(address: str, **limit: int) -> list[tuple[bool, bool]]:
        env = make_env("agentrl/Remote-v0", url=address, **limit)
        try:
            await env.areset(seed=0)
            seen, truncated = [], False
            while not truncated and len(seen) < 6:
                _, _, _, truncated, info = await env.astep("more")
                seen.append((info["final_turn"], truncated))
            return seen
        finally:
            await env.aclose()

    # the client's limit: its last step's action says so, the remote env's final_turn is set
    assert await final_turns(url(servers, "turns"), max_turns=2) == [(False, False), (True, True)]
    # the server's own limit, and the nearer of the two when both are set
    limited = url(servers, "limited")
    assert await final_turns(limited) == [(False, False), (False, False), (True, True)]
    assert await final_turns(limited, max_turns=2) == [(False, False), (True, True)]


async def test_the_task_count_comes_from_the_server(servers):
    assert await RemoteEnv(url=url(servers, "turns")).anum_tasks() == 5
    local = make_env("agentrl/Math-v0").unwrapped
    remote = RemoteEnv(url=["http://127.0.0.1:9", url(servers, "wide")])  # the first is down
    assert await remote.anum_tasks() == local.num_tasks
    assert remote.num_tasks is None  # the synchronous property cannot ask
    spec = EnvSpec(id="agentrl/Remote-v0", kwargs={"url": url(servers, "turns")})
    assert await task_count(spec) == 5  # what agentrl eval enumerates
    with pytest.raises(ServerGone, match="no environment server answered GET /state"):
        await RemoteEnv(url="http://127.0.0.1:9").anum_tasks()


async def test_the_remote_envs_own_errors_are_raised():
    # (no server needed for the first: a step before any reset has no session)
    env = RemoteEnv(url="http://127.0.0.1:9")
    with pytest.raises(RemoteEnvError, match="before reset"):
        await env.astep("x")
    with pytest.raises(ServerGone, match="no environment server took the session"):
        await env.areset(seed=0)


async def test_an_error_of_the_remote_environment_is_raised_as_itself(servers):
    env = RemoteEnv(url=url(servers, "wide"))
    try:
        await env.areset(seed=1)
        await env.astep("\\boxed{1}")
        with pytest.raises(RemoteEnvError, match="ResetNeeded") as caught:
            await env.astep("after the episode ended")
        assert caught.value.code == "EXECUTION_ERROR"
        with pytest.raises(RemoteEnvError, match=r"IndexError.*outside") as caught:
            await env.areset(options={"index": 10**9})
        assert caught.value.code == "EXECUTION_ERROR"
        messages, _ = await env.areset(seed=1)  # the same session goes on
        assert messages[-1]["role"] == "user"
    finally:
        await env.aclose()


async def test_sessions_spread_over_servers_and_refusals_fall_through(servers):
    both = [url(servers, "narrow"), url(servers, "wide")]
    envs = [RemoteEnv(url=both) for _ in range(4)]
    try:
        for env in envs[:3]:
            messages, info = await env.areset(seed=2)
            assert messages[-1]["role"] == "user" and info["gold_answer"]
        placed = [env._link.url for env in envs[:3] if env._link is not None]
        # the least loaded first; the third found narrow full (1 session) and went to wide
        assert placed == [both[0], both[1], both[1]]
        with pytest.raises(ServerGone, match=r"CAPACITY_REACHED.*CAPACITY_REACHED"):
            await envs[3].areset(seed=2)
    finally:
        for env in envs:
            await env.aclose()


async def test_an_expired_server_session_is_an_infra_error(servers):
    env = RemoteEnv(url=url(servers, "narrow"))
    try:
        await env.areset(seed=4)
        await asyncio.sleep(
            1.5
        )  # past the server's --session-timeout-s 1 (the connection stays 1 s more)
        messages, reward, terminated, truncated, info = await env.astep("\\boxed{1}")
        assert (messages, reward, terminated, truncated) == ([], 0.0, True, False)
        assert "ended the session" in info[INFRA_ERROR] and "expired" in info[INFRA_ERROR]
        messages, info = await env.areset(seed=4)  # a new session: the env is usable again
        assert messages[-1]["role"] == "user"
    finally:
        await env.aclose()


async def test_infra_errors_pass_through_and_a_killed_server_is_one(servers):
    process, address = servers["infra"]
    env = RemoteEnv(url=address)
    try:
        await env.areset(seed=0)
        _, reward, terminated, _, info = await env.astep("fault")
        assert info == {INFRA_ERROR: "the grading sandbox could not start"} and reward == 0.0
        assert terminated
        await env.areset(seed=0)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        messages, reward, terminated, truncated, info = await env.astep("ok")
        assert (messages, reward, terminated, truncated) == ([], 0.0, True, False)
        assert info[INFRA_ERROR].startswith(f"the environment server {address} went away")
        with pytest.raises(ServerGone, match="cannot connect"):
            await env.areset(seed=0)
    finally:
        await env.aclose()


async def test_a_rollout_on_a_remote_env_is_the_rollout_on_the_local_one(
    servers, engine, tokenizer
):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=1)
    address = url(servers, "wide")
    runs = {}
    for name, make in (
        ("remote", lambda: gymnasium.make("agentrl/Remote-v0", url=address)),
        ("local", lambda: gymnasium.make("agentrl/Math-v0")),
    ):
        runner = EpisodeRunner(make, engine, tokenizer, sampling, env_id="agentrl/Math-v0")
        runs[name] = await runner.collect(group_tasks(2, seed=5))
    for remote, local in zip(runs["remote"], runs["local"], strict=True):
        assert remote.error is None and remote.infra_error is None
        assert remote.messages == local.messages
        assert remote.tokens.input_ids == local.tokens.input_ids
        assert remote.tokens.loss_mask == local.tokens.loss_mask
        assert (remote.reward, remote.terminated) == (local.reward, local.terminated)


async def test_a_stopped_server_closes_the_environments_of_its_open_sessions(tmp_path):
    closed = tmp_path / "closed.log"
    with env_servers(one=["tests/InfraFault-v0", f"closed_log={closed}"]) as started:
        process, address = started["one"]
        envs = [RemoteEnv(url=address) for _ in range(2)]
        for env in envs:
            await env.areset(seed=0)
        assert len(closed.read_text().split()) == 1  # the command's start-up probe
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0
    assert len(set(closed.read_text().split())) == 3  # and both sessions' environments, once
    for env in envs:
        _, _, _, _, info = await env.astep("ok")
        assert "went away" in info[INFRA_ERROR]
        await env.aclose()
