"""Engines as Ray actors on a local Ray instance (CPU): placed, served, killed, rerouted."""

from __future__ import annotations

import asyncio
import os

import pytest
import ray
from test_sglang_http import model_dir  # noqa: F401  (fixture)

from agentrl.engine_pool import EnginePool, SamplingParams
from agentrl.engine_pool.ray_engines import launch_ray_engines

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


async def test_ray_actor_engines_serve_and_a_killed_actor_is_rerouted(local_ray, model_dir):  # noqa: F811
    engines, actors = await launch_ray_engines(
        2, model=str(model_dir), extra_args=("--max-batch-size", "8")
    )
    pids = [await actor.pid.remote() for actor in actors]
    assert len(set(pids)) == 2 and all(e.url.startswith("http://") for e in engines)
    async with EnginePool(engines, health_interval=0.5) as pool:
        sampling = SamplingParams(max_new_tokens=4, ignore_eos=True, seed=0)
        first = await asyncio.gather(*(pool.generate([1, 2, i], sampling) for i in range(4)))
        assert all(len(r.token_ids) == 4 for r in first)
        ray.kill(actors[0])  # the actor dies, and its server with it (PR_SET_PDEATHSIG)
        for _ in range(100):
            try:
                os.kill(pids[0], 0)
            except ProcessLookupError:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the killed actor's server process is still running")
        after = await asyncio.gather(*(pool.generate([3, 4, i], sampling) for i in range(4)))
        assert all(len(r.token_ids) == 4 for r in after)
        assert pool.members[0].status == "evicted"
    assert await actors[1].alive.remote()  # the pool closed its client; the actor owns the server
    await actors[1].stop.remote()
    assert not await actors[1].alive.remote()
