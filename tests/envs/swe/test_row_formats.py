"""Rows in each benchmark's published schema (column names, types and value shapes as its
dataset card and loader write them) read into SWE-v0 instances with their harness record."""

import json
import os
import re
import subprocess
from pathlib import Path

import datasets
import pytest

from agentrl.envs.swe import InstanceError, load_instances
from agentrl.envs.swe.image_harness import HarnessError, activation, check_rows
from agentrl.envs.swe.instances import write_instances
from agentrl.envs.swe.r2e_commit import r2e_gold_patch
from agentrl.envs.swe.row_formats import (
    ROW_FORMATS,
    SWEBENCH_FAIL_ONLY_REPOS,
    SWEBENCH_LOG_PARSERS,
    detect_format,
    reverse_diff,
    swebench_image,
)

ROOT = Path(__file__).resolve().parents[3]
BASE = "d16bfe05a744909de4b27f5875fe0d4ed41ce607"
SETUP = "298ccb478e6bf092953bca67a3d29dc6c35f6752"
FIX = (
    "diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py\n"
    "--- a/astropy/modeling/separable.py\n+++ b/astropy/modeling/separable.py\n"
    "@@ -242,7 +242,7 @@ def _cstack(left, right):\n"
    "         cright = _coord_matrix(right, 'right', noutp)\n     else:\n"
    "         cright = np.zeros((noutp, right.shape[1]))\n"
    "-        cright[-right.shape[0]:, -right.shape[1]:] = 1\n"
    "+        cright[-right.shape[0]:, -right.shape[1]:] = right\n \n"
    "     return np.hstack([cleft, cright])\n \n"
)
TEST_FIX = (
    "diff --git a/astropy/modeling/tests/test_separable.py b/astropy/modeling/tests/test_separable.py\n"
    "--- a/astropy/modeling/tests/test_separable.py\n+++ b/astropy/modeling/tests/test_separable.py\n"
    "@@ -28,5 +28,6 @@\n p1 = models.Polynomial1D(1, name='p1')\n \n \n+cm_4d_expected = 1\n"
    " compound_models = {\n     'cm1': (map3 & sh1 | rot & sh1 | sh1 & sh2 & sh1,\n"
)


def verified_row(**changes):
    """SWE-bench_Verified's columns as its parquet holds them: the test lists are JSON text."""
    row = {
        "repo": "astropy/astropy",
        "instance_id": "astropy__astropy-12907",
        "base_commit": BASE,
        "patch": FIX,
        "test_patch": TEST_FIX,
        "problem_statement": "Modeling's `separability_matrix` does not compute separability correctly",
        "hints_text": "",
        "created_at": "2022-03-03T15:14:54Z",
        "version": "4.3",
        "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
        "PASS_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_coord_matrix"]',
        "environment_setup_commit": SETUP,
        "difficulty": "15 min - 1 hour",
    }
    row.update(changes)
    return row


EVAL_SCRIPT = (
    "#!/bin/bash\nset -uxo pipefail\nsource /opt/miniconda3/bin/activate\n"
    "conda activate testbed\ncd /testbed\n"
    f"git checkout {BASE} astropy/modeling/tests/test_separable.py\n"
    ": '>>>>> Start Test Output'\npytest -rA astropy/modeling/tests/test_separable.py\n"
    ": '>>>>> End Test Output'\n"
    f"git checkout {BASE} astropy/modeling/tests/test_separable.py\n"
)


def swebench5_row(**changes):
    """A SWE-bench 5 row: SWE-bench's columns plus the four make_test_spec reads."""
    row = verified_row(
        image="swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
        eval_script=EVAL_SCRIPT,
        log_parser="parse_log_astropy",
        eval_type="pass_and_fail",
        image_assets="",
    )
    row.update(changes)
    return row


