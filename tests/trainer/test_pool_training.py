"""Training over a pool of `agentrl serve` processes started by the run: weight sync by tensors, disk
or broadcast (gloo), every server's version checked after each step, and a server killed mid-run."""

import pytest
from test_loop import tiny_config

from agentrl.trainer.loop import Trainer
from agentrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow


def pool_config(policy_dir, out, weight_sync, *overrides):
    return tiny_config(
        policy_dir,
        out,
        "engines.kind=serve",
        "engines.count=2",
        f"engines.weight_sync={weight_sync}",
        "engines.health_interval=0.5",
        "rollout.groups_per_step=4",
        *overrides,
    )


async def server_versions(trainer):
    return [
        int((await m.engine.model_info())["weight_version"]) for m in trainer.engines.pool.members
    ]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("weight_sync", ["broadcast", "tensor", "disk"])
async def test_two_servers_train_and_take_every_version(tiny_policy_dir, tmp_path, weight_sync):
    config = pool_config(tiny_policy_dir, tmp_path, weight_sync)
    async with Trainer(config, show_progress=False) as trainer:
        assert await server_versions(trainer) == [0, 0]
        for step in (1, 2):
            record = await trainer.step()
            assert await server_versions(trainer) == [step, step]
            assert record["pool/healthy"] == 2 and record["weight_sync/fallback"] == 0
        served = [m.served for m in trainer.engines.pool.members]
    assert all(n > 0 for n in served), f"both servers generate: {served}"
    rows = read_metrics(tmp_path / "metrics.jsonl")
    # step 2 trained on tokens the servers sampled with the step-1 weights: their log-probs are
    # the trainer's only if the sync delivered exactly those weights
    assert rows[-1]["version/trained_on"] == 1 and rows[-1]["mismatch/max_abs"] < 1e-3
    assert (tmp_path / "engines" / "serve-0.log").exists()
    if weight_sync == "disk":
        assert (tmp_path / "weights" / "config.json").exists()


@pytest.mark.timeout(600)
async def test_a_server_killed_mid_run_loses_no_trajectory(tiny_policy_dir, tmp_path):
    config = pool_config(tiny_policy_dir, tmp_path, "broadcast", "trainer.steps=3")
    async with Trainer(config, show_progress=False) as trainer:
        await trainer.step()
        victim = trainer.engines.pool.members[0].engine
        victim.process.kill()  # the server dies between steps, while the next rollouts run
        victim.process.wait()
        second = await trainer.step()
        third = await trainer.step()
        survivor = trainer.engines.pool.members[1].engine
        assert int((await survivor.model_info())["weight_version"]) == 3
    for record in (second, third):
        assert record["episodes/count"] == 8 and record["episodes/errors"] == 0
    assert third["pool/healthy"] == 1 and third["pool/out_of_rotation"] == 1
    # a broadcast needs the whole group: with a member gone the steps fall back to tensors
    assert third["weight_sync/fallback"] >= 1


@pytest.mark.timeout(600)
async def test_partial_rollouts_and_staleness_across_the_pool(tiny_policy_dir, tmp_path):
    config = pool_config(
        tiny_policy_dir,
        tmp_path,
        "tensor",
        "trainer.steps=3",
        "stream.max_staleness=1",
        "stream.partial_rollouts=abort",
        "rollout.max_new_tokens=64",
    )
    async with Trainer(config, show_progress=False) as trainer:
        records = [await trainer.step() for _ in range(3)]
        assert await server_versions(trainer) == [3, 3]
    for record in records:
        assert record["episodes/errors"] == 0 and record["pool/healthy"] == 2
        assert record["staleness/staleness_max"] <= 1
    assert records[-1]["version/trained_on"] == 2


@pytest.mark.timeout(600)
async def test_a_run_over_a_pool_resumes_with_the_pool(tiny_policy_dir, tmp_path):
    first = pool_config(tiny_policy_dir, tmp_path, "broadcast", "trainer.steps=1")
    async with Trainer(first, show_progress=False) as trainer:
        await trainer.run()
    again = pool_config(tiny_policy_dir, tmp_path, "broadcast", "trainer.steps=2")
    async with Trainer(again, show_progress=False) as trainer:
        assert trainer.actor.step == 1
        assert await server_versions(trainer) == [1, 1]  # new servers took the checkpoint's weights
        record = await trainer.step()
        assert await server_versions(trainer) == [2, 2]
    assert record["mismatch/max_abs"] < 1e-3 and record["episodes/errors"] == 0
