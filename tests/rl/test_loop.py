"""Whole training runs with a tiny random policy on Math-v0: outputs, weight sync, resume, stop,
staleness with partial rollouts, the launcher, and 1 process vs 2 under torchrun."""

import asyncio
import functools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from float_tolerance import logprob_ceiling, logprob_error_with, tolerance
from torchrun_jobs import run_torchrun
from transformers import AutoModelForCausalLM

from agentrl.config import ConfigError
from agentrl.rl.config import TrainConfig
from agentrl.rl.loop import Trainer, train_on_batch
from agentrl.rl.objective import Objective
from agentrl.training.actor import Actor
from agentrl.training.logprobs import logprob_mismatch
from agentrl.training.metrics import read_metrics

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent  # parity_env.py: subprocesses get it on PYTHONPATH


def subprocess_env():
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def tiny_config(policy_dir, out, *overrides, env="env.id=parity_env:test/Parity-v0"):
    """A two-step run of the tiny policy. Its engines hold float32 weights on every CPU:
    ``engines.dtype=auto`` would pick bfloat16 on CPUs with AVX512-BF16 or AMX, whose
    rounding (a mismatch of about 1.5e-3) hides what these tests check: that the engines sample
    with exactly the trainer's weights (float32 rounding, about 1e-6). The bfloat16 engine has its
    own test."""
    return TrainConfig.load(
        None,
        [
            f"model.path={policy_dir}",
            env,
            f"trainer.output_dir={out}",
            "engines.dtype=float32",
            "rollout.groups_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "rollout.max_total_tokens=512",
            "trainer.micro_batch_tokens=512",
            "trainer.steps=2",
            "actor.lr=1e-3",
            *overrides,
        ],
    )


async def train(config):
    had_group = dist.is_initialized()
    async with Trainer(config, show_progress=False) as trainer:
        summary = await trainer.run()
    assert dist.is_initialized() == had_group  # a group the trainer made is gone after it
    return trainer, summary


@functools.cache
def logprob_magnitude(policy_dir) -> float:
    """An upper bound on the tiny policy's ``|log-prob|`` at ``T = 1``, here and after the few
    steps the tests train (for the float32-spacing floor of a tolerance). A logit is the final
    RMSNorm's output, of norm at most ``sqrt(d) * max|norm weight|``, dotted with a row of the
    (tied) embedding: at most ``sqrt(d) * max|g| * max_v |E_v|`` (1.0 for the tiny policy); twice
    that for training (a few AdamW steps at lr 1e-3 move each weight by about 1e-3 a step)."""
    model = AutoModelForCausalLM.from_pretrained(policy_dir).requires_grad_(False)
    norm = float(model.model.norm.weight.abs().max())
    rows = float(model.get_output_embeddings().weight.norm(dim=1).max())
    max_logit = 2 * math.sqrt(model.config.hidden_size) * norm * rows
    return logprob_ceiling(model.config.vocab_size, max_logit)


def mismatch_bound(reference, policy_dir) -> float:
    """The most train/inference mismatch float32 rounding can explain in a run of the tiny policy
    where the same comparison with the same weights on both sides gave ``reference``: see
    tests/float_tolerance.py (``FACTOR`` times that, or times float32's spacing at the largest
    log-prob when the reference is smaller, such as 0)."""
    return tolerance(reference, logprob_magnitude(str(policy_dir)))


def record_batches(trainer):
    """The batch of every step ``trainer.run()`` takes, in order (its own ``step``, wrapped)."""
    batches, step = [], trainer.step

    async def recording_step():
        record = await step()
        batches.append(trainer.last_batch)
        return record

    trainer.step = recording_step
    return batches


def float32_logprob_error(policy_dir, sequences, temperature=1.0) -> tuple[float, float]:
    """How far the float32 log-probs of the loss tokens of ``sequences`` under the weights saved at
    ``policy_dir`` are from float64 ones on this CPU: ``(max |difference|, magnitude)`` (the
    magnitude as `float_tolerance.logprobs64` gives it)."""
    model = AutoModelForCausalLM.from_pretrained(policy_dir)
    model64 = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float64)
    worst = magnitude = 0.0
    for sequence in sequences:
        error, _, largest = logprob_error_with(
            model, model64, sequence["input_ids"], temperature, sequence["loss_mask"]
        )
        worst, magnitude = max(worst, error), max(magnitude, largest)
    return worst, magnitude


