"""SWE-bench task instances: the record type, its validation, and loading from files or datasets.

A :class:`SWEInstance` has SWE-bench's columns (``instance_id``, ``repo``, ``base_commit``,
``problem_statement``, ``patch``, ``test_patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``, ``version``,
``environment_setup_commit``, ``hints_text``, ``created_at``), the optional columns of its
variants (``difficulty`` from SWE-bench Verified, ``image_name`` from SWE-smith) and
``agentrl_taskgen``, the record of how ``agentrl.envs.swe.taskgen`` made an instance. Any other
column is kept as is (pydantic's extra fields), so a row read and written back keeps it.

Validated on load: the required columns are present; ``base_commit`` and
``environment_setup_commit`` are 40-hex git shas; ``patch`` is a unified diff and so is
``test_patch`` unless it is empty (an instance whose tests are already in its base tree);
``FAIL_TO_PASS`` is a non-empty list of strings and ``PASS_TO_PASS`` a list of strings, each given as
a list or as the JSON-encoded string SWE-bench's datasets store; instance ids are unique. Not
checked: that the commits exist, that the patches apply, that the tests fail and pass as stated
(the generator checks those for the instances it makes; ``tests/envs/swe`` checks the shipped set).

``environment_setup_commit`` may be absent (SWE-Gym has no such column). Rows in the other
benchmarks' published formats (SWE-bench 5, SWE-Gym, SWE-smith, R2E-Gym) are read through
:mod:`agentrl.envs.swe.row_formats`, which also fills ``harness``: how the instance runs on its
benchmark's image. ``base_commit`` is empty only where the row has none and ``harness.base_patch``
reaches the base state (SWE-smith).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from agentrl.envs.data_files import read_data_file
from agentrl.envs.swe.row_formats import ROW_FORMATS, FieldError, HarnessSpec, detect_format

if TYPE_CHECKING:
    import datasets

GIT_SHA = re.compile(r"[0-9a-f]{40}")
# A file header (--- then +++) followed by a hunk header, as `git diff` and `diff -u` write them.
UNIFIED_DIFF = re.compile(r"^--- .*\n\+\+\+ .*\n@@ -\d+(,\d+)? \+\d+(,\d+)? @@", re.MULTILINE)


class InstanceError(ValueError):
    """An instance is malformed; the message names the instance and the field."""


class TaskgenInfo(BaseModel):
    """How ``agentrl.envs.swe.taskgen`` made an instance (column ``agentrl_taskgen``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    project: str
    """The project's distribution name, e.g. ``"toolz"``."""
    sdist: str
    """File name of the source distribution the trees are built from, e.g. ``"toolz-1.2.0.tar.gz"``."""
    mutation: str
    """The kind of rewrite that made the bug, e.g. ``"flip_comparison"``."""
    file: str
    """The changed source file, relative to the repository root."""
    line: int
    """First line of the changed node in the clean file (1-based)."""
    end_line: int
    """Last line of the changed node in the clean file."""
    function: str
    """Qualified name of the function that holds the change."""
    hidden_tests: list[str]
    """Test files removed from the base tree; ``test_patch`` adds them back."""
    seed: int
    """The generator's seed."""


class SWEInstance(BaseModel):
    """One task: a repository at ``base_commit``, an issue, the gold ``patch`` and the tests."""

    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True)

    instance_id: str
    """Unique id, SWE-bench style ``owner__repo-N``."""
    repo: str
    """``owner/name`` of the repository."""
    base_commit: str
    """The commit the agent starts from (40-hex sha); empty when ``harness.base_patch`` makes it."""
    problem_statement: str
    """The issue text shown to the agent."""
    patch: str
    """The gold fix: a unified diff on the base tree (non-test files)."""
    test_patch: str
    """The unified diff that adds the grading tests to the base tree; empty when they are already in it."""
    FAIL_TO_PASS: list[str]
    """Tests that fail on the base tree (with ``test_patch``) and must pass after the fix."""
    PASS_TO_PASS: list[str]
    """Tests that pass before and must still pass after the fix."""
    version: str
    """The project's version, which selects its environment."""
    environment_setup_commit: str | None = None
    """The commit the environment (dependencies) is installed from (40-hex sha)."""
    hints_text: str = ""
    """Comments on the issue made before the fix (SWE-bench); empty for generated tasks."""
    created_at: str | None = None
    """When the issue or task was created (ISO 8601 text)."""
    difficulty: str | None = None
    """SWE-bench Verified's estimate of the time a fix takes, e.g. ``"<15 min fix"``."""
    image_name: str | None = None
    """A prebuilt container image holding the repository (SWE-smith)."""
    agentrl_taskgen: TaskgenInfo | None = None
    """How the task generator made this instance; None for instances from elsewhere."""
    harness: HarnessSpec | None = None
    """How the instance runs on its benchmark's image; None for generated instances."""

    @field_validator("instance_id", "repo", "problem_statement", "version")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise PydanticCustomError("swe", "must not be empty")
        return value

    @field_validator("base_commit", "environment_setup_commit")
    @classmethod
    def _git_sha(cls, value: str | None) -> str | None:
        if value and not GIT_SHA.fullmatch(value):
            raise PydanticCustomError("swe", "must be a 40-hex git sha")
        return value

    @field_validator("environment_setup_commit")
    @classmethod
    def _not_empty_sha(cls, value: str | None) -> str | None:
        if value == "":
            raise PydanticCustomError("swe", "must be a 40-hex git sha")
        return value

    @model_validator(mode="after")
    def _base_reached(self) -> SWEInstance:
        if not self.base_commit and not (self.harness and self.harness.base_patch):
            raise PydanticCustomError(
                "swe",
                "field 'base_commit' must be a 40-hex git sha (empty only with harness.base_patch)",
            )
        return self

    @field_validator("patch")
    @classmethod
    def _diff(cls, value: str) -> str:
        if not UNIFIED_DIFF.search(value):
            raise PydanticCustomError("swe", "must be a unified diff (---/+++ header and @@ hunk)")
        return value

    @field_validator("test_patch")
    @classmethod
    def _diff_or_empty(cls, value: str) -> str:
        if value and not UNIFIED_DIFF.search(value):
            raise PydanticCustomError("swe", "must be empty or a unified diff (---/+++ and @@)")
        return value

    @field_validator("created_at", mode="before")
    @classmethod
    def _timestamp_text(cls, value: Any) -> Any:
        """``datasets`` (pyarrow) reads ISO 8601 text in JSON files as timestamps: write them
        back as SWE-bench writes them (naive timestamps are UTC)."""
        if isinstance(value, datetime):
            if value.tzinfo is not None:
                value = value.astimezone(UTC).replace(tzinfo=None)
            text = value.isoformat(timespec="seconds" if not value.microsecond else "microseconds")
            return f"{text}Z"
        return value

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        """SWE-bench's datasets store these lists as JSON-encoded strings."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                raise PydanticCustomError(
                    "swe", "must be a list of test ids (or its JSON)"
                ) from None
        return value

    @field_validator("FAIL_TO_PASS")
    @classmethod
    def _non_empty_list(cls, value: list[str]) -> list[str]:
        if not value:
            raise PydanticCustomError("swe", "must list at least one test")
        return value

    @classmethod
    def from_row(cls, row: Mapping[str, Any], row_index: int | None = None) -> SWEInstance:
        """Validate one row; errors raise :class:`InstanceError` naming the instance (its id, or
        ``row_index`` when the id is missing) and each bad field."""
        try:
            return cls.model_validate(dict(row))
        except ValidationError as exc:
            raise InstanceError(_describe(row, row_index, exc)) from None

    def to_row(self) -> dict[str, Any]:
        """The row as plain JSON values (lists stay lists), extra columns included."""
        return self.model_dump(mode="json")


def _who(row: Mapping[str, Any], row_index: int | None) -> str:
    instance_id = row.get("instance_id")
    if isinstance(instance_id, str) and instance_id.strip():
        return f"instance {instance_id!r}"
    return f"instance at row {row_index}" if row_index is not None else "instance"


def _describe(row: Mapping[str, Any], row_index: int | None, exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        if not field:
            problems.append(error["msg"])
        elif error["type"] == "missing":
            problems.append(f"field {field!r} is missing")
        else:
            message = (
                error["msg"]
                if error["type"] == "swe"
                else error["msg"][0].lower() + error["msg"][1:]
            )
            got = repr(error["input"])
            got = got if len(got) <= 80 else got[:77] + "..."
            problems.append(f"field {field!r} {message}, got {got}")
    return f"{_who(row, row_index)}: " + "; ".join(problems)


def load_instances(
    source: str | Path | datasets.Dataset | Sequence[Mapping[str, Any]],
    format: str = "auto",
) -> list[SWEInstance]:
    """Instances from a local ``.jsonl``, ``.json`` or ``.parquet`` file (read with ``datasets``),
    a ``datasets.Dataset``, or a list of rows, in the row format ``format`` (a key of
    :data:`~agentrl.envs.swe.row_formats.ROW_FORMATS`; ``"auto"`` detects it from the first row's
    columns). Raises :class:`InstanceError` for the first bad instance (rows are numbered from 0)
    and for a duplicate ``instance_id``; :class:`ValueError` for an unknown or undetected format;
    :class:`FileNotFoundError` for a missing file."""
    if format != "auto" and format not in ROW_FORMATS:
        raise ValueError(f"unknown row format {format!r}; known: {sorted(ROW_FORMATS)}")
    if isinstance(source, (str, Path)):
        source = read_data_file(source, "SWE instances")
    instances: list[SWEInstance] = []
    first_row: dict[str, int] = {}
    for index, row in enumerate(source):
        if format == "auto":
            format = detect_format(set(row))
        try:
            converted = ROW_FORMATS[format].read(row)
        except FieldError as exc:
            raise InstanceError(f"{_who(row, index)}: field {exc.field!r} {exc}") from None
        instance = SWEInstance.from_row(converted, index)
        if instance.instance_id in first_row:
            raise InstanceError(
                f"instance {instance.instance_id!r}: duplicate instance_id "
                f"(rows {first_row[instance.instance_id]} and {index})"
            )
        first_row[instance.instance_id] = index
        instances.append(instance)
    return instances


def write_instances(instances: Sequence[SWEInstance], path: str | Path) -> None:
    """Write ``instances`` as JSON lines (``.jsonl``) or Parquet (``.parquet``)."""
    path = Path(path)
    rows = [instance.to_row() for instance in instances]
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    elif path.suffix == ".parquet":
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        raise ValueError(f"unsupported file type {path.suffix!r}; use .jsonl or .parquet")
