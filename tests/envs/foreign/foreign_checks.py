"""Checks shared by the foreign-environment tests, in the project's venv and in side venvs
(``skyrl_side.py`` imports this file by path): a trajectory is token-exact, and one step of
``agentrl train`` on an environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]


def assert_token_exact(trajectory: Any, tokenizer: Any) -> None:
    """The episode's sampled tokens (loss mask 1) are, turn by turn, the tokens whose decoding
    the environment got as its action (the assistant messages), and the tokens hold every
    message's text in order (the prompt and the observations between the turns); no error."""
    assert trajectory.error is None and trajectory.infra_error is None, trajectory.error
    ids, mask = trajectory.tokens.input_ids, trajectory.tokens.loss_mask
    assert len(ids) == len(mask) == len(trajectory.tokens.logprobs)
    turns: list[list[int]] = []  # the runs of sampled tokens, one per turn
    previous = 0
    for token, sampled in zip(ids, mask, strict=True):
        if sampled and not previous:
            turns.append([])
        if sampled:
            turns[-1].append(token)
        previous = sampled
    actions = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
    assert len(turns) == len(actions) == len(trajectory.turns) >= 1
    for tokens, action, turn in zip(turns, actions, trajectory.turns, strict=True):
        assert len(tokens) == turn.completion_tokens
        assert tokenizer.decode(tokens, skip_special_tokens=True).strip() == action.strip()
    text, at = tokenizer.decode(ids), 0  # every message's text, in order, in the tokens
    for message in trajectory.messages:
        found = text.find(message["content"].strip(), at)
        assert found >= 0, f"{message} is not in the tokens after position {at}"
        at = found + len(message["content"].strip())


def train_one_step(
    tmp_path: Path, env_id: str, kwargs: dict[str, Any], python: str = sys.executable
) -> dict[str, Any]:
    """``agentrl train`` for one step (2 groups of 2 episodes, 24 new tokens a turn) on SmolLM2
    on the CPU with ``env_id``; the step's metrics row."""
    config = {
        "model": {"path": "smollm2"},
        "env": {"id": env_id, "kwargs": kwargs},
        "rollout": {"groups_per_step": 2, "group_size": 2, "max_new_tokens": 24},
        "stream": {"max_staleness": 0},
        "trainer": {
            "steps": 1,
            "seed": 0,
            "output_dir": str(tmp_path / "run"),
            "export_hf": False,
        },
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [python, "-m", "agentrl.cli", "train", str(path)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in metrics]
    assert [row["step"] for row in rows] == [1], rows
    row: dict[str, Any] = rows[0]
    return row