def max_loss_term(config) -> float:
    """The largest per-token term of the policy loss (GRPO, TIS, one update per batch): the loss is
    a token mean of ``-A * w * r``, with ``|A| <= (G - 1) / sqrt(G)`` (a group's rewards
    standardised by their unbiased std), the TIS weight ``w <= importance_cap`` and the ratio
    ``r = 1`` in value."""
    group = config.rollout.group_size
    return (group - 1) / math.sqrt(group) * config.algorithm.importance_cap


async def step_one_rounding(policy_dir, out) -> dict[str, float]:
    """How far float32 puts step 1's ``train/loss`` and ``train/grad_norm`` from float64 on this
    CPU: step 1 of the tiny run in this process, then its batch through a float64 actor from the
    same weights (float64 but for the log-softmax, which the objective computes in float32)."""
    config = tiny_config(policy_dir, out, "trainer.steps=1", "trainer.export_hf=false")
    async with Trainer(config, show_progress=False) as trainer:
        record = await trainer.step()
        model64 = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float64)
        objective = Objective(
            config.algorithm,
            temperature=config.rollout.temperature,
            norm_length=config.rollout.max_new_tokens,
        )
        exact = train_on_batch(
            Actor(model64, config.actor, dist_info=trainer.dist),
            objective,
            trainer.last_batch.sequences,
            micro_batch_tokens=config.trainer.micro_batch_tokens,
        )
    return {key: abs(record[key] - exact[key]) for key in ("train/loss", "train/grad_norm")}


def stale_mismatch(model, batch, temperature=1.0) -> float:
    """The largest mismatch ``batch``'s engine log-probs have against ``model``'s."""
    return max(
        logprob_mismatch(model, s["input_ids"], s["logprobs"], s["loss_mask"], temperature)[
            "max_abs"
        ]
        for s in batch.sequences
    )


async def test_a_run_trains_syncs_and_writes_its_outputs(tiny_policy_dir, tmp_path):
    async with Trainer(tiny_config(tiny_policy_dir, tmp_path), show_progress=False) as trainer:
        batches = record_batches(trainer)
        summary = await trainer.run()
        assert trainer.engine.weight_version == 2
        engine_weights = dict(trainer.engine.model.named_parameters())
        # negative control: step 2's tokens (sampled by version 1) scored by version 2, as the
        # trainer would if the engine had missed a sync
        missed_sync = stale_mismatch(trainer.actor.model, batches[1])
    assert summary.steps == summary.final_step == 2 and not summary.interrupted
    # step 1: the engine and the trainer both hold the weights saved at tiny_policy_dir; what
    # their log-probs may differ by is derived from the trainer's float32 error on these tokens
    error, magnitude = float32_logprob_error(tiny_policy_dir, batches[0].sequences)
    bound = tolerance(error, magnitude)
    assert missed_sync > bound, (missed_sync, bound)  # the bound tells versions apart
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "reward/mean",
        "mismatch/mean_abs",
        "mismatch/max_abs",
        "train/loss",
        "train/grad_norm",
        "memory/peak_rss_gb",
    ):
        assert key in rows[-1], key
    assert 0 < rows[0]["memory/peak_rss_gb"] <= rows[1]["memory/peak_rss_gb"]
    # on-policy, nothing runs on the engine while a step trains: its weights are freed, and the
    # sync brings back every one of them (the checks of the engine's weights and log-probs)
    assert all(r["memory/engine_released_gb"] > 0 for r in rows)
    for row in rows:  # the engine's log-probs are the trainer's: at step 2, after a sync
        assert row["mismatch/max_abs"] < bound, (row["step"], row["mismatch/max_abs"], bound)
    assert rows[-1]["version/trained_on"] == 1  # on-policy: step 2 trained on version-1 tokens
    for row in rows:  # every token was sampled by the weights trained on: all of it is numerics
        assert row["mismatch/on_policy_fraction"] == 1.0
        assert row["mismatch/on_policy_max_abs"] == row["mismatch/max_abs"]
        assert row["mismatch/on_policy_mean_abs"] == pytest.approx(row["mismatch/mean_abs"])
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert summary.checkpoint is not None and summary.checkpoint.exists()
    assert list((tmp_path / "tensorboard").iterdir())
    exported = AutoModelForCausalLM.from_pretrained(summary.exported)
    trained = dict(exported.named_parameters())
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_policy_dir).named_parameters())
    assert not torch.equal(trained["model.norm.weight"], initial["model.norm.weight"])
    for name, value in trained.items():  # the engine generates with the trained weights
        torch.testing.assert_close(engine_weights[name], value, rtol=0, atol=0)