def swe_gym_row(**changes):
    """SWE-Gym's columns: lists, no environment_setup_commit (its dataset card's features)."""
    row = {
        "instance_id": "getmoto__moto-5620",
        "hints_text": "Thanks for raising this @sirrus233",
        "patch": FIX.replace("astropy/modeling/separable.py", "moto/dynamodb/models/table.py"),
        "test_patch": TEST_FIX,
        "created_at": "2022-10-29T11:32:36Z",
        "problem_statement": "Dynamodb update_item does not raise ValidationException",
        "repo": "getmoto/moto",
        "base_commit": "80db33cb5c8a6dc5b2a6e0ab0fa58c8c6c2de4c3",
        "version": "4.0",
        "PASS_TO_PASS": ["tests/test_dynamodb/test_dynamodb.py::test_put_item_nonexisting"],
        "FAIL_TO_PASS": ["tests/test_dynamodb/test_dynamodb.py::test_update_item_duplicate"],
    }
    row.update(changes)
    return row


BUG = (
    "diff --git a/oauthlib/common.py b/oauthlib/common.py\n"
    "index 0ab2c6f..7d3e4b1 100644\n"
    "--- a/oauthlib/common.py\n+++ b/oauthlib/common.py\n"
    "@@ -1,4 +1,3 @@\n a = 1\n-b = 2\n+b = 3\n c = 4\n-d = 5\n"
    "diff --git a/oauthlib/extra.py b/oauthlib/extra.py\nnew file mode 100644\n"
    "--- /dev/null\n+++ b/oauthlib/extra.py\n@@ -0,0 +1 @@\n+x = 1\n"
)


def swe_smith_row(**changes):
    """SWE-smith's published columns (SWE-bench/SWE-smith dataset card): seven of them."""
    row = {
        "instance_id": "oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc",
        "patch": BUG,
        "FAIL_TO_PASS": ["tests/test_common.py::CommonTest::test_b"],
        "PASS_TO_PASS": ["tests/test_common.py::CommonTest::test_a"],
        "image_name": "swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
        "repo": "swesmith/oauthlib__oauthlib.1fd52536",
        "problem_statement": "b is 3 where it was 2",
    }
    row.update(changes)
    return row


OLD, NEW = "0f0e5c1b8b1cb8d5c7ec4a5d4c43a4b5b0b2b1c3", "9a1e4d8fbd8f4e2a1f6b1e3c1b3e8d5f7a9c2e41"


def _file_diff(path, lines):
    return {
        "old_file_content": "",
        "new_file_content": "",
        "header": {"file": {"path": path}, "misc_line": None},
        "index_line": {
            "old_commit_hash": "3b1f9c2",
            "new_commit_hash": "77aa0d1",
            "mode": "100644",
        },
        "is_binary_file": False,
        "binary_line": None,
        "minus_file": {"path": f"a/{path}"},
        "plus_file": {"path": f"b/{path}"},
        "hunks": [
            {
                "descriptor": {
                    "old_range": {"start": 10, "length": 2},
                    "new_range": {"start": 10, "length": 2},
                    "section": "def open(fp):",
                },
                "line_group": {"all_lines": lines},
                "modified_entities": [],
                "added_entities": [],
                "deleted_entities": [],
            }
        ],
    }


PARSED_COMMIT = {
    "file_diffs": [
        _file_diff(
            "src/PIL/Image.py",
            [
                {"content": "    fp = open(path)", "type": "context"},
                {"content": "    return fp", "type": "deleted"},
                {"content": "    return fp.read()", "type": "added"},
            ],
        ),
        _file_diff("Tests/test_image.py", [{"content": "x", "type": "added"}]),
    ],
    "old_commit_hash": OLD,
    "new_commit_hash": NEW,
    "commit_message": "Fix open",
    "commit_date": "2019-03-01T10:00:00",
    "metadata": {},
}
EXPECTED = {"Tests/test_image.py::test_open": "PASSED", "Tests/test_image.py::test_slow": "SKIPPED"}


def r2e_row(**changes):
    """R2E-Gym's columns (its DatasetRow in src/r2egym/repo_analysis/validate_docker_and_hf.py)."""
    row = {
        "repo_name": "pillow",
        "docker_image": f"namanjain12/pillow_final:{NEW}",
        "commit_hash": NEW,
        "parsed_commit_content": json.dumps(PARSED_COMMIT),
        "execution_result_content": json.dumps({"repo_name": "pillow", "new_commit_hash": NEW}),
        "modified_files": ["src/PIL/Image.py", "Tests/test_image.py"],
        "modified_entity_summaries": [{"type": "function", "name": "open"}],
        "relevant_files": ["src/PIL/Image.py"],
        "num_non_test_files": 1,
        "num_non_test_func_methods": 1,
        "num_non_test_lines": 2,
        "prompt": "...",
        "problem_statement": "[ISSUE]Image.open returns the file[/ISSUE]",
        "expected_output_json": json.dumps(EXPECTED),
    }
    row.update(changes)
    return row


