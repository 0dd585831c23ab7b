"""Benchmarks: each measures a baseline and agentrl's code in the same process run (``python -m bench``)."""

import math


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in (0, 1]; NaN for no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]
