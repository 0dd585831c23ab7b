"""Peak memory of this process, as step metrics: what a run's summary reports.

* ``memory/peak_rss_gb``: the process's peak resident set size so far, in GB (10^9 bytes): the
  trainer, and the embedded engine when rollouts run in the trainer's process; engine server
  processes and other ranks are not included (each rank logs its own; the first rank's is
  written). On Linux it is ``/proc/self/status``' ``VmHWM``, the high-water mark of the process's
  own memory: ``getrusage``'s ``ru_maxrss`` also keeps, across the ``exec`` that started the
  program, the resident size of the process it was forked from (``agentrl train`` started from a
  pytest worker holding 15 GB reported 15.7 GB). ``ru_maxrss`` where there is no ``/proc``.
* ``memory/cuda_peak_gb``: ``torch.cuda.max_memory_allocated()`` on this process's device since
  the start, present only when CUDA is.

Both are peaks since the process started, so a step's value never falls below an earlier one.
"""

from __future__ import annotations

import resource
import sys

import torch

GB = 1e9


_seen = 0


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far, in bytes (see the module docstring); never
    below an earlier answer (the kernel syncs its per-thread RSS counters in batches, so two reads
    of ``VmHWM`` may disagree by a few pages)."""
    global _seen
    _seen = max(_seen, _read_peak_rss())
    return _seen


def _read_peak_rss() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
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
