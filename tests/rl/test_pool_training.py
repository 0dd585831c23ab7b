"""Training over a pool of `agentrl serve` processes started by the run: weight sync by tensors, disk
or broadcast (gloo), every server's version checked after each step, a server killed mid-run or in
the middle of a broadcast, two training ranks under torchrun, and a killed run's servers.

That the servers hold exactly the trained weights is checked on the weights themselves: each
server's ``/get_weights_by_name`` against the actor's, bit for bit. The train/inference mismatch is
bounded by what float32 rounding explains in the same run: `test_loop.mismatch_bound` of the
mismatch at step 1, when both sides hold the weights loaded from ``tiny_policy_dir``."""

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_loop import mismatch_bound, subprocess_env, tiny_config
from torchrun_jobs import run_torchrun

from agentrl.rl.loop import Trainer
from agentrl.training.full_state import engine_parameter_name
from agentrl.training.metrics import read_metrics

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


ROWS = 100  # rows per weight read back (SGLang's default): all of every tiny-policy matrix but
# the embedding's (49152 rows)


def actor_weights(trainer):
    """The actor's full float32 weights, by the names engines load them under."""
    return {
        engine_parameter_name(name): param.full_tensor().detach().clone()
        for name, param in trainer.actor.model.named_parameters()
    }


async def assert_servers_hold_the_actors_weights(trainer, servers=None):
    """Every server (by default every pool member) holds exactly the actor's weights, in the
    servers' dtype: the first ``ROWS`` rows of every parameter, compared bit for bit."""
    dtype = getattr(torch, trainer.engine_dtype)
    expected = actor_weights(trainer)
    for server in servers or [m.engine for m in trainer.engines.pool.members]:
        for name, weight in expected.items():
            held = await server.get_weights_by_name(name, ROWS)
            assert torch.equal(held, weight[:ROWS].to(dtype).float()), f"{server.url}: {name}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("weight_sync", ["broadcast", "tensor", "disk"])
async def test_two_servers_train_and_take_every_version(tiny_policy_dir, tmp_path, weight_sync):
    config = pool_config(tiny_policy_dir, tmp_path, weight_sync)
    async with Trainer(config, show_progress=False) as trainer:
        assert await server_versions(trainer) == [0, 0]
        await assert_servers_hold_the_actors_weights(trainer)
        initial = actor_weights(trainer)
        for step in (1, 2):
            record = await trainer.step()
            assert await server_versions(trainer) == [step, step]
            assert record["pool/healthy"] == 2 and record["weight_sync/fallback"] == 0
            await assert_servers_hold_the_actors_weights(trainer)
        # the check tells versions apart: the weights it compared have moved since version 0
        assert not torch.equal(
            actor_weights(trainer)["model.norm.weight"], initial["model.norm.weight"]
        )
        served = [m.served for m in trainer.engines.pool.members]
    assert all(n > 0 for n in served), f"both servers generate: {served}"
    rows = read_metrics(tmp_path / "metrics.jsonl")
    # step 2 trained on tokens the servers sampled with the step-1 weights, which they held
    # exactly (checked above): the log-probs differ by rounding only, as at step 1
    assert rows[-1]["version/trained_on"] == 1
    assert rows[-1]["mismatch/max_abs"] < mismatch_bound(
        rows[0]["mismatch/max_abs"], tiny_policy_dir
    )
    assert (tmp_path / "engines" / "serve-0.log").exists()
    if weight_sync == "disk":
        assert (tmp_path / "weights" / "config.json").exists()


@pytest.mark.timeout(600)
async def test_a_server_killed_mid_run_loses_no_trajectory(tiny_policy_dir, tmp_path):
    config = pool_config(tiny_policy_dir, tmp_path, "broadcast", "trainer.steps=3")
    async with Trainer(config, show_progress=False) as trainer:
        first = await trainer.step()
        victim = trainer.engines.pool.members[0].engine
        victim.process.kill()  # the server dies between steps, while the next rollouts run
        victim.process.wait()
        second = await trainer.step()
        survivor = trainer.engines.pool.members[1].engine
        assert int((await survivor.model_info())["weight_version"]) == 2
        await assert_servers_hold_the_actors_weights(trainer, [survivor])  # the step-2 weights
        third = await trainer.step()
        assert int((await survivor.model_info())["weight_version"]) == 3
        await assert_servers_hold_the_actors_weights(trainer, [survivor])
    for record in (second, third):
        assert record["episodes/count"] == 8 and record["episodes/errors"] == 0
    assert third["pool/healthy"] == 1 and third["pool/out_of_rotation"] == 1
    # a broadcast needs the whole group: it was formed again over the survivor, once
    assert third["weight_sync/group_rebuilds"] == 1 and third["weight_sync/fallback"] == 0
    # the survivor sampled step 3's tokens with version 2, exactly the step-2 weights (above)
    assert third["version/trained_on"] == 2
    assert third["mismatch/max_abs"] < mismatch_bound(first["mismatch/max_abs"], tiny_policy_dir)


