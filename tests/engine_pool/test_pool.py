"""EnginePool over real `agentrl serve` processes on loopback: kill one mid-rollout, a hung
engine, weight updates across the pool with partial rollouts, sticky sessions."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import gymnasium
import psutil
import pytest
from aiohttp import web
from test_sglang_http import fake_sglang, free_port, model_dir, sglang_info  # noqa: F401

from agentrl.engine_pool.engine import EngineError, SamplingParams
from agentrl.engine_pool.pool import EnginePool
from agentrl.engine_pool.sglang_engine import SGLangEngine, serve_command
from agentrl.rollout.runner import EpisodeRunner, group_tasks

pytestmark = pytest.mark.slow


async def launch_servers(model_dir, count: int, tmp_path) -> list[SGLangEngine]:  # noqa: F811
    ports = [free_port() for _ in range(count)]
    return list(
        await asyncio.gather(
            *(
                SGLangEngine.launch(
                    serve_command(str(model_dir), port, max_batch_size=16),
                    f"http://127.0.0.1:{port}",
                    log_path=tmp_path / f"serve-{port}.log",
                    request_timeout=120,
                )
                for port in ports
            )
        )
    )


def math_runner(engine, tokenizer) -> EpisodeRunner:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24)
    return EpisodeRunner(
        lambda: gymnasium.make("agentrl/Math-v0", answer_format="flexible").unwrapped,
        engine,
        tokenizer,
        sampling,
        env_id="agentrl/Math-v0",
    )


async def test_killing_one_of_two_servers_mid_rollout_loses_no_trajectory(
    model_dir,  # noqa: F811
    tokenizer,
    tmp_path,
):
    engines = await launch_servers(model_dir, 2, tmp_path)
    async with EnginePool(engines, health_interval=0.5) as pool:
        runner = math_runner(pool, tokenizer)
        tasks = group_tasks(16, group_size=4)
        seen = []

        async def kill_when_started() -> None:
            while engines[0].process is not None and not seen:
                await asyncio.sleep(0.05)
            os.kill(engines[0].process.pid, signal.SIGKILL)

        killer = asyncio.create_task(kill_when_started())
        async for trajectory in runner.stream(tasks, concurrency=32):
            seen.append(trajectory)
        await killer
    keys = [(t.group, t.sample) for t in seen]
    assert sorted(keys) == sorted((t.group, t.sample) for t in tasks)  # each exactly once
    assert all(t.error is None for t in seen), [t.error for t in seen if t.error]
    assert pool.members[0].status == "evicted" and pool.retries > 0
    assert pool.members[1].served > 0


async def test_a_hung_engine_is_timed_out_and_its_requests_rerouted(model_dir, tmp_path):  # noqa: F811
    hang = asyncio.Event()

    async def hanging(request):
        if info := sglang_info(request, weight_version="0"):
            return info
        await hang.wait()  # never answers: not /generate, not /health_generate
        return web.Response(status=500)

    runner, url = await fake_sglang(hanging)
    (real,) = await launch_servers(model_dir, 1, tmp_path)
    stuck = SGLangEngine(url, request_timeout=600)
    try:
        async with EnginePool([stuck, real], health_interval=0.5, health_timeout=3) as pool:
            sampling = SamplingParams(max_new_tokens=4, seed=3)
            results = await asyncio.wait_for(
                asyncio.gather(*(pool.generate([1, 2, 3], sampling) for _ in range(6))), 120
            )
            assert all(len(r.token_ids) == 4 for r in results)
            assert pool.members[0].status == "evicted"
            assert "health checks" in pool.members[0].last_error
    finally:
        hang.set()
        await runner.cleanup()


async def test_weight_update_during_a_rollout_with_partial_rollouts(
    model_dir,  # noqa: F811
    smollm2,
    tmp_path,
):
    engines = await launch_servers(model_dir, 2, tmp_path)
    name = "model.norm.weight"
    weights = smollm2.state_dict()[name].clone()
    async with EnginePool(engines) as pool:
        long = SamplingParams(max_new_tokens=200, ignore_eos=True, seed=5)
        calls = [
            asyncio.create_task(pool.generate([1, 2, 3, 4], long, session_id=f"t{i}"))
            for i in range(4)
        ]
        await asyncio.sleep(2.0)
        await pool.abort()  # partial rollouts: in-flight requests return their tokens
        await pool.pause()
        await pool.update_weights([(name, weights * 0.9)], version=1)
        await pool.resume()
        first = await asyncio.gather(*calls)
        assert all(
            r.finish_reason == "abort" and r.token_weight_versions == [0] * len(r.token_ids)
            for r in first
        )
        # the rollout continues each one from its tokens, under the new weights
        rest = await asyncio.gather(
            *(
                pool.generate(
                    [1, 2, 3, 4, *r.token_ids],
                    SamplingParams(max_new_tokens=5, ignore_eos=True),
                    session_id=f"t{i}",
                )
                for i, r in enumerate(first)
            )
        )
        assert all(r.token_weight_versions == [1] * 5 for r in rest)
        assert [m.status for m in pool.members] == ["healthy", "healthy"]
        assert {(await e.model_info())["weight_version"] for e in engines} == {"1"}
        await pool.update_weights([(name, weights)], version=2)


async def test_a_failed_update_takes_the_engine_out_of_rotation(model_dir, smollm2, tmp_path):  # noqa: F811
    engines = await launch_servers(model_dir, 2, tmp_path)
    async with EnginePool(engines, health_interval=60) as pool:
        os.kill(engines[1].process.pid, signal.SIGKILL)
        engines[1].process.wait()
        await pool.pause()
        await pool.update_weights(
            [("model.norm.weight", smollm2.state_dict()["model.norm.weight"])], 1
        )
        await pool.resume()
        assert [m.status for m in pool.members] == ["healthy", "evicted"]
        result = await pool.generate([1, 2], SamplingParams(max_new_tokens=2))
        assert result.token_weight_versions == [1, 1]
        with pytest.raises(ValueError, match="older"):
            await pool.update_weights([], 0)


async def test_sticky_sessions_stay_on_one_engine(model_dir, tmp_path):  # noqa: F811
    engines = await launch_servers(model_dir, 2, tmp_path)
    async with EnginePool(engines) as pool:
        sampling = SamplingParams(max_new_tokens=2, seed=1)
        for turn in range(3):
            await asyncio.gather(
                *(pool.generate([1, 2, turn], sampling, session_id=f"s{i}") for i in range(4))
            )
        homes = {sid: member.name for sid, member in pool._sessions.items()}
        assert len(set(homes.values())) == 2  # load spread over both engines
        assert sum(m.served for m in pool.members) == 12
        await pool.end_session("s0")  # the route is forgotten; the server is sent nothing
        assert "s0" not in pool._sessions and len(pool._sessions) == 3
        await pool.end_session("never")


async def test_a_pool_with_no_engine_left_raises():
    async def refuse(request):
        if info := sglang_info(request, weight_version="0"):
            return info
        return web.json_response({"error": {"message": "overloaded"}}, status=503)

    runner, url = await fake_sglang(refuse)
    try:
        async with EnginePool([SGLangEngine(url)]) as pool:
            with pytest.raises(EngineError, match=r"no healthy engine.*overloaded"):
                await pool.generate([1], SamplingParams(max_new_tokens=1))
    finally:
        await runner.cleanup()
    with pytest.raises(ValueError, match="at least one"):
        EnginePool([])


def test_no_server_process_is_left_behind():
    """None of the servers this file's tests started (this process's descendants; other test
    processes may be running servers of their own) outlives its test."""
    leftovers = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # one that exits meanwhile is no leftover
            command = " ".join(child.cmdline())
            if "agentrl.cli serve" in command:
                leftovers.append(command)
    assert leftovers == []
