"""Grading shipped instances in real sandboxes (both backends): honest patches score 1, every class
of attack scores 0, SWE-bench's own grading of the same test run agrees except where SWE-v0 is
stricter by design, a sandbox lost or killed at any grading step is blamed where it belongs, and
the sandbox's git holds no fix."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shlex
from pathlib import Path
from typing import Any

import docker
import pytest
import swe_adversarial as adversarial
from swebench.harness.constants import EvalType, ResolvedStatus
from swebench.harness.grading import get_eval_tests_report, get_logs_eval, get_resolution_status
from swebench.types import TestSpec as SWEBenchSpec

from agentrl.envs.swe import load_instances, tree_guard
from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.grading import SWEGrade, grade, graded_files, runner_command
from agentrl.envs.swe.projects import Project, load_projects, project_of
from agentrl.envs.swe.workspace import REPO_DIR, BaseTrees, checkout
from agentrl.tools import SandboxLimits, sandbox_factory

pytestmark = pytest.mark.slow

INSTANCES = load_instances(SHIPPED_INSTANCES)
BY_ID = {instance.instance_id: instance for instance in INSTANCES}
PROJECTS = load_projects()
LIMITS = SandboxLimits(memory_mb=1024, pids=256, disk_mb=512)
TREES = BaseTrees()
BACKENDS = ("container", "bwrap")
# Every attack on one instance per project (three layouts: tests in a package, in a directory, at
# the root) on the faster backend, and on the instance in its image too.
# AGENTRL_SWE_ATTACKS=all runs every attack on every shipped instance and both backends instead
# (about 1,600 gradings; docs/performance.md has the last such run and its time).
CLASS_RUNS = (
    tuple((instance.instance_id, backend) for instance in INSTANCES for backend in BACKENDS)
    if os.environ.get("AGENTRL_SWE_ATTACKS") == "all"
    else (
        ("toolz__1.2.0-5", "container"),
        ("toolz__1.2.0-5", "bwrap"),
        ("tabulate__0.10.0-2", "bwrap"),
        ("inflection__0.5.1-1", "bwrap"),
    )
)
# Every instance: the gold patch in its image (container), and on the faster backend the honest
# patches and the first attack of the issue that found the holes. An attack's outcome depends on the
# project's layout and the backend, not on the instance: the class test covers every attack on
# each layout and backend.
EVERY_INSTANCE = {
    "container": {"gold": True},
    "bwrap": {
        "gold": True,
        "empty": False,
        "gold_and_reproduction_test": True,
        "shadow_pytest_module": False,
    },
}
STRICTER_BY_DESIGN = ("ended without its report", "changed while the tests ran")
"""Reasons for a 0 where SWE-bench's grading of the same output says resolved (named in
docs/swe_tasks.md): printed PASSED lines without the plugin's report, tests rewritten at run time."""


def blob_sha(text: str) -> str:
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def factory(project: Project, backend: str):
    return sandbox_factory(backend, LIMITS, image=project.image)


async def grade_patch(instance, patch: str, backend: str = "container", sandboxes=None):
    project = project_of(instance, PROJECTS)
    return await grade(
        instance,
        patch,
        sandboxes=sandboxes or factory(project, backend),
        archive=TREES.archive(instance, project.sdist),
        test_command=project.spec.test_command,
        test_env=project.spec.test_env,
        timeout=300,
    )


def swebench_resolved(instance, result: SWEGrade, log_file: Path) -> bool:
    """SWE-bench's own verdict (``get_logs_eval``, ``get_resolution_status``) on the test run's
    output as its harness would have logged it. Test ids are given as SWE-bench's datasets hold
    them: cut at the first space (its pytest log parser reads a line's words), e.g.
    ``test_titleize[active_record-Active``."""
    spec = SWEBenchSpec(
        instance_id=instance.instance_id,
        image="",
        eval_script_list=[],
        repo=instance.repo,
        version=instance.version,
        FAIL_TO_PASS=[test.split()[0] for test in instance.FAIL_TO_PASS],
        PASS_TO_PASS=[test.split()[0] for test in instance.PASS_TO_PASS],
        log_parser="parse_log_pytest",
        eval_type=EvalType.PASS_AND_FAIL.value,
    )
    log_file.write_text(result.swebench_log())
    status, found = get_logs_eval(spec, str(log_file))
    if not found:
        return False
    gold = {"FAIL_TO_PASS": spec.FAIL_TO_PASS, "PASS_TO_PASS": spec.PASS_TO_PASS}
    report = get_eval_tests_report(status, gold)
    return get_resolution_status(report) == ResolvedStatus.FULL.value


