"""Per-step training metrics: ``metrics.jsonl`` and TensorBoard event files in one run directory.

`MetricsLogger` writes one JSON object per line to ``directory/metrics.jsonl``,
``{"step": int, "time": unix seconds, **metrics}``, and the same scalars to TensorBoard event files
in ``directory/tensorboard/``, tagged with the metric names as they are (``"reward/mean"``).

Guarantees:

* Steps strictly increase, so the file holds at most one line per step. A step that does not
  (repeated or backwards) raises ``ValueError`` before anything is written.
* Each line is complete, valid JSON: non-finite floats (NaN, ±inf) are written as ``null``, never as
  the non-standard ``NaN`` / ``Infinity`` tokens. TensorBoard gets them as they are.
* Each line is flushed to the operating system when `MetricsLogger.log` returns (not fsynced: a
  process crash loses nothing already logged, a power cut may), and so are the event files.
* Resuming a run from a checkpoint at step ``s`` (``resume_from_step=s``) removes the lines with
  ``step > s``, written after that checkpoint, by rewriting the file to a temporary file and
  renaming it over the old one; TensorBoard discards its events from step ``s + 1`` on
  (``purge_step``). Without ``resume_from_step``, a directory that already holds metrics is refused
  (``FileExistsError``) rather than appended to.
* `read_metrics` skips a truncated last line (a crash mid-write) with a warning; any other line
  that is not a JSON object raises ``ValueError`` naming the line.

Values are Python or NumPy real numbers or 0-dim torch tensors (read with ``.item()``, which
waits for a CUDA tensor); anything else, including ``bool``, raises ``TypeError`` naming the key.
Nothing here is distributed: the training loop logs on rank 0 only.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import torch

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
RESERVED_KEYS = frozenset({"step", "time"})
"""Fields every line carries; metrics may not use these names."""


def scalar_value(key: str, value: object) -> float | int:
    """``value`` as a Python ``int`` or ``float``; ``TypeError`` naming ``key`` if it is no number."""
    if isinstance(value, torch.Tensor) and value.ndim == 0 and value.dtype != torch.bool:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"metric {key!r} must be a real number or a 0-dim tensor, "
            f"got {type(value).__name__}: {value!r:.80}"
        )
    return int(value) if isinstance(value, numbers.Integral) else float(value)


class MetricsLogger:
    """Per-step scalar metrics to ``directory/metrics.jsonl`` (one JSON object per line:
    ``{"step": int, "time": unix float, **metrics}``) and to TensorBoard event files in
    ``directory/tensorboard/``.

    Args:
        directory: the run directory; created if missing.
        tensorboard: also write TensorBoard event files.
        resume_from_step: the step of the checkpoint this run resumes from; lines after it are
            removed and the next logged step must exceed every kept one. ``None`` starts a new
            run, which requires that ``metrics.jsonl`` is missing or empty.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        tensorboard: bool = True,
        resume_from_step: int | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.path = self.directory / METRICS_FILE
        self.directory.mkdir(parents=True, exist_ok=True)
        self.last_step: int | None = None
        """The last step in the file, logged or kept on resume; the next must be greater."""
        if resume_from_step is not None:
            kept = _truncate_after(self.path, _check_step(resume_from_step))
            self.last_step = max((r["step"] for r in kept), default=None)
        elif self.path.exists() and self.path.stat().st_size > 0:
            raise FileExistsError(
                f"{self.path} already holds metrics; pass resume_from_step to continue that run "
                f"or log to a new directory"
            )
        self._file = self.path.open("a", encoding="utf-8")
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge_step = None if resume_from_step is None else int(resume_from_step) + 1
            self._writer = SummaryWriter(
                str(self.directory / TENSORBOARD_DIR), purge_step=purge_step
            )

    def log(self, step: int, metrics: Mapping[str, float | int]) -> None:
        """Append one line for ``step`` and flush it (and the TensorBoard events)."""
        if self._file.closed:
            raise RuntimeError(f"MetricsLogger for {self.directory} is closed")
        step = _check_step(step)
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(
                f"step {step} is not after the last logged step {self.last_step}; steps must "
                f"strictly increase (resuming? pass resume_from_step)"
            )
        values = {}
        for key, value in metrics.items():
            if not isinstance(key, str) or not key:
                raise TypeError(f"metric names must be non-empty strings, got {key!r}")
            if key in RESERVED_KEYS:
                raise ValueError(f"metric name {key!r} is reserved (every line has {key!r})")
            values[key] = scalar_value(key, value)
        now = time.time()
        record = {"step": step, "time": now} | {
            k: v if math.isfinite(v) else None for k, v in values.items()
        }
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        self.last_step = step
        if self._writer is not None:
            for key, value in values.items():
                self._writer.add_scalar(key, value, global_step=step, walltime=now)
            self._writer.flush()

    def close(self) -> None:
        """Close the file and the event writer; closing twice is harmless."""
        self._file.close()
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in file order (``null`` values read as ``None``).

    A last line that does not parse (the writer crashed mid-line) is skipped with a
    ``UserWarning``; a bad line anywhere else raises ``ValueError`` naming its number.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                warnings.warn(
                    f"{path}: skipping truncated last line {number} ({error})", stacklevel=2
                )
                break
            raise ValueError(f"{path}: line {number} is not valid JSON: {error}") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path}: line {number} is not an object with an integer 'step'")
        records.append(record)
    return records


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"step must be an int, got {type(step).__name__}: {step!r}")
    if step < 0:
        raise ValueError(f"step must be non-negative, got {step}")
    return int(step)


def _truncate_after(path: Path, step: int) -> list[dict[str, Any]]:
    """Rewrite ``path`` without lines after ``step`` (nor a truncated last line); return the rest."""
    if not path.exists():
        return []
    kept = [r for r in read_metrics(path) if r["step"] <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return kept
