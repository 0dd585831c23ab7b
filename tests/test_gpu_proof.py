"""``scripts/gpu-proof --dry-run``: the GPU proof starts, before a GPU is ever at hand (issue 35).

The dry run is the proof's own code path on the CPU: its set-up (the random SmolLM2-shaped model,
versions), every step's command with CPU arguments at toy sizes (the GRPO config loaded and
validated), each step's JSON, the summary, and a check that the GPU run's own arguments parse.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["tests", "engine", "sampling", "rollout", "grpo", "fp8_mismatch", "fp8_training"]


def test_the_dry_run_runs_every_step_and_writes_its_json(tmp_path):
    run = subprocess.run(
        [
            *(sys.executable, str(ROOT / "scripts" / "gpu-proof"), "--dry-run", str(tmp_path)),
            *("--archive", str(tmp_path / "proof.tgz")),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    setup = json.loads((tmp_path / "00-setup.json").read_text())
    assert setup["dry_run"] and setup["versions"]["cuda"] is False
    assert set(setup["gpu_arguments"].values()) == {"ok"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["steps"]) == STEPS
    for index, name in enumerate(STEPS, start=1):
        step = json.loads((tmp_path / f"{index:02d}-{name}.json").read_text())
        assert step["status"] == "passed" and step == summary["steps"][name]
        assert (tmp_path / f"{index:02d}-{name}.log").read_text().startswith("$ ")
    results = summary["steps"]
    # on the CPU the GPU tests are collected and skipped, not run
    assert {c["outcome"] for c in results["tests"]["results"]["cases"].values()} == {"skipped"}
    assert set(results["engine"]["results"]["rows"]) == {"engine weights as trained"}
    assert len(results["fp8_mismatch"]["results"]["rows"]) == 2
    assert results["rollout"]["results"]["async_over_sync"] > 0
    # waiting for each turn's slowest tool never beats waiting for the slowest episode's tools
    assert results["rollout"]["results"]["latency_bound_async_over_sync"] >= 1
    assert results["sampling"]["results"]["speedup"] > 0
    assert list(results["fp8_training"]["results"]["modes"]) == ["bf16"]
    assert "gpu-proof summary on CPU (dry run)" in run.stdout
    # the one file a lent GPU brings back holds every result and log, not the scratch directory
    with tarfile.open(tmp_path / "proof.tgz") as archive:
        names = set(archive.getnames())
    assert {"summary.json", "00-setup.json", "07-fp8_training.log"} <= names
    assert not any(n.startswith("work") or n.startswith("proof.tgz") for n in names)