def test_swebench_verified_row():
    (instance,) = load_instances([verified_row()])
    assert instance.FAIL_TO_PASS == [
        "astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"
    ]
    assert instance.difficulty == "15 min - 1 hour"
    harness = instance.harness
    assert harness.format == "swebench"
    assert harness.image == "sweb.eval.x86_64.astropy__astropy-12907:latest"
    assert (harness.repo_dir, harness.base_patch, harness.eval_script) == ("/testbed", "", None)
    assert harness.activate == "source /opt/miniconda3/bin/activate && conda activate testbed"
    assert (harness.log_parser, harness.eval_type) == ("parse_log_astropy", "pass_and_fail")


def test_swebench_image_naming_rule():
    assert swebench_image("Django__django-11099") == "sweb.eval.x86_64.django__django-11099:latest"
    assert (
        swebench_image("Django__django-11099", namespace="swebench")
        == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    )


def test_swebench5_row_takes_its_own_harness_columns():
    (instance,) = load_instances([swebench5_row()])
    harness = instance.harness
    assert harness.format == "swebench5"
    assert harness.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert harness.eval_script == EVAL_SCRIPT
    assert (harness.log_parser, harness.eval_type) == ("parse_log_astropy", "pass_and_fail")
    assert instance.model_extra == {"image_assets": ""}
    assert "image" not in instance.to_row()


def test_swe_gym_parquet(tmp_path):
    path = tmp_path / "swe-gym.parquet"
    datasets.Dataset.from_list([swe_gym_row()]).to_parquet(str(path))
    (instance,) = load_instances(path)
    assert instance.environment_setup_commit is None
    assert instance.harness.format == "swe-gym"
    assert instance.harness.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5620:latest"
    assert instance.harness.log_parser == "parse_log_pytest"


def test_swe_gym_pydantic_uses_the_fork_parser():
    (instance,) = load_instances([swe_gym_row(repo="pydantic/pydantic")])
    assert instance.harness.log_parser == "parse_log_pytest_pydantic"


def test_swe_smith_row_base_is_the_bug_and_gold_its_reverse():
    (instance,) = load_instances([swe_smith_row()])
    harness = instance.harness
    assert harness.format == "swe-smith"
    assert harness.image == "swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536"
    assert harness.base_patch == BUG
    assert instance.patch == reverse_diff(BUG)
    assert (instance.base_commit, instance.test_patch, instance.version) == ("", "", "1fd52536")
    assert harness.log_parser == "swesmith" and harness.test_command is None
    assert harness.eval_script is None and harness.hidden_tests == harness.reset_tests == ()


def test_r2e_gym_row():
    (instance,) = load_instances([r2e_row()])
    assert instance.instance_id == f"pillow-{NEW}"
    assert (instance.repo, instance.base_commit, instance.version) == ("pillow", OLD, NEW)
    assert instance.patch == (
        "diff --git a/src/PIL/Image.py b/src/PIL/Image.py\n"
        "index 3b1f9c2..77aa0d1 100644\n"
        "--- a/src/PIL/Image.py\n+++ b/src/PIL/Image.py\n"
        "@@ -10,2 +10,2 @@ def open(fp):\n"
        "     fp = open(path)\n-    return fp\n+    return fp.read()\n"
    )
    assert instance.FAIL_TO_PASS == ["Tests/test_image.py::test_open"]
    assert instance.problem_statement == "Image.open returns the file"  # get_task_instruction
    harness = instance.harness
    assert harness.image == f"namanjain12/pillow_final:{NEW}"
    assert harness.test_command == "bash /root/run_tests.sh"
    assert (harness.eval_type, harness.expected_statuses) == ("expected_statuses", EXPECTED)
    assert harness.activate == "source /testbed/.venv/bin/activate"
    assert set(instance.model_extra) >= {"execution_result_content", "relevant_files"}


