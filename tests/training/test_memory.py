"""The peak-memory metrics a run's summary reports (issue 36, acceptance: the demo prints its peak)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

from agentrl.training.memory import GB, peak_memory_metrics, peak_memory_summary, peak_rss_bytes

SLACK = 4 << 20


def current_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_the_peak_is_at_least_what_the_process_holds_and_never_falls():
    before = peak_rss_bytes()
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
    holding = current_rss_bytes()
    after = peak_rss_bytes()
    # /proc's VmRSS and getrusage read the kernel's RSS counters, which it syncs per thread in
    # batches: they may disagree by a few pages
    assert after >= holding - SLACK and after >= before
    del block
    assert peak_rss_bytes() >= after  # a peak, not the current size
    metrics = peak_memory_metrics()
    assert metrics["memory/peak_rss_gb"] >= after / GB  # the same division: no rounding gap
    assert ("memory/cuda_peak_gb" in metrics) == (
        torch.cuda.is_available() and torch.cuda.is_initialized()
    )
    assert peak_memory_summary(metrics).endswith("GB RSS (this process)")
    assert peak_memory_summary({}) == "-"


def test_a_program_started_from_a_big_process_reports_its_own_peak():
    """getrusage's ru_maxrss keeps the forking parent's resident size across exec; the metric does
    not: a trainer started from a big test worker reported the worker's 15.7 GB."""
    block = torch.ones(1 << 30, dtype=torch.uint8)  # 1 GiB resident in this (the parent) process
    child = (
        "import json, resource; from agentrl.training.memory import peak_rss_bytes; "
        "print(json.dumps([peak_rss_bytes(), "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120
    )
    own, inherited = json.loads(done.stdout)
    assert inherited >= block.numel()  # the class of error: the parent's gigabyte counted
    assert own < block.numel()  # the child itself never held it
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 >= peak_rss_bytes() - SLACK
