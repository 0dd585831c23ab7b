"""SWE-v0 on SWE-bench 5 rows: the shipped instances on their official-layout images
(``sandboxes/build.sh swe-testbed``), driven through the environment's own tools and graded as
SWE-bench's harness grades them; the verdicts agree with SWE-v0's native grading."""

from __future__ import annotations

import json
import shlex

import gymnasium
import pytest

import agentrl  # noqa: F401
from agentrl.envs import INFRA_ERROR
from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.image_harness import HarnessError
from agentrl.envs.swe.instances import load_instances
from agentrl.envs.swe.swebench_rows import write_rows

pytestmark = pytest.mark.slow

INSTANCES = {i.instance_id: i for i in load_instances(SHIPPED_INSTANCES)}
ONE_PER_PROJECT = ["inflection__0.5.1-1", "toolz__1.2.0-4", "tabulate__0.10.0-10"]


def hermes(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def gold(instance_id: str) -> str:
    patch = INSTANCES[instance_id].patch
    return f"git apply <<'AGENTRL_EOF'\n{patch}\nAGENTRL_EOF"


def wrong(instance_id: str) -> str:
    """A non-empty patch that applies and leaves the bug: a comment in the file the fix edits."""
    return f"echo '# not a fix' >> {shlex.quote(INSTANCES[instance_id].agentrl_taskgen.file)}"


ACTIONS = {"gold": (gold, 1.0), "none": (lambda _: "true", 0.0), "wrong": (wrong, 0.0)}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    write_rows([INSTANCES[i] for i in ONE_PER_PROJECT], path)
    return path


async def episode(command: str, instance_id: str, **kwargs) -> tuple[list, float, dict]:
    """Reset, one bash call, submit: the bash output, the reward and the last step's info."""
    env = gymnasium.make("agentrl/SWE-v0", instance_ids=[instance_id], **kwargs)
    try:
        await env.areset(seed=0)
        shown, *_ = await env.astep(hermes("bash", command=command))
        _, reward, done, _, info = await env.astep(hermes("submit"))
    finally:
        await env.aclose()
    assert done and INFRA_ERROR not in info, info
    return shown, reward, info


@pytest.mark.parametrize("instance_id", ONE_PER_PROJECT)
async def test_rows_run_on_their_image_and_agree_with_native_grading(rows, instance_id):
    for name, (action, expected) in ACTIONS.items():
        command = action(instance_id)
        shown, reward, info = await episode(
            f"pwd && {command}",
            instance_id,
            instances=str(rows),
            instance_format="swebench5",
            sandbox="container",
        )
        assert shown[0]["content"].startswith("/testbed\n"), shown
        assert reward == expected, (name, info["grading_reason"])
        _, native, _ = await episode(command, instance_id, sandbox="container")
        assert native == reward, name
        assert (info["patch_bytes"] > 0) == (name != "none")


async def test_the_prompt_names_the_image_repository(rows):
    env = gymnasium.make(
        "agentrl/SWE-v0",
        instances=str(rows),
        instance_format="swebench5",
        instance_ids=[ONE_PER_PROJECT[0]],
        tool_set="str_replace_editor",
    )
    try:
        messages, _ = await env.areset(seed=0)
    finally:
        await env.aclose()
    assert "/testbed" in messages[0]["content"] and "/work/repo" not in messages[0]["content"]
    assert "checked out in /testbed" in messages[1]["content"]


def test_bwrap_cannot_run_an_image(rows):
    with pytest.raises(HarnessError, match="only sandbox='container'"):
        gymnasium.make(
            "agentrl/SWE-v0", instances=str(rows), instance_format="swebench5", sandbox="bwrap"
        )


def test_a_missing_image_is_refused_with_the_command_that_makes_it(rows, tmp_path):
    row = json.loads(rows.read_text().splitlines()[0])
    image = "localhost/sweb.eval.x86_64.nonexistent:latest"
    path = tmp_path / "missing.jsonl"
    path.write_text(json.dumps(row | {"image": image}) + "\n")
    with pytest.raises(HarnessError, match=f"{image} \\(`podman pull {image}`\\)"):
        gymnasium.make("agentrl/SWE-v0", instances=str(path), instance_format="swebench5")


def test_a_row_without_an_eval_script_is_refused(rows, tmp_path):
    """A SWE-bench row as published (without SWE-bench 5's columns) is refused, naming the
    script that adds the eval script swebench 4.1 writes."""
    five = {"image", "eval_script", "log_parser", "eval_type", "image_assets"}
    lines = rows.read_text().splitlines()
    published = [{k: v for k, v in json.loads(line).items() if k not in five} for line in lines]
    path = tmp_path / "swebench.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in published))
    message = "not runnable yet: the row has no eval_script.*scripts/swebench4-eval-scripts"
    with pytest.raises(HarnessError, match=message):
        gymnasium.make("agentrl/SWE-v0", instances=str(path), instance_format="swebench")


def test_a_swe_gym_row_is_refused_naming_swe_gyms_fork(rows, tmp_path):
    """SWE-Gym's rows (SWE-bench's columns without environment_setup_commit) load, and are
    refused at construction: their eval scripts exist only in SWE-Gym's fork of SWE-bench."""
    five = {"image", "eval_script", "log_parser", "eval_type", "image_assets"}
    row = {k: v for k, v in json.loads(rows.read_text().splitlines()[0]).items() if k not in five}
    del row["environment_setup_commit"]
    path = tmp_path / "swe-gym.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(HarnessError, match=r"SWE-Gym's fork of SWE-bench .* not on PyPI"):
        gymnasium.make("agentrl/SWE-v0", instances=str(path), instance_format="swe-gym")
