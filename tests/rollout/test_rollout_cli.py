"""`agentrl rollout` end to end with the real model, and its argument errors."""

import datasets
import pytest

from agentrl.cli import main
from agentrl.config import ConfigError
from agentrl.rollout import Trajectory


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_rollout_writes_trajectories_that_load_back_with_datasets(tmp_path, suffix, capsys):
    out = tmp_path / f"t{suffix}"
    code = main(
        [
            "rollout",
            "--env",
            "agentrl/Math-v0",
            "--env-kwargs",
            "answer_format=flexible",
            "--n",
            "2",
            "--group-size",
            "2",
            "--max-new-tokens",
            "12",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    reader = datasets.Dataset.from_json if suffix == ".jsonl" else datasets.Dataset.from_parquet
    rows = reader(str(out))
    assert len(rows) == 4
    trajectories = [Trajectory.from_record(row) for row in rows]
    assert sorted((t.group, t.sample) for t in trajectories) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(sum(t.tokens.loss_mask) == t.completion_tokens > 0 for t in trajectories)
    printed = capsys.readouterr().out
    assert "mean reward" in printed and "tokens/s" in printed


@pytest.mark.parametrize(
    ("argv", "error", "message"),
    [
        (["--env", "CartPole-v1"], SystemExit, "not an agentrl environment"),
        (["--env", "agentrl/Math-v0", "--out", "x.txt"], SystemExit, r"\.jsonl or \.parquet"),
        (["--env", "agentrl/Math-v0", "--env-kwargs", "modes=multi"], ConfigError, "modes"),
        (["--env", "agentrl/Math-v0", "--env-kwargs", "oops"], SystemExit, "KEY=VALUE"),
    ],
)
def test_bad_arguments_are_clear_errors(argv, error, message, tmp_path):
    with pytest.raises(error, match=message):
        main(["rollout", *argv])


def test_the_summary_averages_judged_episodes_and_counts_the_others(tmp_path):
    from rich.console import Console

    from agentrl.rollout.cli import judged_mean, summary_table
    from agentrl.tokenization import TokenTrajectory
    from agentrl.tokenization.trajectory import Segment, SegmentKind

    def episode(reward: float, **fault) -> Trajectory:
        segments = [Segment(SegmentKind.PROMPT, 0, 1), Segment(SegmentKind.COMPLETION, 1, 2)]
        tokens = TokenTrajectory([1, 2], [0, 1], [0.0, -0.5], [-1, 0], 1, segments)
        return Trajectory("t", 0, 0, 0, tokens, [], reward=reward, **fault)

    episodes = [
        episode(1.0, reward_components={"resolved": 1.0}),
        episode(0.0, reward_components={"resolved": 0.0}),
        episode(0.0, infra_error="no grading sandbox"),
        episode(0.0, error="engine: dead"),
    ]
    assert judged_mean(episodes) == 0.5 and judged_mean(episodes, "resolved") == 0.5
    assert judged_mean(episodes[2:]) != judged_mean(episodes[2:])  # nan: nothing judged
    console = Console(width=200, record=True)
    console.print(summary_table(episodes, 1.0, tmp_path / "t.jsonl"))
    rows = {
        cells[0]: cells[1]
        for line in console.export_text().splitlines()
        if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 2
    }
    assert rows["mean reward (judged)"] == rows["mean resolved"] == "0.500"
    assert rows["judged"] == "2" and rows["errors"] == "1 (first: engine: dead)"
    assert rows["infra errors (not judged)"] == "1 (first: no grading sandbox)"
