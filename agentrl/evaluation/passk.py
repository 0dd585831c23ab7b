"""The unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models Trained on
Code", eq. 1) and its aggregation over tasks.

For a task sampled ``n`` times of which ``c`` passed, ``pass@k = 1 - C(n - c, k) / C(n, k)``: the
probability that at least one of ``k`` samples drawn without replacement from the ``n`` passes. It
is computed as ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``, which avoids the huge binomials. A
benchmark's pass@k is the mean over its tasks; its standard error is that of the mean of the
per-task values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Estimated pass@k of one task with ``c`` passing samples out of ``n`` (``1 <= k <= n``)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error (sample standard deviation / sqrt(n));
    nan for no values, 0 error for one."""
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) == 1:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))
