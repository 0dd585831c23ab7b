"""MetricsLogger: one valid JSON line per step, TensorBoard events, resume truncation, errors."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agentrl.training.metrics import MetricsLogger, read_metrics


def tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(directory / "tensorboard"))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def strict_json(line: str) -> dict:
    """``json.loads`` that refuses the NaN / Infinity tokens."""

    def refuse(token: str) -> None:
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(line, parse_constant=refuse)


def test_one_line_per_step_read_back(tmp_path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(0, {"reward/mean": 0.25, "loss": -0.5, "tokens": 120})
        logger.log(3, {"reward/mean": 0.75, "loss": 0.125, "tokens": 80})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [strict_json(line)["step"] for line in lines] == [0, 3]
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["reward/mean"] for r in records] == [0.25, 0.75]
    assert records[0]["tokens"] == 120 and isinstance(records[0]["tokens"], int)
    assert all(isinstance(r["time"], float) for r in records)
    assert records[0]["time"] <= records[1]["time"]
    assert not (tmp_path / "tensorboard").exists()


def test_line_is_on_disk_before_close(tmp_path) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, {"loss": 1.0})
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["loss"] == 1.0
    logger.close()
    logger.close()
    with pytest.raises(RuntimeError, match="closed"):
        logger.log(2, {"loss": 1.0})


def test_non_finite_values_are_null(tmp_path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(0, {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.5})
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    record = strict_json(text)
    assert (record["a"], record["b"], record["c"], record["d"]) == (None, None, None, 1.5)


def test_numpy_scalars_and_0dim_tensors_are_accepted(tmp_path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(
            np.int64(2),
            {
                "np": np.float32(0.5),
                "npi": np.int64(7),
                "t": torch.tensor(0.25),
                "n": torch.tensor(3),
            },
        )
    (record,) = read_metrics(tmp_path / "metrics.jsonl")
    assert (record["step"], record["np"], record["npi"], record["t"], record["n"]) == (
        2,
        0.5,
        7,
        0.25,
        3,
    )


@pytest.mark.parametrize("value", ["0.5", None, [1.0], torch.ones(2), True, torch.tensor(True)])
def test_non_number_raises_type_error_naming_the_key(tmp_path, value) -> None:
    with (
        MetricsLogger(tmp_path, tensorboard=False) as logger,
        pytest.raises(TypeError, match="'reward/mean'"),
    ):
        logger.log(0, {"loss": 1.0, "reward/mean": value})
    assert (tmp_path / "metrics.jsonl").read_text() == ""


@pytest.mark.parametrize("key", ["step", "time"])
def test_reserved_names_are_refused(tmp_path, key) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger, pytest.raises(ValueError, match=key):
        logger.log(0, {key: 1.0})


def test_steps_must_strictly_increase(tmp_path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(5, {"loss": 1.0})
        with pytest.raises(ValueError, match="step 4 is not after the last logged step 5"):
            logger.log(4, {"loss": 1.0})
        with pytest.raises(ValueError, match="step 5"):
            logger.log(5, {"loss": 1.0})
        with pytest.raises(TypeError, match="step must be an int"):
            logger.log(6.0, {"loss": 1.0})
        logger.log(6, {"loss": 2.0})
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [5, 6]


def test_existing_metrics_without_resume_are_refused(tmp_path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(0, {"loss": 1.0})
    with pytest.raises(FileExistsError, match="resume_from_step"):
        MetricsLogger(tmp_path, tensorboard=False)


def test_tensorboard_events_use_the_keys_as_tags(tmp_path) -> None:
    with MetricsLogger(tmp_path) as logger:
        for step in range(3):
            logger.log(step, {"reward/mean": step / 4, "mismatch/max_abs": 1e-5 * step})
    scalars = tensorboard_scalars(tmp_path)
    assert set(scalars) == {"reward/mean", "mismatch/max_abs"}
    assert scalars["reward/mean"] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert [step for step, _ in scalars["mismatch/max_abs"]] == [0, 1, 2]
    assert scalars["mismatch/max_abs"][2][1] == pytest.approx(2e-5)


def test_resume_drops_steps_after_the_checkpoint(tmp_path) -> None:
    with MetricsLogger(tmp_path) as logger:
        for step in range(5):
            logger.log(step, {"loss": float(step)})
    # TensorBoard reads event files in name order, and a name is "<unix second>.<host>.<pid>.<n>":
    # two writers of one process in one second may sort by n as text ("10" < "9"). A real resume
    # is a later process; here, start the second writer in a later second.
    time.sleep(1.01 - time.time() % 1)
    with MetricsLogger(tmp_path, resume_from_step=2) as logger:
        assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2]
        with pytest.raises(ValueError, match="last logged step 2"):
            logger.log(2, {"loss": 0.0})
        for step in (3, 4):
            logger.log(step, {"loss": 10.0 * step})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["loss"]) for r in records] == [(0, 0), (1, 1), (2, 2), (3, 30), (4, 40)]
    assert not list(tmp_path.glob(".*.tmp"))
    # TensorBoard purges the first run's steps 3 and 4 (purge_step=3) and keeps the new ones.
    assert tensorboard_scalars(tmp_path)["loss"] == [(0, 0), (1, 1), (2, 2), (3, 30), (4, 40)]


def test_resume_into_a_new_directory_starts_empty(tmp_path) -> None:
    with MetricsLogger(tmp_path / "run", tensorboard=False, resume_from_step=7) as logger:
        logger.log(8, {"loss": 1.0})
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [8]


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    with pytest.warns(UserWarning, match="truncated last line 3"):
        records = read_metrics(path)
    assert [r["step"] for r in records] == [0, 1]
    # Resuming rewrites the file without the partial line, so new lines start on a line of their own.
    with (
        pytest.warns(UserWarning, match="truncated"),
        MetricsLogger(tmp_path, tensorboard=False, resume_from_step=5) as logger,
    ):
        logger.log(2, {"loss": 3.0})
    assert [strict_json(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]


def test_corrupt_line_before_the_last_is_an_error(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, \n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_metrics(path)
    path.write_text('{"step": 0}\n[1, 2]\n')
    with pytest.raises(ValueError, match="line 2 is not an object with an integer 'step'"):
        read_metrics(path)
