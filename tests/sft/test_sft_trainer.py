"""Whole SFT runs with a tiny random policy: the loss falls, outputs, data order, resume, errors.

The policy is the suite's 2-layer Llama over SmolLM2's vocabulary (``tiny_policy_dir``): the
mechanics are those of any model, and a run takes seconds. Resuming is asserted bit-exact
(``torch.equal`` on the exported weights), as for the RL trainer's checkpoints.
"""

import json
import os
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
from float_tolerance import tolerance
from safetensors.torch import load_file
from torchrun_jobs import run_torchrun

from agentrl.config import ConfigError
from agentrl.models import load_model, load_tokenizer
from agentrl.sft.config import SFTConfig
from agentrl.sft.trainer import SFTTrainer, batch_indices, nll_loss
from agentrl.training.actor import Actor
from agentrl.training.distributed import distributed
from agentrl.training.metrics import read_metrics
from agentrl.training.packing import pack_for_rank

pytestmark = pytest.mark.slow

ROWS = 16


def tool_conversation(a: int, b: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "Use <python>code</python> to compute."},
        {"role": "user", "content": f"What is {a} * {b}?"},
        {"role": "assistant", "content": f"Let me compute it.\n<python>print({a} * {b})</python>"},
        {"role": "tool", "name": "python", "content": f"{a * b}\n"},
        {"role": "assistant", "content": f"The answer is \\boxed{{{a * b}}}."},
    ]


@pytest.fixture(scope="module")
def conversations(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "conversations.jsonl"
    rows = [{"messages": tool_conversation(3 + i, 7 + 2 * i)} for i in range(ROWS)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sft_config(policy_dir, data, out, *overrides):
    return SFTConfig.load(
        None,
        [
            f"model.path={policy_dir}",
            f"data.path={data}",
            "data.max_tokens=256",
            f"trainer.output_dir={out}",
            "trainer.batch_size=4",
            "trainer.micro_batch_tokens=512",
            "trainer.tensorboard=false",
            "actor.lr=1e-2",
            *overrides,
        ],
    )


def run(config):
    had_group = dist.is_initialized()
    with SFTTrainer(config, show_progress=False) as trainer:
        summary = trainer.run()
    assert dist.is_initialized() == had_group  # a group the trainer made is gone after it
    return trainer, summary


@pytest.fixture(scope="module")
def finished_run(tiny_policy_dir, conversations, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    config = sft_config(
        tiny_policy_dir,
        conversations,
        out,
        "trainer.steps=6",
        "data.val_fraction=0.25",
        "trainer.eval_every=3",
        "trainer.tensorboard=true",
    )
    trainer, summary = run(config)
    return trainer, summary, out


def test_a_run_lowers_the_loss_and_writes_its_outputs(finished_run):
    trainer, summary, out = finished_run
    assert summary.steps == summary.final_step == 6 and not summary.interrupted
    assert len(trainer.train_data.rows) == 12 and len(trainer.val_data.rows) == 4
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]
    assert 0 <= rows[-1]["train/token_accuracy"] <= 1
    assert [r["step"] for r in rows if "val/loss" in r] == [3, 6]
    assert rows[-1]["val/loss"] < rows[2]["val/loss"]
    assert rows[-1]["train/epoch"] == 2.0  # 12 training rows, 4 per step
    peaks = [r["memory/peak_rss_gb"] for r in rows]
    assert peaks == sorted(peaks) and peaks[0] > 0  # a peak since the start: it never falls
    logged = {k: v for k, v in rows[-1].items() if k not in ("step", "time")}
    assert summary.last_metrics == pytest.approx(logged)
    assert (out / "curves.png").stat().st_size > 0
    assert list((out / "tensorboard").iterdir())
    assert summary.checkpoint == out / "checkpoints" / "step_00000006"
    assert SFTConfig.load(out / "config.yaml") == trainer.config

    model = load_model(summary.exported)
    tokenizer = load_tokenizer(summary.exported)
    assert tokenizer.chat_template and tokenizer.chat_template == trainer.tokenizer.chat_template
    weights = load_file(summary.exported / "model.safetensors")
    assert not torch.equal(
        weights["model.norm.weight"], load_model(trainer.config.model.path).model.norm.weight
    )
    torch.testing.assert_close(model.model.norm.weight, weights["model.norm.weight"])


def test_each_epoch_visits_every_row_once_in_its_own_order(finished_run):
    orders = []
    for epoch in range(3):  # 13 rows, batches of 4: 4 steps per epoch, the last of 1 row
        batches = [batch_indices(5, epoch * 4 + s, 13, 4) for s in range(4)]
        assert [len(b) for b in batches] == [4, 4, 4, 1]
        orders.append([i for b in batches for i in b])
        assert sorted(orders[-1]) == list(range(13))
    assert len({tuple(order) for order in orders}) == 3
    assert batch_indices(5, 6, 13, 4) == batch_indices(5, 6, 13, 4)
    assert batch_indices(6, 6, 13, 4) != batch_indices(5, 6, 13, 4)

    trainer = finished_run[0]  # the trainer's batches are these rows
    rows = trainer.train_data.rows
    for step in range(6):
        expected = [rows[i] for i in batch_indices(0, step, len(rows), 4)]
        assert trainer.batch_rows(step) == expected


def test_a_stopped_run_resumes_to_the_uninterrupted_weights(
    tiny_policy_dir, conversations, tmp_path
):
    _, straight = run(sft_config(tiny_policy_dir, conversations, tmp_path / "a", "trainer.steps=4"))

    config = sft_config(tiny_policy_dir, conversations, tmp_path / "b", "trainer.steps=4")
    with SFTTrainer(config, show_progress=False) as trainer:
        take_step = trainer.step

        def step_then_stop():  # as Ctrl-C during step 2 would
            record = take_step()
            if trainer.actor.step == 2:
                trainer.request_stop()
            return record

        trainer.step = step_then_stop
        stopped = trainer.run()
    assert stopped.interrupted and stopped.final_step == 2 and stopped.exported is None
    assert stopped.checkpoint == tmp_path / "b" / "checkpoints" / "step_00000002"

    _, resumed = run(config)
    assert resumed.steps == 2 and resumed.final_step == 4 and not resumed.interrupted
    expected = load_file(straight.exported / "model.safetensors")
    got = load_file(resumed.exported / "model.safetensors")
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    rows_a = read_metrics(tmp_path / "a" / "metrics.jsonl")
    rows_b = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in rows_b] == [1, 2, 3, 4]
    assert [r["train/loss"] for r in rows_b] == [r["train/loss"] for r in rows_a]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["data.max_tokens=1024", "trainer.micro_batch_tokens=512"],
            r"micro_batch_tokens \(512\) must be at least data.max_tokens \(1024\)",
        ),
        (["data.val_path=v.jsonl", "data.val_fraction=0.1"], "val_path or data.val_fraction"),
        (["data.path=null"], "data.path is required"),
        (["trainer.epoch=2"], r"trainer\.epoch: unknown key"),
        (["data.val_fraction=1.5"], r"data\.val_fraction"),
    ],
)
def test_config_errors_name_the_problem(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        sft_config("policy", tmp_path / "d.jsonl", tmp_path / "out", *overrides)


@pytest.mark.parametrize(
    ("resume", "message"),
    [("auto", "has no checkpoint to resume"), ("never", "trainer.resume=never")],
)
def test_a_new_run_refuses_an_old_runs_metrics(
    tiny_policy_dir, conversations, tmp_path, resume, message
):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 2.5}\n')
    config = sft_config(tiny_policy_dir, conversations, tmp_path, f"trainer.resume={resume}")
    with pytest.raises(ConfigError, match=message):
        run(config)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "train/loss": 2.5}\n'
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match="no checkpoint directory"):
        run(sft_config(tiny_policy_dir, conversations, tmp_path, f"trainer.resume={missing}"))