def test_r2e_gold_patch_keeps_only_non_test_python_files():
    commit = {
        "file_diffs": [
            _file_diff(path, [{"content": "x", "type": "added"}])
            for path in ("a/test_x.py", "pkg/x_test.py", "test/y.py", "README.md", "pkg/z.py")
        ]
    }
    assert r2e_gold_patch(commit).count("diff --git") == 1
    assert "pkg/z.py" in r2e_gold_patch(commit)


@pytest.mark.parametrize(
    ("rows", "name"),
    [
        ([verified_row()], "swebench"),
        ([swebench5_row()], "swebench5"),
        ([swe_gym_row()], "swe-gym"),
        ([swe_smith_row()], "swe-smith"),
        ([r2e_row()], "r2e-gym"),
    ],
)
def test_detection_from_columns(rows, name):
    assert detect_format(set(rows[0])) == name
    assert load_instances(rows, format=name) == load_instances(rows)


def test_undetected_columns_name_what_was_seen_and_what_is_known():
    with pytest.raises(ValueError, match=r"no known row format has the columns \['id', 'x'\]") as e:
        load_instances([{"id": 1, "x": 2}])
    assert all(name in str(e.value) for name in ROW_FORMATS)


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match=r"unknown row format 'swe-bench'; known: \['agentrl'"):
        load_instances([verified_row()], format="swe-bench")


@pytest.mark.parametrize(
    ("format", "row", "message"),
    [
        (
            "swebench5",
            swebench5_row(eval_type=None),
            "'astropy__astropy-12907': field 'eval_type' is missing",
        ),
        ("swebench5", swebench5_row(eval_type="all"), "field 'eval_type' must be one of"),
        (
            "swebench",
            verified_row(base_commit="abc"),
            "field 'base_commit' must be a 40-hex git sha",
        ),
        (
            "swebench",
            verified_row(FAIL_TO_PASS="tests"),
            "field 'FAIL_TO_PASS' must be a list of test ids",
        ),
        (
            "swe-gym",
            swe_gym_row(FAIL_TO_PASS={"a": 1}),
            "'getmoto__moto-5620': field 'FAIL_TO_PASS' input should be a valid list",
        ),
        ("swe-smith", swe_smith_row(image_name=None), "field 'image_name' is missing"),
        ("swe-smith", swe_smith_row(patch="bug"), "field 'patch' must be a unified diff"),
        (
            "r2e-gym",
            r2e_row(parsed_commit_content="{"),
            "instance at row 0: field 'parsed_commit_content' must be JSON",
        ),
        (
            "r2e-gym",
            r2e_row(expected_output_json="[]"),
            "field 'expected_output_json' must map each test",
        ),
        (
            "r2e-gym",
            r2e_row(expected_output_json="{}"),
            "field 'FAIL_TO_PASS' must list at least one test",
        ),
    ],
)
def test_malformed_rows_name_instance_and_field(format, row, message):
    row = {key: value for key, value in row.items() if value is not None}
    with pytest.raises(InstanceError) as error:
        load_instances([row], format=format)
    assert message in str(error.value)


def test_empty_base_commit_needs_a_base_patch():
    with pytest.raises(InstanceError, match=r"'base_commit' must be a 40-hex git sha \(empty only"):
        load_instances([verified_row(base_commit="")])


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize(
    "rows", [[verified_row()], [swebench5_row()], [swe_gym_row()], [swe_smith_row()], [r2e_row()]]
)
def test_round_trip_of_every_format(tmp_path, suffix, rows):
    """Written back, a read row is SWE-v0's own format and reads back the same."""
    instances = load_instances(rows)
    path = tmp_path / f"instances{suffix}"
    write_instances(instances, path)
    assert load_instances(path) == instances


def _git(tmp_path, *args, stdin=None):
    return subprocess.run(
        ["git", *args], cwd=tmp_path, input=stdin, text=True, capture_output=True, check=True
    )


def test_reverse_diff_undoes_the_diff_with_git(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "oauthlib").mkdir()
    (tmp_path / "oauthlib" / "common.py").write_text("a = 1\nb = 2\nc = 4\nd = 5\n")
    _git(tmp_path, "apply", "-", stdin=BUG)
    assert (tmp_path / "oauthlib" / "extra.py").exists()
    _git(tmp_path, "apply", "-", stdin=reverse_diff(BUG))
    assert (tmp_path / "oauthlib" / "common.py").read_text() == "a = 1\nb = 2\nc = 4\nd = 5\n"
    assert not (tmp_path / "oauthlib" / "extra.py").exists()
    assert reverse_diff(reverse_diff(BUG)) == BUG


