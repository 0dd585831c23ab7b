import json
from datetime import datetime, timedelta, timezone

import datasets
import pytest

from agentrl.envs.swe import InstanceError, SWEInstance, load_instances
from agentrl.envs.swe.instances import TaskgenInfo, write_instances

SHA = "0123456789abcdef0123456789abcdef01234567"
DIFF = "diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1 +1 @@\n-a\n+b\n"
TEST_DIFF = (
    "diff --git a/tests/test_mod.py b/tests/test_mod.py\nnew file mode 100644\n"
    "--- /dev/null\n+++ b/tests/test_mod.py\n@@ -0,0 +1 @@\n+def test_b(): pass\n"
)


def row(**changes):
    base = {
        "instance_id": "foo__bar-12",
        "repo": "foo/bar",
        "base_commit": SHA,
        "problem_statement": "bar() returns a instead of b",
        "patch": DIFF,
        "test_patch": TEST_DIFF,
        "FAIL_TO_PASS": ["tests/test_mod.py::test_b"],
        "PASS_TO_PASS": ["tests/test_mod.py::test_a[x-1]"],
        "version": "1.0",
        "environment_setup_commit": SHA,
        "hints_text": "",
        "created_at": "2024-01-02T03:04:05Z",
    }
    base.update(changes)
    return {key: value for key, value in base.items() if value is not ...}


def test_a_swebench_row_loads_with_its_fields():
    (instance,) = load_instances([row()])
    assert instance.instance_id == "foo__bar-12"
    assert instance.FAIL_TO_PASS == ["tests/test_mod.py::test_b"]
    assert instance.difficulty is None and instance.agentrl_taskgen is None


def test_json_encoded_test_lists_as_swebench_stores_them():
    (instance,) = load_instances([row(FAIL_TO_PASS='["t.py::test_b"]', PASS_TO_PASS="[]")])
    assert instance.FAIL_TO_PASS == ["t.py::test_b"] and instance.PASS_TO_PASS == []


def test_optional_fields_may_be_absent_as_in_swe_gym():
    (instance,) = load_instances(
        [row(environment_setup_commit=..., hints_text=..., created_at=..., test_patch="")]
    )
    assert instance.environment_setup_commit is None and instance.test_patch == ""


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"base_commit": "abc"},
            "instance 'foo__bar-12': field 'base_commit' must be a 40-hex git sha, got 'abc'",
        ),
        (
            {"environment_setup_commit": SHA.upper()},
            "instance 'foo__bar-12': field 'environment_setup_commit' must be a 40-hex git sha",
        ),
        ({"base_commit": ...}, "instance 'foo__bar-12': field 'base_commit' is missing"),
        ({"instance_id": ...}, "instance at row 1: field 'instance_id' is missing"),
        ({"patch": "just text"}, "instance 'foo__bar-12': field 'patch' must be a unified diff"),
        ({"patch": ""}, "field 'patch' must be a unified diff"),
        (
            {"test_patch": "+def test(): pass\n"},
            "field 'test_patch' must be empty or a unified diff",
        ),
        ({"FAIL_TO_PASS": []}, "field 'FAIL_TO_PASS' must list at least one test, got []"),
        ({"FAIL_TO_PASS": "[]"}, "field 'FAIL_TO_PASS' must list at least one test"),
        ({"FAIL_TO_PASS": "not json"}, "field 'FAIL_TO_PASS' must be a list of test ids"),
        ({"FAIL_TO_PASS": [1]}, "field 'FAIL_TO_PASS.0' input should be a valid string, got 1"),
        ({"PASS_TO_PASS": "{}"}, "field 'PASS_TO_PASS' input should be a valid list"),
        ({"version": 1.0}, "field 'version' input should be a valid string, got 1.0"),
        ({"problem_statement": "  "}, "field 'problem_statement' must not be empty"),
        ({"agentrl_taskgen": {"project": "x"}}, "field 'agentrl_taskgen.sdist' is missing"),
    ],
)
def test_each_invalid_field_is_named_with_its_instance(changes, message):
    with pytest.raises(InstanceError) as error:
        load_instances([row(instance_id="ok-1"), row(**changes)])
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (datetime(2024, 1, 2, 3, 4, 5), "2024-01-02T03:04:05Z"),
        (
            datetime(2024, 1, 2, 4, 4, 5, 120000, tzinfo=timezone(timedelta(hours=1))),
            "2024-01-02T03:04:05.120000Z",
        ),
    ],
)
def test_timestamps_read_by_pyarrow_become_swebench_text(value, text):
    assert SWEInstance.from_row(row(created_at=value)).created_at == text


def test_every_bad_field_of_an_instance_is_reported():
    with pytest.raises(InstanceError, match=r"'base_commit' must.*; field 'patch' must"):
        SWEInstance.from_row(row(base_commit="x", patch="y"))


def test_duplicate_instance_ids_are_rejected():
    with pytest.raises(
        InstanceError, match=r"'foo__bar-12': duplicate instance_id \(rows 0 and 2\)"
    ):
        load_instances([row(), row(instance_id="other-1"), row()])


def test_missing_file_and_unknown_suffix(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_instances(tmp_path / "none.jsonl")
    (tmp_path / "rows.csv").write_text("instance_id\nx\n")
    with pytest.raises(ValueError, match=r"unsupported SWE instances file type '\.csv'"):
        load_instances(tmp_path / "rows.csv")


def _instances():
    info = TaskgenInfo(
        project="bar",
        sdist="bar-1.0.tar.gz",
        mutation="flip_comparison",
        file="pkg/mod.py",
        line=3,
        end_line=3,
        function="f",
        hidden_tests=["tests/test_mod.py"],
        seed=0,
    )
    rows = [
        row(agentrl_taskgen=info.model_dump(), meta={"is_lite": True}),
        row(instance_id="foo__bar-13", difficulty="<15 min fix", meta={"is_lite": False}),
    ]
    return [SWEInstance.from_row(r) for r in rows]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip_keeps_every_field_and_extra_columns(tmp_path, suffix):
    instances = _instances()
    path = tmp_path / f"instances{suffix}"
    write_instances(instances, path)
    loaded = load_instances(path)
    assert loaded == instances
    assert loaded[0].agentrl_taskgen.hidden_tests == ["tests/test_mod.py"]
    assert loaded[1].model_extra == {"meta": {"is_lite": False}}


def test_swebench_jsonl_and_json_files_and_a_dataset(tmp_path):
    rows = [
        row(FAIL_TO_PASS=json.dumps(["a.py::t"]), PASS_TO_PASS=json.dumps([])),
        row(instance_id="foo__bar-13", FAIL_TO_PASS=json.dumps(["a.py::u"]), PASS_TO_PASS="[]"),
    ]
    jsonl, array = tmp_path / "swebench.jsonl", tmp_path / "swebench.json"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    array.write_text(json.dumps(rows))
    for source in (jsonl, str(array), datasets.Dataset.from_list(rows)):
        loaded = load_instances(source)
        assert [i.FAIL_TO_PASS for i in loaded] == [["a.py::t"], ["a.py::u"]]


def test_write_rejects_unknown_suffix(tmp_path):
    with pytest.raises(ValueError, match=r"use \.jsonl or \.parquet"):
        write_instances(_instances(), tmp_path / "x.csv")
