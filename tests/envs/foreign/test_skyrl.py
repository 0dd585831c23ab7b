"""skyrl-gym both ways, against skyrl-gym 0.4.0's own code (``skyrl_side.py`` in ``.venv-skyrl``,
made by ``scripts/setup-skyrl-env``): ``agentrl/SkyRL-v0`` runs skyrl-gym's ``gsm8k_multi_turn``
in token-exact rollouts and trains a step on it; ``register_skyrl_env`` makes agentrl/Math-v0
(multi-turn) a skyrl-gym ``BaseTextEnv`` that answers SkyRL's generator's calls as the
environment answers them in-process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import gymnasium
import pytest
from foreign_checks import train_one_step

from agentrl.config import ConfigError

ROOT = Path(__file__).resolve().parents[3]
SIDE_VENV = ROOT / ".venv-skyrl"
SIDE = Path(__file__).with_name("skyrl_side.py")
ACTIONS = ["<python>print(6*7)</python>", "So the answer is \\boxed{4}", "never sent"]


@pytest.fixture(scope="module")
def side_python() -> Path:
    """The side venv's interpreter; missing, the tests fail (CI must not skip them)."""
    if not (SIDE_VENV / ".skyrl-env-installed").exists():
        pytest.fail(f"the skyrl venv is missing ({SIDE_VENV}): run scripts/setup-skyrl-env")
    return SIDE_VENV / "bin" / "python"


def side(side_python: Path, command: str, stdin: object = None) -> dict:
    done = subprocess.run(
        [side_python, SIDE, command],
        input=json.dumps(stdin),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict = json.loads(done.stdout.splitlines()[-1])
    return result


def in_process(max_turns: int) -> dict:
    """The episode skyrl_side.py's agent loop runs, on agentrl/Math-v0 itself."""
    env = gymnasium.make("agentrl/Math-v0", mode="multi", sandbox="subprocess", max_turns=max_turns)
    try:
        messages, info = env.reset(seed=0, options={"index": 3})
        steps = []
        for action in ACTIONS:
            observations, reward, terminated, truncated, step_info = env.step(action)
            steps.append((observations, reward, terminated or truncated, step_info))
            if terminated or truncated:
                break
        return {"init": messages, "tools": info["tools"], "steps": steps}
    finally:
        env.close()


@pytest.mark.slow
def test_math_as_a_skyrl_env_answers_the_generators_calls_as_in_process(side_python):
    result = side(side_python, "export", ACTIONS)
    for max_turns, runs in (
        (3, [result["threaded"], result["on_loop"]]),
        (1, [result["one_turn"]]),
    ):
        expected = in_process(max_turns)
        for run in runs:
            assert run["init"] == expected["init"]
            assert run["metadata"] == {"tools": expected["tools"]}
            got = [(s["observations"], s["reward"], s["done"], s["metadata"]) for s in run["steps"]]
            assert got == [(list(o), float(r), d, i) for o, r, d, i in expected["steps"]]
            rewards = [s["reward"] for s in run["steps"]]
            assert run["metrics"] == {"turns": len(rewards), "reward": sum(rewards)}
    assert [s["reward"] for s in result["threaded"]["steps"]] == [0.0, 1.0]
    assert (
        len(result["one_turn"]["steps"]) == 1
    )  # generator.max_turns=1: the turn limit's truncation
    assert result["aggregate"] == {"turns": 2.0, "reward": 1.0}  # BaseTextEnv's own aggregation


@pytest.mark.slow
def test_skyrl_gym_env_rollouts_are_token_exact(side_python):
    result = side(side_python, "rollout")
    assert result["token_exact"]
    for episode in result["episodes"]:
        task = episode["messages"][0]["content"]
        assert task.startswith("What is ") and episode["terminated"]
        assert all(reward in (0.0, 0.1, 1.0) for reward in episode["turn_rewards"])  # gsm8k's
        assert 1 <= len(episode["turn_rewards"]) <= 2  # the row's max_turns


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_training_step_on_a_skyrl_gym_env(side_python, tmp_path):
    tasks = [
        {
            "prompt": [{"role": "user", "content": f"What is {a} + {b}? End with '#### ANSWER'."}],
            "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
            "max_turns": 2,
        }
        for a, b in [(2, 3), (7, 5)]
    ]
    kwargs = {"env": "gsm8k_multi_turn", "tasks": tasks}
    row = train_one_step(tmp_path, "agentrl/SkyRL-v0", kwargs, python=str(side_python))
    assert row["episodes/count"] == 4 and row["episodes/errors"] == 0, row


def test_bad_tasks_fail_naming_the_key():
    with pytest.raises(ConfigError, match="tasks"):
        gymnasium.make("agentrl/SkyRL-v0", env="gsm8k", tasks=[])
    with pytest.raises(ValueError, match=r"tasks\[1\]\.prompt"):
        gymnasium.make("agentrl/SkyRL-v0", env="gsm8k", tasks=[{"prompt": []}, {"prompt": "x"}])