SWEBENCH_VENV = ROOT / ".venv-swebench"
COMPARE = """
import json, sys
from swebench.image_builder.image_spec import ImageSpec
from swebench.harness.utils import make_test_spec
row = json.loads(sys.stdin.read())
spec = make_test_spec(row)
print(json.dumps({
    "local": ImageSpec(row["instance_id"], "FROM x", None).name,
    "remote": ImageSpec(row["instance_id"], "FROM x", "swebench").name,
    "image": spec.image, "log_parser": spec.log_parser, "eval_type": spec.eval_type,
    "FAIL_TO_PASS": spec.FAIL_TO_PASS,
}))
"""


def test_against_swebench_own_code():
    """swebench 5.0.2's ImageSpec.name and make_test_spec on the same SWE-bench 5 row."""
    python = SWEBENCH_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{SWEBENCH_VENV} is missing: run scripts/setup-swebench-env")
    row = swebench5_row(instance_id="Astropy__astropy-12907")
    out = subprocess.run(
        [str(python), "-c", COMPARE], input=json.dumps(row), text=True, capture_output=True
    )
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)
    (ours,) = load_instances([row])
    assert theirs["local"] == swebench_image(row["instance_id"])
    assert theirs["remote"] == swebench_image(row["instance_id"], namespace="swebench")
    assert theirs["image"] == ours.harness.image
    assert (theirs["log_parser"], theirs["eval_type"]) == (
        ours.harness.log_parser,
        ours.harness.eval_type,
    )
    assert theirs["FAIL_TO_PASS"] == ours.FAIL_TO_PASS


EVAL_SCRIPTS = ROOT / "scripts" / "swebench4-eval-scripts"
SWEBENCH4_TABLES = """
import importlib, json
import swebench
from swebench.harness.constants import FAIL_ONLY_REPOS
from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
from swebench.harness.test_spec.test_spec import make_test_spec
ours = json.loads(input())
modules = [importlib.import_module(f"swebench.harness.log_parsers.{name}")
           for name in ("python", "javascript", "java", "go", "rust", "ruby", "php", "c")]
named = {name: getattr(m, name) for m in modules for name in dir(m) if name.startswith("parse_log")}
print(json.dumps({
    "version": swebench.__version__,
    "repos": sorted(MAP_REPO_TO_PARSER),
    "same_parser": sorted(repo for repo, name in ours["parsers"].items()
                          if named.get(name) is MAP_REPO_TO_PARSER.get(repo)),
    "fail_only": sorted(FAIL_ONLY_REPOS),
    "image": make_test_spec(ours["row"]).instance_image_key,
}))
"""