async def test_a_mixture_of_environments_draws_groups_by_weight(tiny_policy_dir, tmp_path):
    from agentrl.rollout import EnvMixture

    mix = (
        "env.mix=[{id: 'parity_env:test/Parity-v0', weight: 1, name: parity},"
        " {id: agentrl/Math-v0, kwargs: {generated_difficulty: 1}, weight: 1}]"
    )
    config = tiny_config(tiny_policy_dir, tmp_path, "trainer.seed=3", env=mix)
    drawn = EnvMixture([None, None], [1, 1], seed=3)  # the groups of two steps of 2 groups
    assert {drawn.index(g) for g in range(4)} == {0, 1}, "this seed must draw both"
    await train(config)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    seen = {key.split("/")[1] for row in rows for key in row if key.startswith("env/")}
    assert seen == {"parity", "Math-v0"}
    for row in rows:
        per_env = [row[k] for k in row if k.startswith("env/") and k.endswith("/episodes")]
        assert sum(per_env) == row["episodes/count"] == 4


async def test_a_bfloat16_engine_samples_while_the_trainer_keeps_float32(tiny_policy_dir, tmp_path):
    config = tiny_config(
        tiny_policy_dir, tmp_path, "engines.dtype=bfloat16", "engines.release_while_training=false"
    )
    async with Trainer(config, show_progress=False) as trainer:
        batches = record_batches(trainer)
        await trainer.run()
        engine_weights = dict(trainer.engine.model.named_parameters())
        trainer_weights = dict(trainer.actor.model.named_parameters())
    assert {p.dtype for p in engine_weights.values()} == {torch.bfloat16}
    assert {p.dtype for p in trainer_weights.values()} == {torch.float32}
    for name, engine_weight in engine_weights.items():  # the trainer's, rounded to bfloat16
        expected = trainer_weights[name].full_tensor().to(torch.bfloat16)
        assert torch.equal(engine_weight, expected), name
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert all(r["memory/engine_released_gb"] == 0 for r in rows)  # switched off
    # bfloat16 sampling: a mismatch beyond anything float32 rounding explains on these tokens
    # (measured: 1.5e-3 against a bound of about 1e-5), which TIS corrects
    error, magnitude = float32_logprob_error(tiny_policy_dir, batches[0].sequences)
    assert rows[0]["mismatch/max_abs"] > tolerance(error, magnitude)