@pytest.mark.timeout(600)
async def test_a_server_dying_during_the_broadcast_gets_the_weights_by_tensor(
    tiny_policy_dir, tmp_path
):
    # health probes too rare to see the death: the sync finds it by the broadcast failing
    config = pool_config(
        tiny_policy_dir,
        tmp_path,
        "broadcast",
        "trainer.steps=3",
        "engines.health_interval=600",
        "trainer.weight_sync_bucket_mb=1",  # several buckets: one broadcast, then tensors
    )
    async with Trainer(config, show_progress=False) as trainer:
        first = await trainer.step()
        members = trainer.engines.pool.members
        victim, survivor = members[0].engine, members[1].engine
        group = trainer.engines.group
        broadcast = group.push
        pushes = []

        async def push_then_die(bucket, version):  # fault injection: the server dies mid-sync
            pushes.append(version)
            if len(pushes) == 2:
                victim.process.kill()
                victim.process.wait()
            await broadcast(bucket, version)

        group.push = push_then_die
        with pytest.warns(RuntimeWarning, match="weight broadcast of version 2 failed"):
            second = await trainer.step()
        assert pushes == [2, 2], "the second broadcast failed and the rest went by tensor"
        assert int((await survivor.model_info())["weight_version"]) == 2
        # weights that came half by broadcast, half by tensor: the trainer's exactly
        await assert_servers_hold_the_actors_weights(trainer, [survivor])
        assert trainer.engines.group is None  # abandoned: formed again at the next sync
        third = await trainer.step()
        assert trainer.engines.group is not None and trainer.engines.group.engines == [survivor]
        assert int((await survivor.model_info())["weight_version"]) == 3
        await assert_servers_hold_the_actors_weights(trainer, [survivor])
    assert second["weight_sync/fallback"] == 1 and second["pool/healthy"] == 1
    assert third["weight_sync/fallback"] == 1 and third["weight_sync/group_rebuilds"] == 1
    # step 3 trained on tokens the survivor sampled with those weights
    assert third["version/trained_on"] == 2
    assert third["mismatch/max_abs"] < mismatch_bound(first["mismatch/max_abs"], tiny_policy_dir)
    assert third["episodes/errors"] == 0


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
        records = []
        for _ in range(3):
            records.append(await trainer.step())
            await assert_servers_hold_the_actors_weights(trainer)
        assert await server_versions(trainer) == [3, 3]
    assert records[0]["mismatch/on_policy_fraction"] == 1.0  # nothing is stale at the start
    # step 1: both sides hold the initial weights; what rounding explains follows from it
    bound = mismatch_bound(records[0]["mismatch/on_policy_max_abs"], tiny_policy_dir)
    for record in records:
        assert record["episodes/errors"] == 0 and record["pool/healthy"] == 2
        assert record["staleness/staleness_max"] <= 1
        # the tokens the trainer's own weights sampled score the same in the trainer (float32
        # servers, tensor sync); stale ones may not, and only mismatch/* counts them
        if record["mismatch/on_policy_fraction"] > 0:
            assert record["mismatch/on_policy_max_abs"] < bound
            assert record["mismatch/on_policy_max_abs"] <= record["mismatch/max_abs"]
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
        await assert_servers_hold_the_actors_weights(trainer)
        record = await trainer.step()
        assert await server_versions(trainer) == [2, 2]
        await assert_servers_hold_the_actors_weights(trainer)
    step_1 = read_metrics(tmp_path / "metrics.jsonl")[0]  # the first run's, same weights both sides
    assert record["version/trained_on"] == 1 and record["episodes/errors"] == 0
    assert record["mismatch/max_abs"] < mismatch_bound(step_1["mismatch/max_abs"], tiny_policy_dir)


