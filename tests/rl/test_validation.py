"""Validation during training (the train config's ``eval`` section): held-out tasks evaluated on the
run's engines before training and every step, logged as ``val/*`` with the step, kept by a resumed
run, in the run summary and the curves."""

from __future__ import annotations

import json

import pytest
from test_loop import tiny_config, train

from agentrl.envs.math.generated import generate_problems
from agentrl.training.metrics import read_metrics

pytestmark = pytest.mark.slow

MATH = "env.id=agentrl/Math-v0"
VALIDATION = [
    "env.kwargs={answer_format: flexible}",
    "eval.every=1",
    "eval.before_training=true",
    "eval.max_tasks=3",
    "eval.k=2",
]


async def test_every_step_is_validated_on_held_out_tasks_and_a_resumed_run_keeps_the_history(
    tiny_policy_dir, tmp_path
):
    config = tiny_config(tiny_policy_dir, tmp_path, *VALIDATION, env=MATH)
    _, summary = await train(config)
    assert sorted(summary.validation) == [0, 1, 2]
    rows = {row["step"]: row for row in read_metrics(tmp_path / "metrics.jsonl")}
    assert sorted(rows) == [0, 1, 2]
    for step in (0, 1, 2):
        assert 0.0 <= rows[step]["val/Math-v0/pass@1"] <= rows[step]["val/Math-v0/pass@2"] <= 1.0
        assert rows[step]["val/Math-v0/judged"] + rows[step]["val/Math-v0/infra_errors"] <= 6
        assert summary.validation[step]["val/Math-v0/pass@1"] == rows[step]["val/Math-v0/pass@1"]
        episodes = tmp_path / "validation" / f"step_{step}" / "episodes.jsonl"
        lines = [json.loads(line) for line in episodes.read_text().splitlines()]
        assert sorted((r["index"], r["sample"]) for r in lines) == [
            (i, s) for i in range(3) for s in range(2)
        ]
        held_out = [p.question for p in generate_problems(3, 0, 1, "test")]
        for row in lines:  # the test split's problems, never a training one
            messages = json.loads(row["messages"])
            assert any(held_out[row["index"]] in m["content"] for m in messages), messages
    assert "train/loss" in rows[1] and "train/loss" not in rows[0]
    assert (tmp_path / "curves.png").exists()

    resumed = tiny_config(tiny_policy_dir, tmp_path, *VALIDATION, "trainer.steps=3", env=MATH)
    _, summary = await train(resumed)
    assert sorted(summary.validation) == [3]  # not again before training: the run resumed
    rows = {row["step"]: row for row in read_metrics(tmp_path / "metrics.jsonl")}
    assert sorted(rows) == [0, 1, 2, 3] and all("val/Math-v0/pass@1" in rows[s] for s in rows)