def step_one_rounding(trainer: SFTTrainer) -> dict[str, float]:
    """How far float32 puts step 1's ``train/loss`` and ``train/grad_norm`` from float64 on this
    CPU: step 1's batch through actors made from the initial weights in float32 and in float64
    (float64 but for the log-softmax, which `packed_forward` computes in float32)."""
    config = trainer.config
    rows = trainer.batch_rows(0)
    micro_batches = pack_for_rank(rows, 0, 1, config.trainer.micro_batch_tokens)
    reports = []
    with distributed() as info:
        for dtype in (torch.float32, torch.float64):
            model = load_model(config.model.path, dtype="float32").to(dtype)
            reports.append(
                Actor(model, config.actor, dist_info=info).train_step(micro_batches, nll_loss)
            )
    float32, exact = reports
    return {
        "train/loss": abs(float32["loss"] - exact["loss"]),
        "train/grad_norm": abs(float32["grad_norm"] - exact["grad_norm"]),
    }


@pytest.mark.parametrize(
    "split",
    [[], ["actor.sequence_parallel=2"]],
    ids=["data-parallel", "sequence-parallel"],
)
def test_two_ranks_give_the_one_rank_loss(
    tiny_policy_dir, conversations, tmp_path, finished_run, split
):
    """torchrun with 2 CPU ranks (gloo): each rank packs half of the same batch, or (with
    ``actor.sequence_parallel=2``) both share every micro-batch, each running the model on half
    of its tokens; the loss is the mean over the whole batch's loss tokens, so step 1 matches the
    one-process run's, to float32 rounding: as far apart as step 1 in float32 is from float64 on
    this CPU, within ``FACTOR`` (tests/float_tolerance.py)."""
    out = tmp_path / "two"
    one = read_metrics(finished_run[2] / "metrics.jsonl")[0]
    config = tmp_path / "sft.yaml"
    config.write_text(finished_run[0].config.to_yaml())
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += ["-m", "agentrl.cli", "sft", str(config), f"trainer.output_dir={out}"]
    command += ["trainer.steps=1", "trainer.export_hf=false", *split]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = run_torchrun(command, timeout=300, env=env, output_dir=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (two,) = read_metrics(out / "metrics.jsonl")
    shared = "sequence parallel: 2 ranks per micro-batch, 1 data-parallel group"
    assert (shared in done.stdout) == bool(split)
    assert two["train/loss_tokens"] == one["train/loss_tokens"]
    rounding = step_one_rounding(finished_run[0])
    for key in ("train/loss", "train/grad_norm"):
        atol = tolerance(rounding[key], one[key])
        assert two[key] == pytest.approx(one[key], abs=atol), key
    assert not np.isnan(two["train/token_accuracy"])