def test_swebench_rows_run_with_the_eval_script_swebench_4_writes(tmp_path):
    """scripts/swebench4-eval-scripts adds swebench 4.1.0's own eval script (make_test_spec, its
    spec tables) to SWE-bench/Verified rows as published; SWE-v0 reads them as SWE-bench rows
    that the image harness runs, whose image, log parser and eval type agree with swebench 4.1's
    (the parser by identity with its MAP_REPO_TO_PARSER, for every repository in our table)."""
    rows, out = tmp_path / "rows.jsonl", tmp_path / "with-scripts.jsonl"
    rows.write_text(json.dumps(verified_row()) + "\n")
    done = subprocess.run([EVAL_SCRIPTS, rows, out], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (written,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert {k: v for k, v in written.items() if k != "eval_script"} == verified_row()
    (instance,) = load_instances(out)
    harness = instance.harness
    assert harness.format == "swebench" and harness.eval_script == written["eval_script"]
    script = harness.eval_script
    # astropy 4.3's spec: its install, the test patch as a heredoc, pytest on the touched file
    assert "python -m pip install -e .[test] --verbose\n" in script
    assert f"git apply -v - <<'EOF_114329324912'\n{TEST_FIX}" in script
    assert (
        ": '>>>>> Start Test Output'\npytest -rA astropy/modeling/tests/test_separable.py\n"
        ": '>>>>> End Test Output'\n"
    ) in script
    activate = ["source /opt/miniconda3/bin/activate", "conda activate testbed"]
    assert activation(instance).splitlines() == activate * 2  # the script enters it twice
    check_rows([instance], "container")  # runnable, given its image
    (bare,) = load_instances([verified_row()])
    with pytest.raises(
        HarnessError, match=re.escape("scripts/swebench4-eval-scripts IN.jsonl OUT.jsonl")
    ):
        check_rows([bare], "container")
    # a version swebench 4.1 has no spec for: refused by name, nothing written
    rows.write_text(json.dumps(verified_row(version="99.9")) + "\n")
    out.unlink()
    done = subprocess.run([EVAL_SCRIPTS, rows, out], capture_output=True, text=True)
    assert done.returncode != 0 and "no spec for astropy/astropy 99.9" in done.stderr
    assert not out.exists()
    # our transcribed tables against swebench 4.1's own
    python = SWEBENCH_VENV / "bin" / "python"
    spec = json.dumps({"parsers": SWEBENCH_LOG_PARSERS, "row": verified_row()})
    theirs = subprocess.run(
        [str(python), "-c", SWEBENCH4_TABLES],
        input=spec,
        text=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(SWEBENCH_VENV / "swebench4")},
    )
    assert theirs.returncode == 0, theirs.stderr
    tables = json.loads(theirs.stdout)
    assert tables["version"] == "4.1.0"
    assert tables["repos"] == sorted(SWEBENCH_LOG_PARSERS)
    assert tables["same_parser"] == sorted(SWEBENCH_LOG_PARSERS)
    # fail-only grading: swebench 5.0.2's set (three repositories more than 4.1's), which grades
    from swebench.harness.constants import FAIL_ONLY_REPOS

    assert SWEBENCH_FAIL_ONLY_REPOS == FAIL_ONLY_REPOS > set(tables["fail_only"])
    assert tables["image"] == harness.image == swebench_image(instance.instance_id)


def test_swe_smith_rows_get_their_profiles_eval_script_and_environment(tmp_path):
    """scripts/swesmith-eval-scripts runs SWE-smith's own profile of the row's repository
    (oauthlib's, in swesmith 0.0.9's registry): the eval script runs its test command, which
    enters the image's conda env first; the agent's shells enter it too (activation), and the
    FAIL_TO_PASS test's file is hidden from the agent."""
    rows, out = tmp_path / "rows.jsonl", tmp_path / "with-scripts.jsonl"
    rows.write_text(json.dumps(swe_smith_row()) + "\n")
    script = ROOT / "scripts" / "swesmith-eval-scripts"
    done = subprocess.run([script, rows, out], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (written,) = [json.loads(line) for line in out.read_text().splitlines()]
    added = {"eval_script", "hidden_tests", "reset_tests"}
    assert {k: v for k, v in written.items() if k not in added} == swe_smith_row()
    assert written["hidden_tests"] == written["reset_tests"] == ["tests/test_common.py"]
    (instance,) = load_instances(out)
    assert instance.harness.eval_script == written["eval_script"]
    assert "conda activate testbed; pytest --disable-warnings --color=no" in written["eval_script"]
    assert activation(instance).splitlines() == [
        "source /opt/miniconda3/bin/activate",
        "conda activate testbed",
    ]
    check_rows([instance], "container")  # runnable, given its image


def test_the_apply_chains_are_swebenchs_and_swesmiths():
    """The grader's `git apply` chains are swebench 5.0.2's and swesmith 0.0.9's own."""
    from agentrl.envs.swe.image_harness import GIT_APPLY_CMDS, SWESMITH_GIT_APPLY_CMDS

    python = SWEBENCH_VENV / "bin" / "python"
    code = "import json, {0}; print(json.dumps(list({0}.GIT_APPLY_CMDS)))"
    for module, chain, path in [
        ("swebench.harness.run_evaluation", GIT_APPLY_CMDS, ""),
        ("swesmith.constants", SWESMITH_GIT_APPLY_CMDS, str(SWEBENCH_VENV / "swebench4")),
    ]:
        done = subprocess.run(
            [python, "-c", code.format(module)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == list(chain), module
