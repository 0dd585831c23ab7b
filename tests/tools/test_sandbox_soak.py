"""The sandboxes' soak test, short: concurrent Code-v0 episodes on both backends under faults.

``bench/soak_sandboxes.py`` runs the episodes (scripted policies, so every reward is known), kills
sandboxes mid-call, SIGKILLs and restarts one of two extra Podman services, and checks that every
episode ended once with its expected reward or flagged as an error, and that nothing was left
behind. The long version: ``python -m bench.soak_sandboxes --minutes 20``.
"""

import os
import shutil

import pytest

from bench.soak_sandboxes import COVERED, SoakConfig, run_soak, summary


@pytest.mark.slow
@pytest.mark.serial  # its leak check counts new temporary files and Podman cgroups machine-wide
async def test_short_soak_loses_nothing_scores_no_failure_and_leaks_nothing(tokenizer):
    if os.geteuid() != 0 or not (shutil.which("podman") and shutil.which("bwrap")):
        pytest.fail("the soak needs root, podman and bubblewrap: run `sudo sandboxes/setup.sh`")
    config = SoakConfig(
        seconds=25, concurrency=8, kill_every_s=2, restart_every_s=8, down_s=2, baseline_calls=20
    )
    report = await run_soak(config, tokenizer)
    print(summary(report, "this machine's CPU"))
    assert not report.problems, "\n".join(report.problems)
    assert report.episodes >= 10 and sum(report.verdicts.values()) == report.episodes
    assert report.faults["podman service SIGKILLed and restarted"] == 2
    assert sum(n for fault, n in report.faults.items() if "killed mid-call" in fault) >= 5
    for backend in config.backends:  # faults inside episodes happened on both backends
        workloads = {c.workload for c in report.calls if c.backend == backend}
        assert set(COVERED) <= workloads, f"{backend} never ran {set(COVERED) - workloads}"
