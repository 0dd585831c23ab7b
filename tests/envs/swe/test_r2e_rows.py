"""SWE-v0 on R2E-Gym rows: the shipped instances written as R2E-Gym commits
(:mod:`agentrl.envs.swe.r2e_rows`), run on their R2E-Gym-layout images (``sandboxes/build.sh
swe-testbed``) through the environment's own tools, and graded by R2E-Gym's rules
(:mod:`agentrl.envs.swe.r2e_grading`; R2E-Gym is not on PyPI, so its parser is checked here on
real pytest output rather than against its code)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium
import pytest
from row_episodes import apply_command, bash_episode, hermes

import agentrl  # noqa: F401
from agentrl.envs import INFRA_ERROR
from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.image_harness import HarnessError
from agentrl.envs.swe.instances import load_instances
from agentrl.envs.swe.r2e_commit import parsed_commit, r2e_gold_patch
from agentrl.envs.swe.r2e_grading import R2E_GYM, parse_log_pytest, r2e_verdict, strip_output
from agentrl.envs.swe.r2e_rows import R2E_TESTS_CMD, write_rows
from agentrl.envs.swe.row_formats import swebench_image

pytestmark = pytest.mark.slow  # rows run pytest; the episodes start containers

INSTANCES = {i.instance_id: i for i in load_instances(SHIPPED_INSTANCES)}
ONE_PER_PROJECT = ["inflection__0.5.1-3", "toolz__1.2.0-11", "tabulate__0.10.0-9"]
DATASET_ROW = {  # R2E-Gym's DatasetRow (src/r2egym/repo_analysis/validate_docker_and_hf.py)
    "repo_name",
    "docker_image",
    "commit_hash",
    "parsed_commit_content",
    "execution_result_content",
    "modified_files",
    "modified_entity_summaries",
    "relevant_files",
    "num_non_test_files",
    "num_non_test_func_methods",
    "num_non_test_lines",
    "prompt",
    "problem_statement",
    "expected_output_json",
}


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("r2e") / "rows.jsonl"
    written = write_rows([INSTANCES[i] for i in ONE_PER_PROJECT], path)
    assert len(written) == len(ONE_PER_PROJECT)
    return path


def row_of(rows: Path, instance_id: str) -> dict:
    index = ONE_PER_PROJECT.index(instance_id)
    return json.loads(rows.read_text().splitlines()[index])


def make_env(path: Path, instance_ids: list[str] | None = None):
    return gymnasium.make(
        "agentrl/SWE-v0",
        instances=str(path),
        instance_format=R2E_GYM,
        instance_ids=instance_ids,
        sandbox="container",
    )


async def episode(rows: Path, instance_id: str, *commands: str) -> tuple[list, float, dict]:
    row = row_of(rows, instance_id)
    r2e_id = f"{row['repo_name']}-{row['commit_hash']}"
    return await bash_episode(lambda: make_env(rows, [r2e_id]), *commands)


def test_rows_have_r2e_gyms_columns_and_read_back_as_the_instances(rows):
    for instance_id in ONE_PER_PROJECT:
        row, instance = row_of(rows, instance_id), INSTANCES[instance_id]
        assert set(row) == DATASET_ROW
        (read,) = load_instances([row])
        assert read.harness.format == R2E_GYM
        assert read.harness.image == row["docker_image"]
        assert row["docker_image"].startswith(f"agentrl-r2e/{row['repo_name']}_final:")
        assert read.base_commit == instance.base_commit and read.patch == instance.patch
        assert read.problem_statement == instance.problem_statement  # inside [ISSUE]...[/ISSUE]
        expected = json.loads(row["expected_output_json"])
        # R2E-Gym's names drop the file: the instance's FAIL_TO_PASS tests, all passing
        for test in instance.FAIL_TO_PASS:
            assert expected[test.partition("::")[2].replace("::", ".")] == "PASSED"
        names = json.loads(row["execution_result_content"])["test_file_names"]
        assert names[0] == "test_1.py"


def test_parsed_commit_reads_a_diff_as_r2e_gyms_parser():
    diff = textwrap.dedent(
        """\
        diff --git a/pkg/mod.py b/pkg/mod.py
        old mode 100644
        new mode 100755
        index 1111111..2222222
        --- a/pkg/mod.py
        +++ b/pkg/mod.py
        @@ -1,2 +1,2 @@ def f():
         keep
        -old
        +new
        \\ No newline at end of file
        diff --git a/tests/test_mod.py b/tests/test_mod.py
        new file mode 100644
        index 0000000..3333333
        --- /dev/null
        +++ b/tests/test_mod.py
        @@ -0,0 +1 @@
        +def test_x(): pass
        """
    )
    commit = parsed_commit(diff, "a" * 40, "b" * 40, "fix")
    mod, test = commit["file_diffs"]
    assert mod["header"]["misc_line"] == "old mode 100644\nnew mode 100755"
    assert mod["index_line"] == {
        "old_commit_hash": "1111111",
        "new_commit_hash": "2222222",
        "mode": "",
    }
    kinds = [line["type"] for line in mod["hunks"][0]["line_group"]["all_lines"]]
    assert kinds == ["context", "deleted", "added", "note"]
    assert test["hunks"][0]["descriptor"]["new_range"] == {"start": 1, "length": None}
    # the gold patch R2E-Gym rebuilds from it: the non-test file, as the diff wrote it
    assert r2e_gold_patch(commit) == diff[: diff.index("diff --git a/tests")]


def test_renamed_files_are_refused_as_r2e_gym_refuses_them():
    with pytest.raises(ValueError, match="renames"):
        parsed_commit("diff --git a/x.py b/y.py\n", "a" * 40, "b" * 40, "fix")


@pytest.fixture(scope="module")
def pytest_run(tmp_path_factory) -> str:
    """R2E-Gym's command on a real test file: passes, a failure, an error, a skip, an xfail, a
    class, parameters with spaces and " - " in them, a failure message holding "PASSED"."""
    tree = tmp_path_factory.mktemp("run")
    (tree / "r2e_tests").mkdir()
    (tree / "r2e_tests" / "test_1.py").write_text(
        textwrap.dedent(
            """\
            import pytest

            def test_pass(): pass
            def test_fail(): assert False, "boom"
            def test_says(): assert False, "PASSED"
            @pytest.fixture
            def broken(): raise RuntimeError("no")
            def test_error(broken): pass
            def test_skip(): pytest.skip("later")
            @pytest.mark.xfail
            def test_xfail(): assert False
            class TestKind:
                def test_method(self): pass
            @pytest.mark.parametrize("x", ["a b", "c - d"])
            def test_param(x): assert x != "c - d"
            """
        )
    )
    command = R2E_TESTS_CMD.replace(".venv/bin/python", sys.executable)
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run(
        ["bash", "-c", f"{command} --color=yes 2>&1"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    return run.stdout


def test_r2e_gyms_parser_on_real_pytest_output(pytest_run):
    assert "\x1b[" in pytest_run  # coloured, as a terminal run would be
    assert parse_log_pytest(strip_output(pytest_run)) == {
        "test_pass": "PASSED",
        "test_fail": "FAILED",
        # R2E-Gym looks for PASSED first, anywhere in the line, and cuts no message off a pass
        "test_says - AssertionError: PASSED": "PASSED",
        "test_error": "ERROR",
        "TestKind.test_method": "PASSED",
        "test_param[a b]": "PASSED",
        "test_param[c": "FAILED",  # its " - " cut, inside the parameter
    }
    assert parse_log_pytest("no summary at all") == {}


def test_r2e_verdict_needs_every_test_and_only_those(pytest_run):
    expected = parse_log_pytest(strip_output(pytest_run))
    resolved, parsed, why = r2e_verdict(pytest_run, expected)
    assert (resolved, why) == (True, "")
    assert parsed["test_says"] == "PASSED"  # both maps' names are cut at " - " before comparing
    fewer = dict(list(expected.items())[1:])
    assert (
        "read 7 tests from the run, expected_output_json has 6" in r2e_verdict(pytest_run, fewer)[2]
    )
    other = fewer | {"test_other": "PASSED"}
    assert "a test expected_output_json lacks: 'test_pass'" in r2e_verdict(pytest_run, other)[2]
    flipped = expected | {"test_fail": "PASSED"}
    assert "'test_fail' is FAILED, expected PASSED" in r2e_verdict(pytest_run, flipped)[2]


@pytest.mark.parametrize("instance_id", ONE_PER_PROJECT)
async def test_rows_run_on_their_image_and_r2e_gyms_reward_grades_them(rows, instance_id):
    """R2E-Gym's own validation of a task (validate_docker): 0 before the gold patch, 1 after;
    the agent's tree is /testbed at the parent commit in the venv, without R2E-Gym's hidden files
    (and without compiled files: R2E-Gym's set-up deletes every .pyc, tracked ones included)."""
    instance = INSTANCES[instance_id]
    look = (
        "pwd; ls -a | grep -c -x -e run_tests.sh -e r2e_tests; git rev-parse HEAD; "
        "git status --porcelain | grep -vc '[.]pyc$'; python -c 'import sys; print(sys.prefix)'; "
        "cat /r2e_tests/test_1.py 2>&1 | grep -c 'Permission denied'"
    )
    shown, reward, info = await episode(rows, instance_id, look, apply_command(instance.patch))
    assert shown[0].split("\n")[:6] == [
        "/testbed",
        "0",
        instance.base_commit,
        "0",
        "/testbed/.venv",
        "1",
    ], shown[0]
    assert reward == 1.0, info["grading_reason"]
    expected = json.loads(row_of(rows, instance_id)["expected_output_json"])
    passing = sum(status == "PASSED" for status in expected.values())  # the row's FAIL_TO_PASS
    assert info["fail_to_pass_passed"] == info["fail_to_pass_total"] == passing
    _, reward, info = await episode(rows, instance_id)
    assert reward == 0.0 and "(R2E-Gym's reward)" in info["grading_reason"]


async def test_a_patch_cannot_replace_the_hidden_tests_or_the_test_script(rows):
    """The agent writes r2e_tests/ with every expected test a pass, and a run_tests.sh that
    prints R2E-Gym's summary: the grader puts the image's tests back and runs the image's
    script, so the bug still fails them."""
    instance_id = ONE_PER_PROJECT[0]
    expected = json.loads(row_of(rows, instance_id)["expected_output_json"])
    names = sorted({name.split("[")[0] for name in expected})
    stubs = "".join(f"def {name}(*a):\n    pass\n" for name in names)
    summary = "".join(f"PASSED r2e_tests/test_1.py::{name}\n" for name in expected)
    forge = (
        f"mkdir r2e_tests && printf %s {json.dumps(stubs)} > r2e_tests/test_1.py && "
        f"printf '%s\\n' '===== short test summary info =====' > run_tests.txt && "
        f"printf %s {json.dumps(summary)} >> run_tests.txt && echo 'cat run_tests.txt' > run_tests.sh"
    )
    _, reward, info = await episode(rows, instance_id, forge)
    assert reward == 0.0 and info["patch_bytes"] > 0, info["grading_reason"]
    assert "(R2E-Gym's reward)" in info["grading_reason"]


@pytest.mark.parametrize(
    ("image", "command"),
    [
        ("agentrl-r2e/toolz_final:" + "0" * 40, "sandboxes/build.sh swe-testbed"),
        ("namanjain12/pillow_final:" + "0" * 40, "podman pull namanjain12/"),
    ],
)
def test_a_missing_image_is_refused_with_the_command_that_makes_it(rows, tmp_path, image, command):
    row = row_of(rows, ONE_PER_PROJECT[1]) | {"docker_image": image}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(HarnessError, match=f"images missing on the engine: {image} .*{command}"):
        make_env(path)


async def test_an_image_without_r2e_gyms_files_is_an_infrastructure_fault(rows, tmp_path):
    """A row naming an image with no /r2e_tests or run_tests.sh (here: the instance's
    SWE-bench-layout image): the episode runs, and its grading ends in infra_error, not a score."""
    instance_id = ONE_PER_PROJECT[1]
    row = row_of(rows, instance_id) | {"docker_image": swebench_image(instance_id)}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    env = make_env(path)
    try:
        await env.areset(seed=0)
        await env.astep(hermes("bash", command=apply_command(INSTANCES[instance_id].patch)))
        _, reward, done, _, info = await env.astep(hermes("submit"))
    finally:
        await env.aclose()
    assert done and reward == 0.0 and "/r2e_tests" in info[INFRA_ERROR], info
