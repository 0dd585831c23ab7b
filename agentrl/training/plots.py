"""Training curves as a PNG, from ``metrics.jsonl`` or from records in memory.

`plot_curves` draws one panel per metric that has at least one finite value: the raw values
against the step as a thin line with markers, and a trailing rolling mean over about a tenth of the
points. Metrics with no finite value are left out; when none has one, the PNG says "no data yet",
so a run always ends with an image. The file is written to a temporary name and renamed, so a
viewer never sees half an image.

Rendering uses matplotlib's ``Figure`` and the Agg canvas directly, never ``pyplot``: no window
opens, no global figure is left behind, and the user's chosen backend is not changed. matplotlib is
imported when a figure is drawn, not with this module: a trainer draws its curves once, at the
end, and would otherwise hold matplotlib's modules (about 35 MB resident) through every step.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agentrl.training.metrics import read_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DEFAULT_KEYS = (
    "reward/mean",
    "mismatch/mean_abs",
    "mismatch/max_abs",
    "train/loss",
    "train/grad_norm",
    "response_length/mean",
)
"""The metrics `plot_curves` draws unless told otherwise."""
PANEL_SIZE = (6.0, 3.2)
"""Width and height of one panel, in inches (at 100 dpi)."""
MAX_COLUMNS = 2


def rolling_mean(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` values; the first ``window - 1`` average what exists."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    x = np.asarray(values, dtype=np.float64)
    sums = np.concatenate([[0.0], np.cumsum(x)])
    end = np.arange(1, len(x) + 1)
    start = np.maximum(end - window, 0)
    return (sums[end] - sums[start]) / (end - start)


def curve_series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """The steps and values of ``key`` where it is a finite number, ordered by step."""
    points = sorted(
        (record["step"], float(value))
        for record in records
        if isinstance(value := record.get(key), numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
    )
    return [step for step, _ in points], [value for _, value in points]


def curves_figure(
    records: Sequence[Mapping[str, Any]],
    *,
    keys: Sequence[str] = DEFAULT_KEYS,
    title: str | None = None,
) -> Figure:
    """The figure `plot_curves` saves: one titled panel per key with data, in up to two columns."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if isinstance(keys, str):
        raise TypeError(f"keys must be a sequence of metric names, got the string {keys!r}")
    series = {key: curve_series(records, key) for key in keys}
    series = {key: points for key, points in series.items() if points[0]}
    if not series:
        figure = Figure(figsize=PANEL_SIZE, layout="constrained")
        figure.text(0.5, 0.5, "no data yet", ha="center", va="center", fontsize=16)
        figure.text(0.5, 0.3, ", ".join(keys), ha="center", va="center", fontsize=8, alpha=0.6)
    else:
        columns = min(MAX_COLUMNS, len(series))
        rows = math.ceil(len(series) / columns)
        figure = Figure(
            figsize=(PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows), layout="constrained"
        )
        axes = figure.subplots(rows, columns, squeeze=False).ravel()
        for ax, (key, (steps, values)) in zip(axes, series.items(), strict=False):
            window = max(1, len(values) // 10)
            ax.plot(steps, values, lw=0.8, alpha=0.45, marker=".", ms=3, label="raw")
            ax.plot(steps, rolling_mean(values, window), lw=2, label=f"mean of {window}")
            ax.set_title(key)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        for ax in axes[len(series) :]:
            ax.set_visible(False)
    if title:
        figure.suptitle(title)
    FigureCanvasAgg(figure)
    return figure


def plot_curves(
    metrics: str | Path | Sequence[Mapping[str, Any]],
    out_png: str | Path,
    *,
    keys: Sequence[str] = DEFAULT_KEYS,
    title: str | None = None,
) -> Path:
    """Draw ``keys`` of ``metrics`` (a ``metrics.jsonl`` path or its records) into ``out_png``.

    Creates the parent directory; returns the path written.
    """
    records = read_metrics(metrics) if isinstance(metrics, str | Path) else metrics
    figure = curves_figure(records, keys=keys, title=title)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_png.with_name(f".{out_png.name}.tmp")
    figure.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, out_png)
    return out_png
