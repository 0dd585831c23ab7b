"""`agentrl eval` with the real SmolLM2 engine on Math-v0: every task enumerated in order, the same
rows on a rerun, a run killed mid-way resumed without losing or repeating an episode, a changed
config refused, and episodes the environment could not judge left out of every number."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from agentrl.cli import main
from agentrl.config import ConfigError
from agentrl.envs import AgentEnv, register_env
from agentrl.evaluation import EvalConfig, evaluate, summarize
from agentrl.evaluation.run import EPISODES, planned_tasks, prepare_output

VALUES = {
    "env": {"id": "agentrl/Math-v0", "kwargs": {"answer_format": "flexible"}},
    "sampling": {"max_new_tokens": 16, "max_total_tokens": 512},
    "eval": {"k": 2, "max_tasks": 3, "concurrency": 1},
}


def config(out, **sections) -> EvalConfig:
    values = json.loads(json.dumps(VALUES))
    for section, changes in sections.items():
        values.setdefault(section, {}).update(changes)
    values["eval"]["output_dir"] = str(out)
    return EvalConfig.build("test config", values)


def keys(rows):
    return sorted((r["env"], r["index"], r["sample"]) for r in rows)


@pytest.mark.slow
async def test_every_task_is_run_k_times_and_a_rerun_gives_the_same_rows(
    engine, tokenizer, tmp_path
):
    first = await evaluate(config(tmp_path / "a"), engine, tokenizer)
    again = await evaluate(config(tmp_path / "b"), engine, tokenizer)
    expected = [("Math-v0", i, s) for i in range(3) for s in range(2)]
    assert keys(first) == keys(again) == expected
    by_key = {(r["index"], r["sample"]): r for r in again}
    for row in first:
        other = by_key[row["index"], row["sample"]]
        assert row["input_ids"] == other["input_ids"]  # one episode at a time: the same tokens
        assert row["passed"] == (row["error"] is None and row["reward"] >= 1.0)
    prompts = {
        i: {json.loads(r["messages"])[1]["content"] for r in first if r["index"] == i}
        for i in range(3)
    }
    assert all(len(p) == 1 for p in prompts.values()) and len(set.union(*prompts.values())) == 3
    numbers = summarize(first, [1, 2])["Math-v0"]
    assert numbers["tasks"] == 3 and numbers["episodes"] == numbers["judged"] == 6
    assert 0 <= numbers["pass@1"] <= numbers["pass@2"] <= 1
    assert numbers["completion_tokens_mean"] > 0

    # The same directory with another config is refused, naming what changed.
    with pytest.raises(ConfigError, match=r"differs in sampling\.temperature"):
        await evaluate(config(tmp_path / "a", sampling={"temperature": 0.5}), engine, tokenizer)
    # ...but the same config there runs nothing again.
    assert keys(await evaluate(config(tmp_path / "a"), engine, tokenizer)) == expected


@pytest.mark.slow
def test_a_killed_evaluation_resumes_without_losing_or_repeating_an_episode(tmp_path):
    out = tmp_path / "out"
    path = tmp_path / "eval.yaml"
    values = json.loads(json.dumps(VALUES))
    values["eval"].update({"max_tasks": 4, "output_dir": str(out)})
    path.write_text(yaml.safe_dump(values))
    process = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "eval", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    episodes = out / EPISODES
    deadline = time.monotonic() + 300
    while not (episodes.exists() and episodes.read_text().count("\n") >= 2):
        assert process.poll() is None, "the evaluation ended before it could be killed"
        assert time.monotonic() < deadline, "no episode was written in 300 s"
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = episodes.read_text().splitlines(keepends=True)
    with episodes.open("a") as file:  # a line cut short, as a kill in the middle of a write leaves
        file.write(before[-1][: len(before[-1]) // 2])

    assert main(["eval", str(path)]) == 0
    after = episodes.read_text().splitlines(keepends=True)
    assert after[: len(before)] == before  # what was on record is kept as it was
    rows = [json.loads(line) for line in after]
    assert keys(rows) == [("Math-v0", i, s) for i in range(4) for s in range(2)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["Math-v0"]["episodes"] == 8
    assert "pass@2" in (out / "summary.md").read_text()


def test_unjudged_episodes_enter_no_number():
    def row(index, sample, reward, passed, error=None, infra=None):
        return {
            "env": "E",
            "index": index,
            "sample": sample,
            "passed": passed,
            "reward": reward,
            "error": error,
            "infra_error": infra,
            "turns": json.dumps([{}]),
            "messages": json.dumps([{"role": "user"}, {"role": "tool"}]),
            "loss_mask": [1, 1, 0],
        }

    rows = [
        row(0, 0, 1.0, True),
        row(0, 1, 0.0, False),
        row(0, 2, 0.0, False, infra="grader down"),  # not a failure of the policy
        row(1, 0, 0.0, False, error="engine: died"),
        row(1, 1, 1.0, True),
        row(1, 2, 1.0, True),
    ]
    numbers = summarize(rows, [1, 2])["E"]
    assert (numbers["judged"], numbers["errors"], numbers["infra_errors"]) == (4, 1, 1)
    assert numbers["pass@1"] == pytest.approx((1 / 2 + 2 / 2) / 2)
    assert numbers["pass@2"] == pytest.approx((1.0 + 1.0) / 2)
    assert numbers["reward_mean"] == pytest.approx(3 / 4)
    assert numbers["tool_calls_mean"] == 1 and numbers["completion_tokens_mean"] == 2
    for r in rows:  # task 0 is easy, task 1 hard
        r["tags"] = json.dumps({"difficulty": "easy" if r["index"] == 0 else "hard"})
    by_tag = summarize(rows, [1, 2])["E"]["by_tag"]
    assert sorted(by_tag) == ["difficulty=easy", "difficulty=hard"]
    assert by_tag["difficulty=easy"]["pass@1"] == pytest.approx(1 / 2)
    assert by_tag["difficulty=hard"]["pass@1"] == pytest.approx(1.0)
    assert by_tag["difficulty=easy"]["infra_errors"] == 1
    short = summarize(rows[:3], [1, 3])["E"]  # task 0 has 2 judged samples: none for pass@3
    assert short["pass@3_tasks"] == 0 and math.isnan(short["pass@3"])
    assert short["tasks_short"] == 1


class EndlessEnv(AgentEnv):
    """A third-party environment that draws its tasks and does not say how many there are."""

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed, options=options)
        return [{"role": "user", "content": "say anything"}], {}

    async def astep(self, action):
        return [], 0.0, True, False, {}


async def test_an_environment_that_cannot_enumerate_its_tasks_is_named(tmp_path):
    register_env("evaltest/Endless-v0", EndlessEnv)
    with pytest.raises(ValueError, match=r"evaltest/Endless-v0 cannot enumerate its tasks"):
        await planned_tasks(config(tmp_path, env={"id": "evaltest/Endless-v0", "kwargs": {}}))
    with pytest.raises(ConfigError, match="ks"):
        config(tmp_path, eval={"ks": [3]})
    prepare_output(config(tmp_path / "fresh"))
    assert (tmp_path / "fresh" / "eval_config.json").exists()


def test_the_reference_page_and_the_example_are_current():
    from pathlib import Path

    from agentrl.evaluation.config import config_reference_markdown

    root = Path(__file__).parents[2]
    assert (root / "docs" / "eval_config.md").read_text() == config_reference_markdown(), (
        "docs/eval_config.md is stale: agentrl eval --help-config --markdown > docs/eval_config.md"
    )
    example = EvalConfig.load(root / "examples" / "eval" / "math_cpu.yaml")
    assert example.eval.pass_ks == [1, 4] and example.env.id == "agentrl/Math-v0"


def test_evaluations_side_by_side(tmp_path, capsys):
    from agentrl.evaluation.report import write_reports

    def row(index, passed):
        return {
            "env": "Math-v0",
            "index": index,
            "sample": 0,
            "passed": passed,
            "reward": float(passed),
            "error": None,
            "infra_error": None,
            "turns": "[{}]",
            "messages": "[]",
            "loss_mask": [1],
            "submission": None,
        }

    write_reports([row(0, False), row(1, False)], [1], tmp_path / "base", "base")
    write_reports([row(0, True), row(1, False)], [1], tmp_path / "sft", "sft")
    assert main(["eval", "--compare", str(tmp_path / "base"), str(tmp_path / "sft")]) == 0
    table = capsys.readouterr().out
    assert "| pass@1 |" in table and "0.000 ± 0.000" in table and "0.500 ± 0.500" in table
    assert main(["eval", "--compare", str(tmp_path)]) == 2