async def judge(instance, name: str, patch: str, expected: bool, backend: str, tmp_path: Path):
    """Grade ``patch``; what is wrong with the verdict (an empty list when nothing is)."""
    result = await grade_patch(instance, patch, backend)
    where = f"{instance.instance_id} {backend} {name}"
    if result.infra_error is not None or result.resolved != expected:
        return [f"{where}: {result} {result.log_tail[-600:]}"]
    if "does not apply" in result.reason:  # a 0 that proves nothing about the attack
        return [f"{where}: the attack's patch does not apply"]
    log_file = tmp_path / f"{instance.instance_id}-{backend}-{name}.log"
    theirs = swebench_resolved(instance, result, log_file)
    if theirs != result.resolved and not any(r in result.reason for r in STRICTER_BY_DESIGN):
        return [f"{where}: SWE-bench says resolved={theirs}, SWE-v0 {result}"]
    return []


def build(name: str, instance, tree: Path) -> str:
    if name == "empty":
        return ""
    return {**adversarial.ATTACKS, **adversarial.HONEST}[name](instance, tree)


async def gather_gated(calls) -> list[str]:
    gate = asyncio.Semaphore(2)

    async def one(call):
        async with gate:
            return await call

    return [problem for found in await asyncio.gather(*map(one, calls)) for problem in found]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("project", sorted({p.spec.name for p in PROJECTS.values()}))
async def test_every_shipped_instance_scores_only_its_fix(project, backend, tmp_path):
    chosen = [i for i in INSTANCES if project_of(i, PROJECTS).spec.name == project]
    assert chosen
    calls = []
    for instance in chosen:
        sdist = project_of(instance, PROJECTS).sdist
        tree = adversarial.base_tree(instance, sdist, tmp_path / instance.instance_id)
        for name, expected in EVERY_INSTANCE[backend].items():
            patch = build(name, instance, tree)
            calls.append(judge(instance, name, patch, expected, backend, tmp_path))
    problems = await gather_gated(calls)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("instance_id", "backend"), CLASS_RUNS)
async def test_every_attack_class_scores_zero_and_honest_patches_one(
    instance_id, backend, tmp_path
):
    instance = BY_ID[instance_id]
    tree = adversarial.base_tree(instance, project_of(instance, PROJECTS).sdist, tmp_path / "tree")
    patches = {name: (build(name, instance, tree), False) for name in adversarial.ATTACKS}
    patches |= {name: (build(name, instance, tree), True) for name in adversarial.HONEST}
    calls = [
        judge(instance, name, patch, expected, backend, tmp_path)
        for name, (patch, expected) in patches.items()
    ]
    problems = await gather_gated(calls)
    assert not problems, "\n".join(problems)


async def test_the_sandbox_git_holds_no_fix(tmp_path):
    problems = []
    for instance in INSTANCES:
        project = project_of(instance, PROJECTS)
        tree = adversarial.base_tree(instance, project.sdist, tmp_path / instance.instance_id)
        problems += await check_git_holds_no_fix(instance, project, tree, tmp_path)
    assert not problems, "\n".join(problems)


async def check_git_holds_no_fix(
    instance, project: Project, tree: Path, tmp_path: Path
) -> list[str]:
    """The sandbox's repository: one commit, one ref, and no object with the fixed source."""
    scratch = tmp_path / f"{instance.instance_id}-fix"
    scratch.mkdir()
    fixed = blob_sha(adversarial.fixed_source(instance, tree, scratch))
    async with await factory(project, "container")() as sandbox:
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


class FaultAt:
    """A grading sandbox factory whose sandbox, before its ``at``-th call (exec, write_file,
    read_file), is really removed (``lost``: the engine no longer has it, which
    :class:`~agentrl.tools.SandboxLost` reports) or killed (``killed``: the container stops, a
    :class:`~agentrl.tools.SandboxCrashed`). ``at=None`` only records the calls."""

    def __init__(self, project: Project, at: int | None = None, fault: str = "lost"):
        self.inner = factory(project, "container")
        self.at, self.fault, self.calls = at, fault, []

    async def __call__(self):
        sandbox = await self.inner()
        container = docker.from_env().containers.get(sandbox.container_id)
        for op in ("exec", "write_file", "read_file"):
            setattr(sandbox, op, self._wrap(getattr(sandbox, op), op, container))
        return sandbox

    def _wrap(self, call, op: str, container):
        async def wrapped(*args: Any, **kwargs: Any):
            self.calls.append((op, args[0] if args else None))
            if len(self.calls) - 1 == self.at:
                if self.fault == "lost":
                    await asyncio.to_thread(container.remove, force=True)
                else:
                    await asyncio.to_thread(container.kill)
            return await call(*args, **kwargs)

        return wrapped


