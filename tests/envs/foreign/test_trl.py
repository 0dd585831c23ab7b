"""agentrl/Math-v0 (multi-turn) in TRL's ``GRPOTrainer`` through ``environment_factory``
(``trl_side.py`` in ``.venv-trl``, made by ``bench/setup_trl_env.sh``; trl 1.16.0): TRL's own
``get_json_schema`` renders the environment's tool as Math-v0 declares it, the tool method runs
the tool in the environment, ``trl_reward`` grades the final text with Math-v0's verifier, and
TRL's real trainer takes one step on SmolLM2 (warmed up to open with a tool call) with one
reset, one tool call through TRL's tool loop and one grade per rollout."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import gymnasium
import pytest

ROOT = Path(__file__).resolve().parents[3]
SIDE_VENV = ROOT / ".venv-trl"
SIDE = Path(__file__).with_name("trl_side.py")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_trls_grpo_trainer_takes_a_step_on_math_multi_turn(tmp_path):
    if not (SIDE_VENV / ".trl-baseline-installed").exists():
        pytest.fail(f"the TRL venv is missing ({SIDE_VENV}): run bench/setup_trl_env.sh")
    done = subprocess.run(
        [SIDE_VENV / "bin" / "python", SIDE, tmp_path],
        capture_output=True,
        text=True,
        timeout=880,
        env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])

    env = gymnasium.make(
        "agentrl/Math-v0", mode="multi", tool_format="hermes", sandbox="subprocess"
    )
    messages, info = env.reset(seed=0, options={"index": 3})
    env.close()
    tool = info["tools"][0]["function"]
    schema = result["schema"]["function"]
    assert (schema["name"], schema["description"]) == (tool["name"], tool["description"])
    assert schema["parameters"]["properties"] == tool["parameters"]["properties"]
    assert schema["parameters"]["required"] == tool["parameters"]["required"]
    assert result["task"] == "\n\n".join(m["content"] for m in messages)
    assert result["tool_output"] == "42\n"  # the python tool ran print(6 * 7)
    assert result["reward"] == [1.0]  # "So she has 4.": the gold answer, flexible format
    # graded while the verifier's workers were killed: an infra_error, which TRL must leave out
    # (a reward function's None: its "unscorable" completion, advantage 0, out of the baseline)
    assert result["unjudged_reward"] == [None]

    assert result["steps"] == 1 and result["loss_finite"]
    episodes = result["episodes"]  # 2 prompts x 2 generations, each reset, then graded once
    assert sorted(e["row"]["index"] for e in episodes) == [3, 3, 5, 5]
    # every rollout went through TRL's tool loop: a call of the python tool (a turn of the
    # environment) before the final answer, none failed
    assert [e["turns"] for e in episodes] == [2, 2, 2, 2]
    assert result["tool_calls"] >= 1 and result["tool_failures"] == 0
    rewards = [e["reward"] for e in episodes]
    assert all(0.0 <= r <= 1.0 for r in rewards)
    assert result["logged_reward"] == pytest.approx(sum(rewards) / len(rewards))
