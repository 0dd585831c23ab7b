"""Peak memory of this process, as step metrics: what a run's summary reports.

* ``memory/peak_rss_gb``: the process's peak resident set size so far (``getrusage``'s
  ``ru_maxrss``), in GB (10^9 bytes): the trainer, and the embedded engine when rollouts run in
  the trainer's process; engine server processes and other ranks are not included (each rank
  logs its own; the first rank's is written).
* ``memory/cuda_peak_gb``: ``torch.cuda.max_memory_allocated()`` on this process's device since
  the start, present only when CUDA is.

Both are peaks since the process started, so a step's value never falls below an earlier one.
"""

from __future__ import annotations

import resource
import sys

import torch

GB = 1e9


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # Linux: KiB


def peak_memory_metrics() -> dict[str, float]:
    """``memory/peak_rss_gb`` and, with CUDA, ``memory/cuda_peak_gb`` (see the module docstring)."""
    metrics = {"memory/peak_rss_gb": peak_rss_bytes() / GB}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        metrics["memory/cuda_peak_gb"] = torch.cuda.max_memory_allocated() / GB
    return metrics


def peak_memory_summary(metrics: dict[str, float]) -> str:
    """The summary table's line for the peak-memory metrics of ``metrics``."""
    rss = metrics.get("memory/peak_rss_gb")
    if rss is None:
        return "-"
    line = f"{rss:.2f} GB RSS (this process)"
    cuda = metrics.get("memory/cuda_peak_gb")
    return line if cuda is None else f"{line}, {cuda:.2f} GB CUDA allocated"
