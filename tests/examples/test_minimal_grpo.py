"""examples/minimal_grpo.py runs as a user runs it, and its loop trains and syncs the engine.

Tiny settings: 2 steps of 2 groups x 2 samples, 48 new tokens. Whether a step has reward signal
(a nonzero gradient, so weights that change) depends on the samples, so the checks do not: every
step ran every episode, its numbers are finite, and after each sync the engine reports the step's
weight version and holds exactly the actor's weights (which an omitted sync fails once a step has
signal; seed 0 gives the first step signal on an AVX512-BF16 CPU).
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "examples" / "minimal_grpo.py"


def test_the_example_stays_minimal():
    assert len(SCRIPT.read_text().splitlines()) <= 250


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_minimal_grpo_trains_and_syncs_every_step():
    command = [sys.executable, str(SCRIPT), "--steps", "2", "--groups", "2", "--group-size", "2"]
    command += ["--max-new-tokens", "48", "--lr", "2e-6", "--seed", "0"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [row["step"] for row in rows] == [1, 2], run.stdout
    for row in rows:
        assert row["episodes"] == 4 and row["errors"] == 0, row
        assert 0 <= row["reward"] <= 1, row  # NaN fails too: no episode was judged
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]), row
        assert 0 < row["response_tokens"] <= 48, row
        assert row["weight_version"] == row["step"], row  # one sync per step, as version `step`
        assert row["sync_gap"] == 0.0, row  # every engine weight is the actor's, in its dtype


def test_bad_knobs_fail_naming_the_key():
    command = [sys.executable, str(SCRIPT), "--group-size", "0"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "rollout.group_size" in run.stderr, run.stderr[-3000:]
