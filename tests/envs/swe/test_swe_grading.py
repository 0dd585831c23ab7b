"""Grading every shipped instance in real containers: the gold patch scores 1; the empty patch,
faked test output, edited tests and a runner hook score 0; the sandbox's git holds no fix."""

from __future__ import annotations

import asyncio
import hashlib
import shlex
from pathlib import Path

import pytest
import swe_adversarial as adversarial

from agentrl.envs.swe import load_instances
from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.grading import grade, protected_paths, touched_protected
from agentrl.envs.swe.projects import Project, load_projects, project_of
from agentrl.envs.swe.workspace import REPO_DIR, BaseTrees, checkout
from agentrl.tools import SandboxLimits, sandbox_factory

pytestmark = pytest.mark.slow

INSTANCES = load_instances(SHIPPED_INSTANCES)
PROJECTS = load_projects()
LIMITS = SandboxLimits(memory_mb=1024, pids=256, disk_mb=512)
TREES = BaseTrees()


def blob_sha(text: str) -> str:
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


async def grade_patch(instance, project: Project, patch: str):
    return await grade(
        instance,
        patch,
        sandboxes=sandbox_factory("container", LIMITS, image=project.image),
        archive=TREES.archive(instance, project.sdist),
        test_command=project.spec.test_command,
        test_env=project.spec.test_env,
        timeout=300,
    )


async def check_instance(instance, tmp_path: Path) -> list[str]:
    """Every way of scoring, for one instance; returns what went wrong."""
    project = project_of(instance, PROJECTS)
    tree = adversarial.base_tree(instance, project.sdist, tmp_path / instance.instance_id)
    problems = []
    expected = {
        "gold": (instance.patch, True, ""),
        "empty": ("", False, "did not pass"),
        "fake_output": (adversarial.fake_output(instance, tree), False, "without its report"),
        "rewrite_tests": (
            adversarial.rewrite_tests_at_run_time(instance, tree),
            False,
            "changed while the tests ran",
        ),
        "edit_tests": (adversarial.edit_tests(instance, tree), False, "changes test or runner"),
        "conftest": (adversarial.conftest_hook(instance, tree), False, "changes test or runner"),
    }
    for name, (patch, resolved, reason) in expected.items():
        result = await grade_patch(instance, project, patch)
        if (
            result.infra_error is not None
            or result.resolved != resolved
            or reason not in result.reason
        ):
            problems.append(f"{instance.instance_id} {name}: {result} {result.log_tail[-600:]}")
        if name == "gold" and result.fail_to_pass != (len(instance.FAIL_TO_PASS),) * 2:
            problems.append(f"{instance.instance_id} gold counts: {result.fail_to_pass}")
    problems += await check_git_holds_no_fix(instance, project, tree, tmp_path)
    return problems


async def check_git_holds_no_fix(
    instance, project: Project, tree: Path, tmp_path: Path
) -> list[str]:
    """The sandbox's repository: one commit, one ref, and no object with the fixed source."""
    scratch = tmp_path / f"{instance.instance_id}-fix"
    scratch.mkdir()
    fixed = blob_sha(adversarial.fixed_source(instance, tree, scratch))
    async with await sandbox_factory("container", LIMITS, image=project.image)() as sandbox:
        await checkout(sandbox, instance, TREES.archive(instance, project.sdist))
        script = (
            f"cd {REPO_DIR} && git rev-list --all --reflog | wc -l && git for-each-ref | wc -l "
            "&& git stash list | wc -l && git cat-file --batch-all-objects --batch-check='%(objectname)'"
            f" && git show {shlex.quote(instance.environment_setup_commit or 'HEAD~1')} 2>&1 | head -1"
        )
        result = await sandbox.exec(["sh", "-c", script], timeout=60)
    lines = result.stdout.splitlines()
    problems = []
    if lines[:3] != ["1", "1", "0"]:
        problems.append(f"{instance.instance_id}: commits/refs/stashes {lines[:3]}")
    if fixed in lines[3:]:
        problems.append(f"{instance.instance_id}: the fixed source is an object in the sandbox")
    if "fatal: bad object" not in lines[-1]:
        problems.append(
            f"{instance.instance_id}: environment_setup_commit is readable: {lines[-1]}"
        )
    return problems


@pytest.mark.parametrize("project", sorted({p.spec.name for p in PROJECTS.values()}))
async def test_every_shipped_instance_scores_only_its_fix(project, tmp_path):
    chosen = [i for i in INSTANCES if project_of(i, PROJECTS).spec.name == project]
    assert chosen
    gate = asyncio.Semaphore(2)

    async def one(instance):
        async with gate:
            return await check_instance(instance, tmp_path)

    problems = [p for found in await asyncio.gather(*map(one, chosen)) for p in found]
    assert not problems, "\n".join(problems)


def test_protected_files_are_the_tests_and_the_runner_configuration():
    instance = next(i for i in INSTANCES if i.instance_id == "toolz__1.2.0-2")
    protected = protected_paths(instance)
    assert {"toolz/tests/test_inspect_args.py", "toolz/tests/test_signatures.py"} <= protected
    assert "toolz/tests/test_curried.py" in protected  # holds PASS_TO_PASS tests
    assert touched_protected(instance.patch, instance) == []
    for path in ("conftest.py", "toolz/conftest.py", "setup.cfg", "pyproject.toml", "x.pth"):
        patch = adversarial.diff(path, None, "x = 1\n")
        assert touched_protected(patch, instance) == [path]
    renamed = "diff --git a/toolz/tests/test_curried.py b/toolz/other.py\nrename from x\n"
    assert touched_protected(renamed, instance) == ["toolz/tests/test_curried.py"]


async def test_a_patch_that_does_not_apply_scores_zero():
    instance = INSTANCES[0]
    project = project_of(instance, PROJECTS)
    broken = adversarial.diff("inflection/absent.py", "a = 1\n", "a = 2\n")  # no such file
    result = await grade_patch(instance, project, broken)
    assert not result.resolved and result.infra_error is None
    assert result.reason == "the patch does not apply to base_commit"


async def test_no_grading_sandbox_is_an_infrastructure_error():
    instance = INSTANCES[0]
    project = project_of(instance, PROJECTS)
    result = await grade(
        instance,
        instance.patch,
        sandboxes=sandbox_factory("container", LIMITS, image="localhost/agentrl-absent:none"),
        archive=TREES.archive(instance, project.sdist),
        test_command=project.spec.test_command,
        test_env=project.spec.test_env,
    )
    assert not result.resolved
    assert result.infra_error is not None and "not found" in result.infra_error


async def test_an_oversized_patch_scores_zero_without_a_sandbox():
    instance = INSTANCES[0]
    project = project_of(instance, PROJECTS)
    huge = adversarial.diff("big.txt", None, "x\n" * 600_000)
    result = await grade_patch(instance, project, huge)
    assert not result.resolved and "larger than" in result.reason and result.infra_error is None
