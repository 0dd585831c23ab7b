"""SWE-v0 on SWE-smith rows: the shipped instances written in SWE-smith's seven columns
(:mod:`agentrl.envs.swe.swesmith_rows`), given their eval scripts and test files by swesmith's own
profiles (``scripts/swesmith-eval-scripts``, swesmith 0.0.9 in ``.venv-swebench``), run on their
projects' SWE-smith-layout images (``sandboxes/build.sh swe-testbed``) through the environment's
own tools, and graded by swesmith's ``get_eval_report``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import gymnasium
import pytest
from row_episodes import apply_command, bash_episode, hermes

import agentrl  # noqa: F401
from agentrl.envs import INFRA_ERROR
from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.image_harness import HarnessError
from agentrl.envs.swe.instances import load_instances
from agentrl.envs.swe.swesmith_grading import (
    VENV_VARIABLE,
    SideError,
    side_missing,
    swesmith_report,
)
from agentrl.envs.swe.swesmith_rows import PROFILES, swesmith_row, write_rows

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[3]
INSTANCES = {i.instance_id: i for i in load_instances(SHIPPED_INSTANCES)}
ONE_PER_PROJECT = ["inflection__0.5.1-1", "toolz__1.2.0-4", "tabulate__0.10.0-10"]
PROFILES_VARIABLE = "AGENTRL_SWESMITH_PROFILES"


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """The rows as published (seven columns), then as swesmith-eval-scripts writes them."""
    if why := side_missing():
        pytest.fail(why)
    directory = tmp_path_factory.mktemp("swesmith")
    bare, full = directory / "bare.jsonl", directory / "rows.jsonl"
    write_rows([INSTANCES[i] for i in ONE_PER_PROJECT], bare)
    saved = os.environ.get(PROFILES_VARIABLE)
    os.environ[PROFILES_VARIABLE] = str(PROFILES)
    subprocess.run(
        [str(ROOT / "scripts" / "swesmith-eval-scripts"), str(bare), str(full)],
        check=True,
        capture_output=True,
        text=True,
    )
    yield bare, full
    if saved is None:
        os.environ.pop(PROFILES_VARIABLE, None)
    else:
        os.environ[PROFILES_VARIABLE] = saved


def make_env(path: Path, instance_ids: list[str] | None = None):
    return gymnasium.make(
        "agentrl/SWE-v0",
        instances=str(path),
        instance_format="swe-smith",
        instance_ids=instance_ids,
        sandbox="container",
    )


def smith_id(instance_id: str) -> str:
    row = swesmith_row(INSTANCES[instance_id])
    assert row is not None
    return row["instance_id"]


async def episode(rows, instance_id: str, *commands: str) -> tuple[list, float, dict]:
    return await bash_episode(lambda: make_env(rows[1], [smith_id(instance_id)]), *commands)


def test_the_eval_script_is_swesmiths_with_the_profiles_test_command(rows):
    written = [json.loads(line) for line in rows[1].read_text().splitlines()]
    for row, instance_id in zip(written, ONE_PER_PROJECT, strict=True):
        instance = INSTANCES[instance_id]
        script = row["eval_script"].splitlines()
        assert script[:4] == [
            "#!/bin/bash",
            "set -uxo pipefail",
            "cd /testbed",
            ": '>>>>> Start Test Output'",
        ]
        assert script[-1] == ": '>>>>> End Test Output'" and "--verbose" in script[4]
        hidden = sorted({test.split("::")[0] for test in instance.FAIL_TO_PASS})
        assert row["hidden_tests"] == hidden
        assert set(hidden) <= set(row["reset_tests"])


@pytest.mark.parametrize("instance_id", ONE_PER_PROJECT)
async def test_rows_run_on_their_image_and_swesmith_grades_them(rows, instance_id):
    instance = INSTANCES[instance_id]
    hidden = sorted({test.split("::")[0] for test in instance.FAIL_TO_PASS})
    gold = apply_command(instance.patch)
    look = (
        f"pwd; git rev-list --count HEAD; git cat-file -e {instance.environment_setup_commit} "
        f"&& echo LEAK; ls {' '.join(hidden)} 2>&1 | grep -c 'No such file'"
    )
    shown, reward, info = await episode(rows, instance_id, look, gold)
    # /testbed, one commit (the image's history, which holds the fix, is gone), tests hidden
    assert shown[0].split("\n")[:3] == ["/testbed", "1", str(len(hidden))], shown[0]
    assert reward == 1.0, info["grading_reason"]
    assert info["fail_to_pass_passed"] == info["fail_to_pass_total"] > 0
    wrong = f"echo '# not a fix' >> {instance.agentrl_taskgen.file}"  # applies, bug stays
    _, reward, info = await episode(rows, instance_id, wrong)
    assert reward == 0.0 and "did not pass (swesmith's report)" in info["grading_reason"]


async def test_rewriting_the_hidden_tests_scores_zero(rows):
    """The agent writes the hidden test file anew, every FAIL_TO_PASS test a pass: the grader
    restores the instance's tests (SWE-smith's reset), so the bug still fails them."""
    instance_id = ONE_PER_PROJECT[0]
    instance = INSTANCES[instance_id]
    path = instance.FAIL_TO_PASS[0].split("::")[0]
    names = sorted({test.split("::")[1] for test in instance.FAIL_TO_PASS})
    body = "".join(f"def {name}():\n    pass\n" for name in names)
    _, reward, info = await episode(rows, instance_id, f"printf %s {json.dumps(body)} > {path}")
    assert reward == 0.0 and info["patch_bytes"] > 0, info["grading_reason"]


def test_a_row_without_swesmiths_columns_is_refused_naming_the_script(rows):
    with pytest.raises(HarnessError, match="scripts/swesmith-eval-scripts"):
        make_env(rows[0])


def test_without_swesmith_the_rows_are_refused_naming_the_setup(rows, tmp_path, monkeypatch):
    monkeypatch.setenv(VENV_VARIABLE, str(tmp_path))
    with pytest.raises(HarnessError, match="scripts/setup-swebench-env"):
        make_env(rows[1])


async def test_a_failing_grader_is_an_infrastructure_fault(rows, monkeypatch):
    """swesmith's grading that cannot run (here: no profile for the repository, which only the
    grading needs) is SideError, and the episode ends with infra_error, not a score."""
    monkeypatch.delenv(PROFILES_VARIABLE)
    (instance, *_) = load_instances(rows[1], format="swe-smith")
    with pytest.raises(SideError, match="No profile registered"):
        await swesmith_report(instance, instance.patch, "")
    env = make_env(rows[1], [instance.instance_id])
    try:
        await env.areset(seed=0)
        gold = apply_command(instance.patch)
        await env.astep(hermes("bash", command=gold))
        _, reward, done, _, info = await env.astep(hermes("submit"))
    finally:
        await env.aclose()
    assert done and reward == 0.0 and "No profile registered" in info[INFRA_ERROR]


@pytest.mark.parametrize(
    ("image", "command"),
    [
        ("swebench/swesmith.x86_64.agentrl-taskgen_1776_inflection.0000000a", "swe-testbed"),
        ("swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536", "podman pull swebench/"),
    ],
)
def test_a_missing_image_is_refused_with_the_command_that_makes_it(rows, tmp_path, image, command):
    row = json.loads(rows[1].read_text().splitlines()[0]) | {"image_name": image}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(HarnessError, match=f"images missing on the engine: {image} .*{command}"):
        make_env(path, [row["instance_id"]])