def serve_children(pid):
    """The ``agentrl serve`` processes whose parent is ``pid``."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
            if int(fields[1]) == pid and b"serve" in cmdline:
                children.append(int(stat.parent.name))
    return children


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def all_gone(pids, within=30.0):
    """Whether every process in ``pids`` exits (or is a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return all(gone(pid) for pid in pids)


@pytest.mark.timeout(600)
def test_two_ranks_train_over_the_pool_under_torchrun(tiny_policy_dir, tmp_path):
    """Every rank trains and none is an engine: 2 gloo ranks, 2 servers, broadcast weight sync."""
    out = tmp_path / "run"
    config = tmp_path / "pool.yaml"
    config.write_text(pool_config(tiny_policy_dir, out, "broadcast").to_yaml())
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node=2", "-m", "agentrl.cli", "train", str(config)]
    result = run_torchrun(command, timeout=500, env=subprocess_env(), output_dir=out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["pool/healthy"] == 2 and row["episodes/errors"] == 0
        assert row["weight_sync/fallback"] == 0 and row["weight_sync/group_rebuilds"] == 0
    # step 2 trained on tokens both servers sampled with the step-1 weights gathered from the
    # two ranks' shards: rounding apart, as at step 1, when both sides held the initial weights
    assert rows[-1]["version/trained_on"] == 1
    assert rows[-1]["mismatch/max_abs"] < mismatch_bound(
        rows[0]["mismatch/max_abs"], tiny_policy_dir
    )
    assert len(list((out / "engines").glob("serve-*.log"))) == 2


@pytest.mark.timeout(300)
def test_a_killed_run_takes_its_servers_with_it(tiny_policy_dir, tmp_path):
    out = tmp_path / "run"
    config = tmp_path / "pool.yaml"
    config.write_text(pool_config(tiny_policy_dir, out, "tensor", "trainer.steps=500").to_yaml())
    trainer = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "train", str(config)],
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (metrics.exists() and metrics.read_text().strip()):
            assert trainer.poll() is None and time.monotonic() < deadline, "no step was taken"
            time.sleep(0.2)
        servers = serve_children(trainer.pid)
        assert len(servers) == 2
    finally:
        trainer.kill()  # SIGKILL: no clean-up code runs in the trainer
        trainer.wait()
    assert all_gone(servers), "the servers outlived the run (PR_SET_PDEATHSIG)"


@pytest.mark.timeout(600)
async def test_servers_placed_by_ray_train_and_end_with_the_run(tiny_policy_dir, tmp_path):
    import ray

    config = pool_config(tiny_policy_dir, tmp_path, "broadcast", "engines.kind=ray")
    async with Trainer(config, show_progress=False) as trainer:
        assert ray.is_initialized()  # a local instance, started by the run
        pids = [await actor.pid.remote() for actor in trainer.engines.actors]
        assert len(set(pids)) == 2
        records = []
        for step in (1, 2):
            records.append(record := await trainer.step())
            assert await server_versions(trainer) == [step, step]
            assert record["pool/healthy"] == 2 and record["episodes/errors"] == 0
            await assert_servers_hold_the_actors_weights(trainer)
    bound = mismatch_bound(records[0]["mismatch/max_abs"], tiny_policy_dir)
    assert records[1]["mismatch/max_abs"] < bound
    assert not ray.is_initialized()
    assert all_gone(pids)


def test_the_broadcast_group_listens_where_the_servers_reach_the_trainer():
    from agentrl.rl.engines import _master_address

    assert _master_address(["http://127.0.0.1:30000", "http://localhost:30001"]) == "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 9))  # this machine's address on its default route
        own = probe.getsockname()[0]
    assert _master_address(["http://127.0.0.1:30000", f"http://{own}:30001"]) == own


@pytest.mark.timeout(600)
async def test_sglang_kind_starts_servers_from_a_command_template(tiny_policy_dir, tmp_path):
    """The SGLang launch path (one server per GPU id, seeds dropped, its own logs) with a template
    that starts `agentrl serve`, since SGLang's server does not run on these CPUs."""
    template = f'[{sys.executable}, -m, agentrl.cli, serve, "{{model}}", --port, "{{port}}"]'
    config = pool_config(
        tiny_policy_dir,
        tmp_path,
        "tensor",
        "engines.kind=sglang",
        f"engines.command={template}",
        "engines.gpu_ids=[3, 5]",
    )
    async with Trainer(config, show_progress=False) as trainer:
        servers = [m.engine for m in trainer.engines.pool.members]
        assert all(server.ignore_seeds for server in servers)
        gpus = [
            dict(
                line.split("=", 1)
                for line in Path(f"/proc/{s.process.pid}/environ").read_text().split("\0")
                if "=" in line
            )["CUDA_VISIBLE_DEVICES"]
            for s in servers
        ]
        assert gpus == ["3", "5"]
        record = await trainer.step()
        assert await server_versions(trainer) == [1, 1]
    assert record["episodes/errors"] == 0 and record["pool/healthy"] == 2
    assert sorted(p.name for p in (tmp_path / "engines").iterdir()) == [
        "sglang-0.log",
        "sglang-1.log",
    ]