async def test_a_sandbox_lost_or_killed_at_any_grading_step_is_blamed_where_it_belongs():
    """Lost (its host lost it) at any step: an infrastructure fault. Killed: an infrastructure
    fault before the patch is in the sandbox; counted against the patch from then on, since the
    patch's code (a fork bomb, memory exhaustion) can kill a sandbox."""
    instance = BY_ID["toolz__1.2.0-5"]
    project = project_of(instance, PROJECTS)
    recorder = FaultAt(project)
    assert (await grade_patch(instance, instance.patch, sandboxes=recorder)).resolved
    steps = recorder.calls
    patch_step = next(
        i for i, (op, path) in enumerate(steps) if op == "write_file" and "model.patch" in path
    )
    problems = []
    for at in range(len(steps)):
        lost = await grade_patch(instance, instance.patch, sandboxes=FaultAt(project, at))
        if lost.infra_error is None:
            problems.append(f"lost before call {at} {steps[at]}: {lost}")
    for at in (0, patch_step - 1, patch_step, len(steps) - 3):
        killed = await grade_patch(instance, instance.patch, sandboxes=FaultAt(project, at, "kill"))
        blamed_on_infra = at < patch_step
        if (killed.infra_error is not None) != blamed_on_infra or killed.resolved:
            problems.append(f"killed before call {at} {steps[at]}: {killed}")
    assert not problems, "\n".join(problems)


def test_graded_files_are_the_tests_their_neighbours_and_what_test_patch_touches():
    instance = BY_ID["tabulate__0.10.0-2"]
    base = {"test/common.py", "test/test_api.py", "tabulate/__init__.py", "README.md"}
    graded = graded_files(instance, base)
    assert {"test/common.py", "test/test_api.py", "test/test_internal.py"} <= graded
    assert "tabulate/__init__.py" not in graded and "README.md" not in graded
    root = BY_ID["inflection__0.5.1-1"]  # tests at the root: their neighbours are the source
    assert graded_files(root, {"inflection/__init__.py", "setup.py"}) == {"test_inflection.py"}


def test_the_runner_command_is_pytest_or_a_clear_error():
    assert runner_command("python3 -m pytest -q -rA") == ("python3", ["-q", "-rA"])
    assert runner_command("/usr/bin/pytest -x") == ("python3", ["-x"])
    with pytest.raises(ValueError, match="grades with pytest"):
        runner_command("tox -e py311")


def test_tree_guard_puts_back_what_the_grade_depends_on(tmp_path):
    repo, store = tmp_path / "repo", str(tmp_path / "store")
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_a.py").write_text("assert 1\n")
    (repo / "tests" / "conftest.py").write_text("# base\n")
    (repo / "src.py").write_text("x = 1\n")
    tree_guard.save(str(repo), store, ["tests/test_a.py", "tests/test_hidden.py"])
    (repo / "tests" / "test_a.py").write_text("assert True or 0\n")  # weakened
    (repo / "tests" / "test_hidden.py").write_text("def test(): pass\n")  # re-created
    (repo / "tests" / "conftest.py").write_text("# hooked\n")
    (repo / "sub").mkdir()
    (repo / "sub" / "conftest.py").write_text("# new\n")
    (repo / "src.py").write_text("x = 2\n")  # the fix: kept
    result = tree_guard.restore(str(repo), store)
    assert result == {
        "restored": [
            "sub/conftest.py",
            "tests/conftest.py",
            "tests/test_a.py",
            "tests/test_hidden.py",
        ]
    }
    assert (repo / "tests" / "test_a.py").read_text() == "assert 1\n"
    assert (repo / "tests" / "conftest.py").read_text() == "# base\n"
    assert not (repo / "tests" / "test_hidden.py").exists()
    assert not (repo / "sub" / "conftest.py").exists()
    assert (repo / "src.py").read_text() == "x = 2\n"


@pytest.mark.parametrize("shape", ["link", "git", "directory_replaced"])
def test_tree_guard_refuses_links_git_entries_and_replaced_directories(tmp_path, shape):
    repo, store = tmp_path / "repo", str(tmp_path / "store")
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_a.py").write_text("assert 1\n")
    tree_guard.save(str(repo), store, ["tests/test_a.py"])
    if shape == "link":
        (repo / "elsewhere.py").symlink_to("/etc/hostname")
    elif shape == "git":
        (repo / "tests" / ".git").write_text("gitdir: /tmp\n")
    else:
        (repo / "tests" / "test_a.py").unlink()
        (repo / "tests").rmdir()
        (repo / "tests").write_text("a file where the directory was\n")
    assert "refused" in tree_guard.restore(str(repo), store)


async def test_a_patch_that_does_not_apply_scores_zero():
    instance = INSTANCES[0]
    broken = adversarial.diff("inflection/absent.py", "a = 1\n", "a = 2\n")  # no such file
    result = await grade_patch(instance, broken)
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
    huge = adversarial.diff("big.txt", None, "x\n" * 600_000)
    result = await grade_patch(instance, huge)
    assert not result.resolved and "larger than" in result.reason and result.infra_error is None