async def test_resume_reproduces_the_next_batch(tiny_policy_dir, tmp_path):
    straight, _ = await train(tiny_config(tiny_policy_dir, tmp_path / "a", "trainer.steps=3"))
    expected = straight.last_batch
    await train(tiny_config(tiny_policy_dir, tmp_path / "b", "trainer.steps=2"))
    resumed, summary = await train(tiny_config(tiny_policy_dir, tmp_path / "b", "trainer.steps=3"))
    assert summary.steps == 1 and summary.final_step == 3
    got = resumed.last_batch
    assert [s["input_ids"] for s in got.sequences] == [s["input_ids"] for s in expected.sequences]
    assert [s["advantages"] for s in got.sequences] == [s["advantages"] for s in expected.sequences]
    rows_a = read_metrics(tmp_path / "a" / "metrics.jsonl")
    rows_b = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in rows_b] == [1, 2, 3]
    # both engines sampled step 3 with the step-2 weights (the resumed one took them from the
    # checkpoint): the same tokens' log-probs differ by float32 rounding at most, which step 1
    # (engine and trainer holding the same weights) measured
    bound = mismatch_bound(rows_a[0]["mismatch/max_abs"], tiny_policy_dir)
    for a, b in zip(got.sequences, expected.sequences, strict=True):
        assert a["logprobs"] == pytest.approx(b["logprobs"], abs=bound)
    # the same batch on the same weights: each loss term moves by at most its size times
    # expm1(2 * bound) (its engine and its trainer log-prob each by the bound), and float32
    # rounds terms of that size
    term = max_loss_term(straight.config)
    loss_atol = term * math.expm1(2 * bound) + tolerance(0.0, term)
    assert rows_b[-1]["train/loss"] == pytest.approx(rows_a[-1]["train/loss"], abs=loss_atol)


async def test_dapo_dynamic_sampling_and_overlong_penalty_in_a_run(tiny_policy_dir, tmp_path):
    # 2 groups per step, at most 2 * 2 = 4 drawn; L_max = max_new_tokens = 8, L_cache = 4
    config = tiny_config(
        tiny_policy_dir,
        tmp_path,
        "algorithm.dynamic_sampling=true",
        "algorithm.dynamic_sampling_max_draws=2",
        "algorithm.overlong_buffer=4",
        "trainer.export_hf=false",
    )
    _, summary = await train(config)
    assert summary.final_step == 2
    for row in read_metrics(tmp_path / "metrics.jsonl"):
        drawn, filtered = row["dynamic_sampling/drawn"], row["dynamic_sampling/filtered"]
        assert 2 <= drawn <= 4
        assert drawn - filtered == row["episodes/groups"]  # the kept groups are the batch
        assert row["dynamic_sampling/cap_hit"] == (row["episodes/groups"] < 2)
        if row["batch/sequences"]:
            assert -1 <= row["reward/overlong_penalty_mean"] <= 0
            assert 0 <= row["reward/overlong_fraction"] <= 1


@pytest.mark.parametrize("partial", ["pause", "abort"])
async def test_streaming_with_a_staleness_bound_and_partial_rollouts(
    tiny_policy_dir, tmp_path, partial
):
    config = tiny_config(
        tiny_policy_dir,
        tmp_path,
        "trainer.steps=3",
        "stream.max_staleness=1",
        "stream.staleness_mode=mask",
        f"stream.partial_rollouts={partial}",
        "rollout.max_new_tokens=48",
        "trainer.export_hf=false",
    )
    _, summary = await train(config)
    assert summary.final_step == 3
    # launches never run past the last step: 3 steps x 2 groups, none left pending at the end
    state = json.loads((summary.checkpoint / "trainer_state.json").read_text())
    assert state["extra"]["stream"] == {"next_group": 6, "pending_groups": []}
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert all(r["staleness/staleness_max"] <= 2 for r in rows)
    assert max(r["staleness/staleness_max"] for r in rows) >= 1  # rollouts overlapped training
    # the engine keeps its weights while the next step's rollouts run beside the training, and
    # frees them for the last step, which nothing overlaps
    for row in rows:
        assert row["memory/engine_released_gb"] == 0 or row["stream/in_flight_groups"] == 0
    assert rows[-1]["memory/engine_released_gb"] > 0
    # masked stale tokens are counted; tokens within the bound are trained on
    assert all(r["batch/loss_tokens"] > 0 for r in rows)


async def test_a_stop_request_ends_the_run_with_a_checkpoint(tiny_policy_dir, tmp_path):
    config = tiny_config(tiny_policy_dir, tmp_path, "trainer.steps=50")
    async with Trainer(config, show_progress=False) as trainer:
        run = asyncio.create_task(trainer.run())
        while trainer.actor.step < 1:
            await asyncio.sleep(0.05)
        trainer.request_stop()
        summary = await run
    assert summary.interrupted and 1 <= summary.final_step < 50
    assert summary.checkpoint is not None and summary.checkpoint.name.endswith(
        f"{summary.final_step:08d}"
    )
    assert (tmp_path / "curves.png").exists()


