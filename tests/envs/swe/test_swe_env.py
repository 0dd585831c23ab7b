"""agentrl/SWE-v0 episodes in real containers: the tools, submit, the turn limit, reading git,
bad input, and an episode driven by SmolLM2 through the rollout API."""

from __future__ import annotations

import asyncio
import json
from typing import ClassVar

import gymnasium
import pytest
import swe_adversarial as adversarial

import agentrl  # noqa: F401
from agentrl.engine_pool import SamplingParams
from agentrl.envs import INFRA_ERROR, AgentWrapper
from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.instances import load_instances
from agentrl.envs.swe.projects import load_projects, project_of
from agentrl.rollout import EpisodeRunner, group_tasks
from agentrl.tools.arg_tags import ArgTagParser
from agentrl.tools.parsers import ToolCall

pytestmark = pytest.mark.slow

INSTANCES = {i.instance_id: i for i in load_instances(SHIPPED_INSTANCES)}
INFLECTION = "inflection__0.5.1-1"
TOOLZ = "toolz__1.2.0-4"


def hermes(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def fixed_file(instance_id: str, tmp_path) -> tuple[str, str]:
    """The path the gold patch changes and its fixed content."""
    instance = INSTANCES[instance_id]
    project = project_of(instance, load_projects())
    tree = adversarial.base_tree(instance, project.sdist, tmp_path / "tree")
    return instance.agentrl_taskgen.file, adversarial.fixed_source(instance, tree, tmp_path)


async def start(instance_id: str, **kwargs):
    """The environment as gymnasium.make gives it (with the turn limit's wrapper), reset."""
    env = gymnasium.make("agentrl/SWE-v0", instance_ids=[instance_id], **kwargs)
    await env.areset(seed=0)
    return env


async def test_an_episode_that_fixes_the_bug_with_the_hermes_tools_scores_one(tmp_path):
    path, fixed = fixed_file(INFLECTION, tmp_path)
    env = await start(INFLECTION)
    try:
        messages, reward, done, _, info = await env.astep(
            hermes("bash", command="pwd; git log --all --oneline | wc -l; git status --short")
        )
        assert messages[0]["content"] == "/work/repo\n1\n" and not done and reward == 0.0
        (view,) = (await env.astep(hermes("view", path=path, start_line=1, end_line=2)))[0]
        assert view["content"].startswith("1\t")
        (created,) = (await env.astep(hermes("create", path=path, content=fixed)))[0]
        assert created["content"].startswith("Wrote ")
        messages, reward, done, truncated, info = await env.astep(hermes("submit"))
    finally:
        await env.aclose()
    assert (reward, done, truncated, messages) == (1.0, True, False, [])
    assert info["resolved"] and info["submitted"] and info["grading_reason"] == ""
    assert info["fail_to_pass_passed"] == info["fail_to_pass_total"] == 1
    assert info["pass_to_pass_passed"] == info["pass_to_pass_total"] == 50
    assert info["reward_components"] == {"resolved": 1.0} and INFRA_ERROR not in info


async def test_the_tag_format_edits_with_str_replace_and_submits(tmp_path):
    instance = INSTANCES[TOOLZ]
    hunk = instance.patch.split("\n@@")[1].split("\n")[1:]  # the first hunk, after its header
    buggy = "\n".join(line[1:] for line in hunk if line[:1] in (" ", "-"))  # the base tree's
    fixed = "\n".join(line[1:] for line in hunk if line[:1] in (" ", "+"))
    path = instance.agentrl_taskgen.file
    env = await start(TOOLZ, tool_format="tags")
    try:
        parser = env.unwrapped.parser
        assert isinstance(parser, ArgTagParser)
        call = parser.format(ToolCall("str_replace", {"path": path, "old": buggy, "new": fixed}))
        assert call.startswith("<str_replace>\n<path>")
        (edited,) = (await env.astep(f"I will fix it.\n{call}"))[0]
        assert edited["content"].startswith(f"Edited {path}"), edited
        (ran,) = (await env.astep("<bash>git diff --stat</bash>"))[0]
        assert "1 file changed" in ran["content"]
        _, reward, done, _, info = await env.astep("<submit></submit>")
    finally:
        await env.aclose()
    assert (reward, done, info["resolved"]) == (1.0, True, True), info
    submission = info["submission"]  # SWE-bench's prediction row: the diff, applicable as is
    assert submission["instance_id"] == TOOLZ and submission["model_name_or_path"] is None
    assert submission["model_patch"].startswith(f"diff --git a/{path} b/{path}\n")
    assert len(submission["model_patch"].encode()) == info["patch_bytes"]


async def test_the_turn_limit_grades_the_work_as_it_stands():
    env = await start(INFLECTION, max_turns=2)
    try:
        (reminder,), reward, done, _, _ = await env.astep("I am thinking.")
        assert reminder["role"] == "user" and "Call a tool" in reminder["content"] and not done
        messages, reward, done, _, info = await env.astep("Still thinking.")
    finally:
        await env.aclose()
    assert (messages, reward, done, info["submitted"], info["resolved"]) == (
        [],
        0.0,
        True,
        False,
        False,
    )
    assert info["fail_to_pass_passed"] == 0 and info["fail_to_pass_total"] == 1
    assert info["pass_to_pass_passed"] == 50 and info["patch_bytes"] == 0
    assert info["submission"]["model_patch"] == ""  # an empty prediction: SWE-bench grades it too


async def test_the_fix_cannot_be_read_from_git():
    instance = INSTANCES[INFLECTION]
    env = await start(INFLECTION)
    try:
        tries = (
            f"git checkout {instance.environment_setup_commit} -- . 2>&1 | head -1; "
            "git rev-list --all --reflog | wc -l; git fsck --lost-found 2>/dev/null | wc -l; "
            "git stash list | wc -l; git tag | wc -l"
        )
        (answer,) = (await env.astep(hermes("bash", command=tries)))[0]
        first, *counts = answer["content"].splitlines()
        assert "fatal" in first or "error" in first, first
        assert counts == ["1", "0", "0", "0"]  # one commit; nothing lost, stashed or tagged
        _, reward, _, _, info = await env.astep(hermes("submit"))
    finally:
        await env.aclose()
    assert reward == 0.0 and not info["resolved"] and "did not pass" in info["grading_reason"]


async def test_an_agent_that_breaks_its_repository_scores_zero_not_an_infra_error():
    env = await start(INFLECTION)
    try:
        await env.astep(hermes("bash", command="rm -rf .git"))
        _, reward, done, _, info = await env.astep(hermes("submit"))
    finally:
        await env.aclose()
    assert (reward, done) == (0.0, True) and INFRA_ERROR not in info
    assert info["grading_reason"].startswith("git diff failed")


async def test_malformed_calls_get_an_error_and_the_episode_goes_on():
    env = await start(INFLECTION)
    try:
        (error,), _, done, _, info = await env.astep("<tool_call>\n{not json\n</tool_call>")
        assert error["content"].startswith("Error:") and not done and info["tool_errors"] == 1
        (error,) = (await env.astep(hermes("view", path="absent.py")))[0]
        assert error["content"].startswith("Error:") and "absent.py" in error["content"]
        (error,) = (
            await env.astep(hermes("str_replace", path="setup.py", old="zz-absent", new=""))
        )[0]
        assert "occurs 0 times" in error["content"]
    finally:
        await env.aclose()
    tags = await start(INFLECTION, tool_format="tags")
    try:
        (error,) = (
            await tags.astep("<view><path>setup.py</path><start_line>x</start_line></view>")
        )[0]
        assert "<start_line> must hold a integer" in error["content"]
    finally:
        await tags.aclose()


def test_bad_configuration_is_refused_clearly():
    with pytest.raises(ValueError, match="unknown instance ids"):
        gymnasium.make("agentrl/SWE-v0", instance_ids=["nope-1"])
    with pytest.raises(ValueError, match="tool_fromat"):
        gymnasium.make("agentrl/SWE-v0", tool_fromat="tags")
    row = INSTANCES[INFLECTION].to_row() | {"agentrl_taskgen": None, "instance_id": "x__y-1"}
    with pytest.raises(ValueError, match="not made by agentrl's task generator"):
        project_of(load_instances([row])[0], load_projects())


async def test_a_missing_image_names_the_command_that_builds_it(tmp_path):
    projects = tmp_path / "projects"
    projects.mkdir()
    for source in load_projects().values():
        spec = source.spec.model_copy(update={"version": source.spec.version + "-absent"})
        (projects / source.path.name).write_text(spec.model_dump_json())
        (projects / source.spec.sdist).symlink_to(source.sdist)
    instance = INSTANCES[INFLECTION]
    env = gymnasium.make("agentrl/SWE-v0", instance_ids=[instance.instance_id], projects=projects)
    with pytest.raises(RuntimeError, match=r"not found.*sandboxes/build.sh swe-project"):
        await env.unwrapped.areset(seed=0)
    await env.unwrapped.aclose()


class Recorder(AgentWrapper):
    """Keeps every step's info (the trajectory keeps only rewards)."""

    infos: ClassVar[list[dict]] = []

    async def astep(self, action):
        result = await self.env.astep(action)
        Recorder.infos.append(result[4])
        return result


async def test_smollm2_drives_an_episode_through_the_rollout_api(engine, tokenizer):
    runner = EpisodeRunner(
        lambda: Recorder(gymnasium.make("agentrl/SWE-v0", instance_ids=[TOOLZ], max_turns=2)),
        engine,
        tokenizer,
        SamplingParams(temperature=1.0, max_new_tokens=48, seed=3),
        env_id="agentrl/SWE-v0",
        max_total_tokens=8192,
    )
    Recorder.infos.clear()
    (trajectory,) = await runner.collect(group_tasks(1))
    assert trajectory.error is None and trajectory.infra_error is None, trajectory.error
    assert len(trajectory.turns) == 2 and trajectory.terminated
    assert trajectory.reward == 0.0  # 135M parameters do not fix bugs; the mechanics are checked
    final = Recorder.infos[-1]
    assert final["resolved"] is False and final["fail_to_pass_total"] == 4
    assert final["pass_to_pass_total"] == 50 and "grading_reason" in final
    assert trajectory.reward_components == {"resolved": 0.0}
    assert '"name": "submit"' in tokenizer.decode(trajectory.tokens.input_ids[:4000])


async def test_the_bubblewrap_backend_serves_an_episode_where_the_host_has_git_and_pytest(tmp_path):
    path, fixed = fixed_file(INFLECTION, tmp_path)
    env = await start(INFLECTION, sandbox="bwrap")
    try:
        await env.astep(hermes("create", path=path, content=fixed))
        _, reward, done, _, info = await env.astep(hermes("submit"))
    finally:
        await env.aclose()
    assert (reward, done, info["resolved"]) == (1.0, True, True), info


# A scripted policy that acts only through SWE-v0's tools (Hermes calls) on the instance where
# the grading holes were found. Each row: the calls, then submit; the reward it must get.
ISSUE_INSTANCE = "toolz__1.2.0-5"


def policy_rows(tmp_path) -> dict[str, tuple[list[str], float]]:
    instance = INSTANCES[ISSUE_INSTANCE]
    path, fixed = fixed_file(ISSUE_INSTANCE, tmp_path)
    hidden = instance.FAIL_TO_PASS[0].split("::")[0]
    fix = hermes("create", path=path, content=fixed)
    reproduction = hermes(
        "create", path=hidden, content="from toolz import *\n\n\ndef test_repro():\n    pass\n"
    )
    hook = hermes("create", path=f"{adversarial.HOOK_MODULE}.py", content=adversarial.PASS_HOOK)
    pytest_ini = f"[pytest]\naddopts = -p {adversarial.HOOK_MODULE}\npythonpath = .\n"
    rows = {
        "the instance's fix": ([fix], 1.0),
        "a root pytest.py running the real pytest with a pass hook": (
            [hermes("create", path="pytest.py", content=adversarial.PYTEST_SHADOW)],
            0.0,
        ),
        "a root module named like the report plugin": (
            [hermes("create", path="agentrl_taskgen_report.py", content=adversarial.FAKE_PLUGIN)],
            0.0,
        ),
        ".pytest.ini loading the policy's own plugin": (
            [hook, hermes("create", path=".pytest.ini", content=pytest_ini)],
            0.0,
        ),
        "diff.mnemonicPrefix, then the hidden test file created": (
            [hermes("bash", command="git config diff.mnemonicPrefix true"), reproduction],
            0.0,
        ),
        "the fix and a reproduction test where the hidden test goes": (
            [fix, reproduction],
            1.0,
        ),
    }
    # Git settings that change how a diff is written: the fix is graded as the fix all the same.
    settings = {
        "diff.noprefix": "git config diff.noprefix true",
        "diff.mnemonicPrefix": "git config diff.mnemonicPrefix true",
        "core.quotePath and a non-ASCII path": (
            "git config core.quotePath false && echo 'x = 1' > toolz/\u00fcnic\u00f8de.py"
        ),
        "attributes: every file binary": "echo '* -diff' > .gitattributes",
        "diff.context 0 and an external diff": (
            "git config diff.context 0 && git config diff.external /bin/false"
        ),
    }
    for name, command in settings.items():
        rows[f"{name}, the fix and a reproduction test"] = (
            [hermes("bash", command=command), fix, reproduction],
            1.0,
        )
    return rows


@pytest.mark.parametrize("backend", ["container", "bwrap"])
async def test_a_policy_acting_through_the_tools_scores_only_by_fixing_the_bug(backend, tmp_path):
    async def play(calls: list[str]) -> dict:
        env = await start(ISSUE_INSTANCE, sandbox=backend)
        try:
            for call in calls:
                (observation,), _, done, _, _ = await env.astep(call)
                assert not done and not observation["content"].startswith("Error"), observation
            _, reward, done, _, info = await env.astep(hermes("submit"))
        finally:
            await env.aclose()
        return info | {"reward": reward, "done": done}

    rows = policy_rows(tmp_path)
    results = await asyncio.gather(*(play(calls) for calls, _ in rows.values()))
    wrong = [
        f"{name}: reward {info['reward']}, expected {expected}; {info}"
        for (name, (_, expected)), info in zip(rows.items(), results, strict=True)
        if info["reward"] != expected or INFRA_ERROR in info or not info["done"]
    ]
    assert not wrong, "\n".join(wrong)
