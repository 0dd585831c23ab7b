"""TrainProgress: the live bar on a terminal, plain lines elsewhere, nothing when disabled."""

from __future__ import annotations

import io
import math
import re

import pytest
import torch
from rich.console import Console

from agentrl.training.progress import TrainProgress, format_value, metric_label

METRICS = {
    "reward/mean": 0.375,
    "mismatch/max_abs": 3.1e-05,
    "train/loss": -0.012,
    "train/grad_norm": 0.83,
}


def console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=120, color_system=None), out


def test_live_bar_on_a_terminal() -> None:
    terminal, out = console(terminal=True)
    with TrainProgress(20, start_step=2, console=terminal) as progress:
        assert progress.mode == "live"
        progress.status("rollouts 5/8 groups")
        progress.update(3, METRICS)
        progress.status("syncing weights")
    text = out.getvalue()
    assert "\x1b[" in text  # cursor control: redrawn in place
    final = text.rsplit("\x1b[2K", 1)[-1]  # the last frame drawn
    lines = final.strip().splitlines()
    assert re.fullmatch(r"train .*━.* 3/20 .*syncing weights", lines[0])
    assert re.fullmatch(
        r"reward 0\.375 \| mismatch/max_abs 3\.1e-05 \| loss -0\.012 \| grad_norm 0\.83 "
        r"\| \S+ s/step",
        lines[1],
    )
    assert "2/20" in text and "rollouts 5/8 groups" in text


def test_plain_lines_when_not_a_terminal() -> None:
    log, out = console(terminal=False)
    with TrainProgress(10, console=log) as progress:
        assert progress.mode == "lines"
        progress.status("training")
        progress.update(1, METRICS)
        progress.update(2, {"train/loss": math.nan, "other": 1.0})
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "\x1b" not in out.getvalue()
    assert re.fullmatch(
        r"step 1/10 \| reward 0\.375 \| mismatch/max_abs 3\.1e-05 \| loss -0\.012 "
        r"\| grad_norm 0\.83 \| \S+ s/step \| elapsed 0:\d\d:\d\d",
        lines[0],
    )
    assert re.fullmatch(r"step 2/10 \| loss nan \| \S+ s/step \| elapsed 0:\d\d:\d\d", lines[1])


def test_forced_live_bar_prints_the_final_state_to_a_file() -> None:
    log, out = console(terminal=False)
    with TrainProgress(4, enabled=True, console=log) as progress:
        progress.update(4, {"train/loss": 0.5})
    assert "4/4" in out.getvalue() and "loss 0.5" in out.getvalue()


def test_disabled_prints_nothing() -> None:
    terminal, out = console(terminal=True)
    with TrainProgress(4, enabled=False, console=terminal) as progress:
        progress.status("training")
        progress.update(1, METRICS)
    assert out.getvalue() == ""


def test_tensor_metrics_are_shown() -> None:
    log, out = console(terminal=False)
    with TrainProgress(3, keys=["train/loss"], console=log) as progress:
        progress.update(1, {"train/loss": torch.tensor(-0.25)})
    assert out.getvalue().startswith("step 1/3 | loss -0.25 | ")


def test_errors() -> None:
    log, _ = console(terminal=False)
    progress = TrainProgress(5, start_step=2, console=log)
    with pytest.raises(RuntimeError, match="context manager"):
        progress.update(3, {})
    with progress:
        with pytest.raises(ValueError, match="backwards"):
            progress.update(1, {})
        with pytest.raises(ValueError, match="past total_steps"):
            progress.update(6, {})
        with pytest.raises(TypeError, match="'train/loss'"):
            progress.update(3, {"train/loss": "low"})
        progress.update(3, {})
        progress.update(3, {})  # the same step again only refreshes the line
    with pytest.raises(ValueError, match="start_step"):
        TrainProgress(5, start_step=6, console=log)
    with pytest.raises(TypeError, match="string"):
        TrainProgress(5, keys="train/loss", console=log)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.375, "0.375"),
        (-0.012, "-0.012"),
        (3.1e-05, "3.1e-05"),
        (12.34, "12.3"),
        (312.4, "312"),
        (12345.6, "12346"),
        (2.5e7, "2.5e+07"),
        (0.0, "0"),
        (7, "7"),
        (math.nan, "nan"),
        (-math.inf, "-inf"),
    ],
)
def test_format_value(value, text) -> None:
    assert format_value(value) == text


def test_metric_label() -> None:
    assert metric_label("reward/mean") == "reward"
    assert metric_label("env/Code-v0/reward_mean") == "Code-v0 reward"
    assert metric_label("mismatch/max_abs") == "mismatch/max_abs"