def write_config(policy_dir, out, path, *extra):
    config = tiny_config(policy_dir, out, *extra)
    path.write_text(config.to_yaml())
    return path


def test_the_launcher_refuses_bad_keys_with_a_clear_message(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "train",
            "examples/math_grpo_cpu.yaml",
            "trainer.stepz=3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "trainer.stepz: unknown key" in result.stdout


def test_ctrl_c_stops_the_launcher_cleanly(tiny_policy_dir, tmp_path):
    config = write_config(
        tiny_policy_dir, tmp_path / "run", tmp_path / "c.yaml", "trainer.steps=500"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "train", str(config)],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().strip()) and time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 130, output
    assert "stopping after the current step" in output
    assert list((tmp_path / "run" / "checkpoints").iterdir())
    assert (tmp_path / "run" / "curves.png").exists()


async def test_two_processes_train_the_same_batch_to_the_same_loss(tiny_policy_dir, tmp_path):
    """torchrun with 2 CPU ranks (gloo): rank 0 rolls out, both train, each on half of the batch
    or (``actor.sequence_parallel=2``) each on half of every micro-batch's tokens; the first
    step's batch is the same as one process's, so the loss and gradient norm must agree, to
    float32 rounding: as far apart as step 1 in float32 is from float64 on this CPU, within
    ``FACTOR``."""
    runs = {"one": (1, []), "two": (2, []), "sequence": (2, ["actor.sequence_parallel=2"])}
    losses = {}
    for name, (nproc, extra) in runs.items():
        out = tmp_path / name
        config = write_config(tiny_policy_dir, out, tmp_path / f"{name}.yaml", "trainer.steps=2")
        env = subprocess_env()
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += [f"--nproc_per_node={nproc}", "-m", "agentrl.cli", "train", str(config)]
        result = run_torchrun(command + extra, timeout=400, env=env, output_dir=out)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        shared = "sequence parallel: 2 ranks per micro-batch, 1 data-parallel group"
        assert (shared in result.stdout) == (name == "sequence")
        losses[name] = read_metrics(out / "metrics.jsonl")
    rounding = await step_one_rounding(tiny_policy_dir, tmp_path / "reference")
    term = max_loss_term(TrainConfig.load(tmp_path / "one.yaml"))  # the magnitude summed
    loss_atol = tolerance(rounding["train/loss"], term)
    # step 1 trains the same batch; later batches are sampled from weights that differ by rounding
    one = losses["one"][0]
    for name in ("two", "sequence"):
        assert [r["step"] for r in losses[name]] == [1, 2]
        two = losses[name][0]
        assert two["batch/tokens"] == one["batch/tokens"]
        assert two["train/loss"] == pytest.approx(one["train/loss"], abs=loss_atol), name
        norm_atol = tolerance(rounding["train/grad_norm"], one["train/grad_norm"])
        assert two["train/grad_norm"] == pytest.approx(one["train/grad_norm"], abs=norm_atol)
    print(json.dumps({n: [r["train/loss"] for r in rows] for n, rows in losses.items()}))


@pytest.mark.parametrize(
    ("resume", "message"),
    [("auto", "has no checkpoint to resume"), ("never", "trainer.resume=never")],
)
async def test_a_new_run_refuses_an_old_runs_metrics(tiny_policy_dir, tmp_path, resume, message):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    config = tiny_config(tiny_policy_dir, tmp_path, f"trainer.resume={resume}")
    with pytest.raises(ConfigError, match=message):
        await train(config)
    assert (tmp_path / "metrics.jsonl").read_text().startswith('{"step": 1')  # nothing lost


async def test_resuming_a_missing_checkpoint_is_a_clear_error(tiny_policy_dir, tmp_path):
    config = tiny_config(tiny_policy_dir, tmp_path, f"trainer.resume={tmp_path / 'nope'}")
    with pytest.raises(ConfigError, match="no checkpoint directory"):
        await train(config)
