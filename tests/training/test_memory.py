"""The peak-memory metrics a run's summary reports (issue 36, acceptance: the demo prints its peak)."""

from __future__ import annotations

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
