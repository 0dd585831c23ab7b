"""plot_curves: a real PNG with one panel per metric with data, and a "no data yet" image."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.image import imread

from agentrl.training.metrics import MetricsLogger
from agentrl.training.plots import (
    DEFAULT_KEYS,
    PANEL_SIZE,
    curves_figure,
    plot_curves,
    rolling_mean,
)


def records(steps: int = 30) -> list[dict]:
    return [
        {
            "step": step,
            "reward/mean": 0.5 + 0.4 * math.sin(step / 3),
            "mismatch/max_abs": 1e-5 * (1 + step % 4),
            "train/loss": -0.01 * step,
            "train/grad_norm": None if step % 5 == 0 else 1.0 / (1 + step),
        }
        for step in range(steps)
    ]


def panel_titles(figure) -> list[str]:
    return [ax.get_title() for ax in figure.axes if ax.get_visible()]


def assert_png_drawn(path, width: int, height: int) -> None:
    image = imread(path)  # (H, W, 4) float32 in [0, 1]
    assert image.shape[:2] == (height, width)
    # Not blank: many distinct colours, and dark pixels (text, lines) on the white background.
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 20
    assert (image[..., :3].mean(axis=-1) < 0.5).sum() > 100


def test_png_from_records_has_a_panel_per_key_with_data(tmp_path) -> None:
    out = plot_curves(records(), tmp_path / "plots" / "curves.png", title="run 1")
    assert out == tmp_path / "plots" / "curves.png"
    # Four keys with data in two columns, two rows, at 100 dpi.
    assert_png_drawn(out, int(PANEL_SIZE[0] * 2 * 100), int(PANEL_SIZE[1] * 2 * 100))
    assert not list(out.parent.glob(".*.tmp"))
    figure = curves_figure(records(), title="run 1")
    assert panel_titles(figure) == [
        "reward/mean",
        "mismatch/max_abs",
        "train/loss",
        "train/grad_norm",
    ]
    assert figure.get_suptitle() == "run 1"


def test_png_from_metrics_jsonl(tmp_path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(12):
            logger.log(step, {"reward/mean": step / 12, "train/loss": math.nan})
    # loss is null on every line, so only reward/mean gets a panel.
    out = plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png")
    assert_png_drawn(out, int(PANEL_SIZE[0] * 100), int(PANEL_SIZE[1] * 100))


def test_raw_values_and_rolling_mean_skip_missing_points() -> None:
    data = records(30)
    figure = curves_figure(data, keys=["train/grad_norm"])
    (ax,) = figure.axes
    raw, mean = ax.get_lines()
    steps = [r["step"] for r in data if r["train/grad_norm"] is not None]  # 24 points
    assert list(raw.get_xdata()) == steps
    assert list(mean.get_xdata()) == steps
    values = [r["train/grad_norm"] for r in data if r["train/grad_norm"] is not None]
    np.testing.assert_allclose(mean.get_ydata(), rolling_mean(values, 24 // 10))


def test_keys_without_finite_values_are_skipped() -> None:
    data = [{"step": s, "train/loss": float(s), "kl": math.nan, "entropy": None} for s in range(3)]
    figure = curves_figure(data, keys=["kl", "train/loss", "entropy", "absent"])
    assert panel_titles(figure) == ["train/loss"]


def test_no_data_still_writes_a_png(tmp_path) -> None:
    out = plot_curves([], tmp_path / "curves.png")
    image = imread(out)
    assert image.shape[:2] == (int(PANEL_SIZE[1] * 100), int(PANEL_SIZE[0] * 100))
    assert (image[..., :3].mean(axis=-1) < 0.5).any()
    figure = curves_figure([{"step": 0, "train/loss": None}])
    assert "no data yet" in [t.get_text() for t in figure.texts]
    assert ", ".join(DEFAULT_KEYS) in [t.get_text() for t in figure.texts]


def test_rolling_mean_is_trailing() -> None:
    np.testing.assert_allclose(rolling_mean([1, 2, 3, 4, 5], 2), [1, 1.5, 2.5, 3.5, 4.5])
    np.testing.assert_allclose(rolling_mean([1, 2, 3], 1), [1, 2, 3])
    np.testing.assert_allclose(rolling_mean([2, 4, 6], 10), [2, 3, 4])
    with pytest.raises(ValueError, match="window"):
        rolling_mean([1.0], 0)


def test_keys_as_a_string_is_refused(tmp_path) -> None:
    with pytest.raises(TypeError, match="'train/loss'"):
        plot_curves(records(), tmp_path / "curves.png", keys="train/loss")


def test_a_trainer_loads_matplotlib_only_to_draw():
    """The curves are drawn once, at the end: matplotlib (about 35 MB resident) is not imported
    with the trainers, so it does not stand on their steps' peak memory."""
    probe = "import sys, agentrl.rl.loop, agentrl.sft.trainer\nprint('matplotlib' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"
