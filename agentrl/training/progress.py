"""Training progress on the console: a live bar over steps, or one plain line per step in logs.

`TrainProgress` shows completed steps out of the total, elapsed and remaining time, and a short
phase text ("rollouts 5/8 groups", "syncing weights") set with `TrainProgress.status`; beneath it,
one line with the latest values of a few metrics and the mean seconds per step of this session:

    train ━━━━━━━━━━━━━━━━━━━╸━━━━━━━━━━━━ 12/20 0:02:27 0:01:38 training
    reward 0.375 | mismatch/max_abs 3.1e-05 | loss -0.012 | grad_norm 0.83 | 12.3 s/step

Where it goes depends on ``enabled``:

* ``None`` (default): the live bar when the console is an interactive terminal; otherwise (a file,
  a pipe, CI) one plain line per `TrainProgress.update`, ``step 12/20 | reward 0.375 | ... |
  12.3 s/step | elapsed 0:02:27``, so logs stay readable. Phase texts are not printed as lines.
* ``True``: the live bar regardless (rich prints only its final state when not on a terminal).
* ``False``: nothing.

While the live bar runs, rich redirects ``sys.stdout`` and ``sys.stderr`` so that prints and log
records appear above it. Use it as a context manager; `update` and `status` outside it raise
``RuntimeError``. It is display only: it keeps no metrics and needs no distributed logic (call it
on rank 0).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Literal

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from agentrl.training.metrics import scalar_value

DEFAULT_PROGRESS_KEYS = ("reward/mean", "mismatch/max_abs", "train/loss", "train/grad_norm")
"""The metrics `TrainProgress` shows unless told otherwise."""
SEPARATOR = " | "


def format_value(value: float | int) -> str:
    """Compact: ``0.375``, ``-0.012``, ``3.1e-05``, ``12.3``, ``312``, ``12345``, ``nan``."""
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value) and 1e3 <= abs(value) < 1e6:
        return f"{value:.0f}"
    return f"{value:.3g}"


def metric_label(key: str) -> str:
    """The name shown for ``key``: ``"reward/mean"`` -> ``"reward"``, ``"train/loss"`` ->
    ``"loss"``, ``"env/Code-v0/reward_mean"`` -> ``"Code-v0 reward"``, others unchanged."""
    if key.startswith("env/") and key.endswith("/reward_mean"):
        return key.removeprefix("env/").removesuffix("/reward_mean") + " reward"
    return key.removesuffix("/mean").removeprefix("train/")


class TrainProgress:
    """A rich live progress bar over training steps with the latest metrics on one line beneath it.

    Args:
        total_steps: the step the run ends at (completed steps, counted from 0).
        start_step: steps already completed (a resumed run starts its bar there).
        keys: the metrics shown, in order; keys missing from an update are left out of its line.
        enabled: ``None``, ``True`` or ``False``; see the module docstring.
        console: where to draw; a new stdout console by default.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        start_step: int = 0,
        keys: Sequence[str] = DEFAULT_PROGRESS_KEYS,
        enabled: bool | None = None,
        console: Console | None = None,
    ) -> None:
        if not 0 <= start_step <= total_steps:
            raise ValueError(
                f"need 0 <= start_step <= total_steps, got start_step={start_step}, "
                f"total_steps={total_steps}"
            )
        if isinstance(keys, str):
            raise TypeError(f"keys must be a sequence of metric names, got the string {keys!r}")
        self.total_steps = total_steps
        self.start_step = start_step
        self.step = start_step
        self.keys = tuple(keys)
        self.console = console or Console()
        self.mode: Literal["live", "lines", "off"]
        if enabled is None:
            terminal = self.console.is_terminal and not self.console.is_dumb_terminal
            self.mode = "live" if terminal else "lines"
        else:
            self.mode = "live" if enabled else "off"
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=self.console,
        )
        self._task = self._progress.add_task(
            "train", total=total_steps, completed=start_step, status=""
        )
        self._metrics_line = ""
        self._live = Live(console=self.console, get_renderable=self._render, transient=False)
        self._started_at: float | None = None

    def __enter__(self) -> TrainProgress:
        self._started_at = time.monotonic()
        # The bar's clock starts here, not at construction.
        self._progress.reset(self._task, completed=self.step, status="")
        if self.mode == "live":
            self._live.start(refresh=True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.mode == "live":
            self._live.stop()
        self._started_at = None

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Set the completed steps to ``step`` and show ``metrics``' chosen keys."""
        elapsed = self._elapsed()
        if not self.step <= step <= self.total_steps:
            raise ValueError(
                f"step {step} is outside [{self.step}, {self.total_steps}]: steps may not go "
                f"backwards or past total_steps"
            )
        parts = [
            f"{metric_label(key)} {format_value(scalar_value(key, metrics[key]))}"
            for key in self.keys
            if key in metrics
        ]
        self.step = step
        if step > self.start_step:
            parts.append(f"{format_value(elapsed / (step - self.start_step))} s/step")
        self._metrics_line = SEPARATOR.join(parts)
        self._progress.update(self._task, completed=step)
        if self.mode == "live":
            self._live.refresh()
        elif self.mode == "lines":
            line = SEPARATOR.join(
                [
                    f"step {step}/{self.total_steps}",
                    *parts,
                    f"elapsed {timedelta(seconds=int(elapsed))}",
                ]
            )
            self.console.print(Text(line), soft_wrap=True)

    def status(self, text: str) -> None:
        """Show ``text`` (the current phase) next to the bar until the next call."""
        self._elapsed()  # raises outside the `with` block
        self._progress.update(self._task, status=text)
        if self.mode == "live":
            self._live.refresh()

    def _elapsed(self) -> float:
        """Seconds since ``__enter__``; ``RuntimeError`` outside the ``with`` block."""
        if self._started_at is None:
            raise RuntimeError("use TrainProgress as a context manager: `with TrainProgress(...)`")
        return time.monotonic() - self._started_at

    def _render(self) -> RenderableType:
        return Group(self._progress, Text(self._metrics_line))
