"""SWE instances on their benchmark's own image, graded as SWE-bench's harness grades them.

An instance read from a benchmark's rows (:mod:`agentrl.envs.swe.row_formats`: ``harness`` is set)
runs here instead of on a tree rebuilt from an sdist. Runnable today: rows with an
``eval_script`` (SWE-bench 5; SWE-bench and Verified rows once ``scripts/swebench4-eval-scripts``
has added swebench 4.1's; SWE-smith rows once ``scripts/swesmith-eval-scripts`` has added their
profile's) and R2E-Gym rows (their test script is in their image; set up and graded by R2E-Gym's
rules, :mod:`agentrl.envs.swe.r2e_grading`), on the container backend, whose image is on the
engine (:func:`check_rows` and :func:`check_images`, at load). SWE-Gym rows load but do not run:
their eval scripts come from SWE-Gym's fork of SWE-bench, which is not installable here.

**The episode.** The agent's sandbox is a :class:`~agentrl.tools.container.ContainerSandbox` of
``harness.image`` (read-only root, uid 65534, no network, seccomp: nothing of its isolation
changes) with one more tmpfs, at ``harness.repo_dir`` (``/testbed``): the sandbox user cannot
write the image's root-owned files, so the host copies the image's ``repo_dir`` out of a
never-started container of the image (``get_archive``, once per image) and the sandbox unpacks it
into that tmpfs, owned by the sandbox user, at the same path (an editable install pointing there
still finds it). ``base_patch`` (SWE-smith's bug) is applied when set, the ``hidden_tests``
removed (SWE-smith's "Remove F2P Tests" commit), and the tree committed as the root of a new
history: the image's history holds the tree before the bug, that is the fix, so the agent does
not get it. The diff at submit is taken against that commit, as today. The environment the
harness tests in is entered by what of the row's ``eval_script`` activates one (``source
.../activate``, ``conda activate ...``: its lines before the tests, then the leading statements
of its test command, as SWE-smith's profiles write them), given to every ``bash`` the tools start
through ``BASH_ENV``; the shipped rows' images have no conda and their scripts activate nothing,
so nothing is.

**Grading** (:func:`grade_in_image`) follows ``swebench.harness.run_evaluation`` (5.0.2): a FRESH
container of the same image, set up as above but with the hidden tests kept; the patch applied by
``GIT_APPLY_CMDS`` in order, the tree reset between tries, then the reverse check (SWE-smith's chain
for its rows: :data:`SWESMITH_GIT_APPLY_CMDS`); the ``reset_tests`` restored from that commit
(SWE-smith's ``git checkout --`` of the instance's test files); the row's ``eval_script`` run with
bash (output and errors together, as the harness logs them); the log read by swebench's own
``get_eval_report`` (the parser ``harness.log_parser`` names, its evidence checks,
``FAIL_TO_PASS``/``PASS_TO_PASS`` by ``eval_type``), or for a SWE-smith row by swesmith's
(:mod:`agentrl.envs.swe.swesmith_grading`: its profile's parser).

**What it guarantees**: the agent's container is never graded; a patch that does not apply, a
test run past ``test_timeout``, a container the tests kill, and every log swebench will not
read score 0, never an infrastructure fault; a container that does not start, a repository that
will not set up, or a lost engine is ``infra_error``. The test files ``test_patch`` touches are
reset by the eval script itself (SWE-bench's rule).

**What it does not** (the generated-instance path, :mod:`agentrl.envs.swe.grading`, does): the
patch's other files are not restored, so a patch may edit a ``conftest.py``, the test
configuration or a test file ``test_patch`` does not touch; the runner comes from the image and
the repository, so a patch can shadow it; the verdict rests on the printed log (and the test
exit code where the script records it), so a patch that prints SWE-bench's markers and
``PASSED`` lines can forge it. The grader's git runs inside the patched tree, with the tree's
own configuration. The image's git history is the agent's to read (SWE-bench's images hold
their repository's). These are SWE-bench's own limits; the harness path reproduces its verdicts
rather than strengthening them.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.envs.swe.grading import SWEGrade
from agentrl.envs.swe.instances import SWEInstance
from agentrl.envs.swe.projects import TESTBED_BUILD_COMMAND
from agentrl.envs.swe.r2e_grading import R2E_GYM, TESTS_DIR, grade_r2e, set_up_script
from agentrl.envs.swe.row_formats import SWE_SMITH_PARSER, swebench_image
from agentrl.envs.swe.swesmith_grading import SideError, side_missing, swesmith_report
from agentrl.tools.container import ContainerSandbox, connect
from agentrl.tools.sandbox import Sandbox, SandboxError, SandboxLimits, SandboxLost

GIT_APPLY_CMDS = (
    "git apply --verbose",
    "git apply --verbose --3way",
    "git apply --verbose --reject",
    "patch --batch --forward --fuzz=5 -p1 -i",
)
"""``swebench.harness.run_evaluation.GIT_APPLY_CMDS`` (5.0.2), tried in this order, the tree
reset between tries, then the reverse check."""
SWESMITH_GIT_APPLY_CMDS = (
    "git apply --verbose",
    "git apply --verbose --reject",
    "patch --batch --fuzz=5 -p1 -i",
)
"""``swesmith.constants.GIT_APPLY_CMDS`` (0.0.9), tried in this order for SWE-smith rows, as its
``_apply_patch`` tries them: no reset between tries, no reverse check."""

ACTIVATE_FILE = "/tmp/agentrl-activate.sh"
"""The activation lines of the row's eval script; ``BASH_ENV`` names it in the agent's box."""

_ARCHIVE = "/tmp/agentrl-repo.tar"
_PATCH = "/tmp/agentrl-patch.diff"
_EVAL = "/tmp/agentrl-eval.sh"
_MAX_LOG_BYTES = 8 << 20
_ACTIVATE_LINE = re.compile(r"^\s*(source\s+\S*activate\b.*|conda activate\s+\S+)\s*$", re.M)
_IDENTITY = "-c user.name=agentrl -c user.email=agentrl@localhost -c commit.gpgsign=false"


SHIPPED_SWESMITH_IMAGES = "swebench/swesmith.x86_64.agentrl-taskgen_1776_"
"""How the shipped projects' SWE-smith-layout images begin (:mod:`~agentrl.envs.swe.swesmith_rows`)."""
SHIPPED_R2E_IMAGES = "agentrl-r2e/"
"""How the shipped instances' R2E-Gym-layout images begin (:mod:`~agentrl.envs.swe.r2e_rows`)."""

_EVAL_SCRIPT_HINTS = {
    "swebench": "; `scripts/swebench4-eval-scripts IN.jsonl OUT.jsonl` adds the one swebench "
    "4.1 writes from its spec tables",
    "swe-smith": "; `scripts/swesmith-eval-scripts IN.jsonl OUT.jsonl` adds the one SWE-smith's "
    "harness writes from the repository's profile",
    "swe-gym": "; SWE-Gym's are written by SWE-Gym's fork of SWE-bench "
    "(github.com/SWE-Gym/SWE-Bench-Fork: its spec tables, test commands and markerless logs), "
    "which is not on PyPI, so this path cannot write or grade them",
}


class HarnessError(ValueError):
    """A harness row cannot run here; the message says why and what would make it run."""


def check_rows(instances: Sequence[SWEInstance], sandbox: str) -> None:
    """Refuse what this path cannot run: another backend than ``"container"``, a row without an
    ``eval_script`` (but R2E-Gym's, whose test script is in its image), a log parser swebench
    lacks."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    for instance in instances:
        harness = instance.harness
        assert harness is not None
        if sandbox != "container":
            raise HarnessError(
                f"agentrl/SWE-v0: {instance.instance_id!r} runs on its image {harness.image!r}, "
                f"which only sandbox='container' can start (sandbox={sandbox!r} runs no image)"
            )
        if harness.format == R2E_GYM:
            continue  # run_tests.sh is in the image; R2E-Gym's parser is r2e_grading's
        if not harness.eval_script:
            hint = _EVAL_SCRIPT_HINTS.get(harness.format, "")
            raise HarnessError(
                f"agentrl/SWE-v0: {instance.instance_id!r} ({harness.format} row) is not runnable "
                f"yet: the row has no eval_script (SWE-bench 5 rows carry one){hint}"
            )
        if harness.log_parser == SWE_SMITH_PARSER:
            if why := side_missing():
                raise HarnessError(
                    f"agentrl/SWE-v0: {instance.instance_id!r} is graded by swesmith's own "
                    f"code, but {why}"
                )
        elif harness.log_parser not in PARSER_REGISTRY:
            raise HarnessError(
                f"agentrl/SWE-v0: {instance.instance_id!r}: log_parser {harness.log_parser!r} "
                "is not in swebench's PARSER_REGISTRY"
            )


def check_images(instances: Sequence[SWEInstance], client: Any) -> None:
    """Refuse rows whose image the engine (``client``) lacks, naming the command that makes it."""
    missing: dict[str, str] = {}
    for instance in instances:
        image = instance.harness.image if instance.harness else ""
        if image not in missing and not _image_exists(client, image):
            missing[image] = build_command(instance)
    if missing:
        listed = "; ".join(f"{image} (`{command}`)" for image, command in missing.items())
        raise HarnessError(f"agentrl/SWE-v0: images missing on the engine: {listed}")


def build_command(instance: SWEInstance) -> str:
    """The command that makes ``instance``'s image: ``sandboxes/build.sh swe-testbed`` for a
    shipped instance's official-layout or R2E-Gym-layout image or a shipped project's
    SWE-smith-layout one, else ``podman pull``."""
    image = instance.harness.image if instance.harness else ""
    short = image.removeprefix("localhost/")
    ours = swebench_image(instance.instance_id) == short and instance.agentrl_taskgen is not None
    if ours or short.startswith((SHIPPED_SWESMITH_IMAGES, SHIPPED_R2E_IMAGES)):
        return TESTBED_BUILD_COMMAND
    return f"podman pull {image}"


def activation(instance: SWEInstance) -> str:
    """What of the row's eval script enters an environment: its lines before the tests that do
    (SWE-bench's scripts), then the statements of its test command that do (SWE-smith's
    profiles start the command with ``source .../activate; conda activate testbed;``); an
    R2E-Gym row's own ``activate``."""
    if instance.harness is not None and instance.harness.format == R2E_GYM:
        return instance.harness.activate  # R2E-Gym puts the venv's programs first on PATH
    script = (instance.harness.eval_script if instance.harness else None) or ""
    before, _, after = script.partition(">>>>> Start")
    lines = [m.group(1) for m in _ACTIVATE_LINE.finditer(before)]
    command = after.partition("\n")[2].partition("\n")[0]  # the line after the marker
    for statement in re.split(r";|&&", command):
        if _ACTIVATE_LINE.fullmatch(statement.strip()):
            lines.append(statement.strip())
        else:
            break
    return "\n".join(lines)


class ImageRepos:
    """Sandboxes of harness images, each with a writable copy of its ``repo_dir``; one engine
    client and, per image, the ``repo_dir`` archive copied out of it (built once)."""

    def __init__(self, limits: SandboxLimits, client: Any = None) -> None:
        self.limits = limits
        self.client = client or connect()
        self._archives: dict[tuple[str, str], bytes] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self.client.close()

    async def start(self, instance: SWEInstance, *, agent: bool) -> tuple[Sandbox, str]:
        """A new sandbox of ``instance``'s image, its repository set up; returns it and the
        commit the repository starts at. ``agent``: the agent's (its shells enter the
        environment, the hidden tests are removed), else the grader's. Raises
        :class:`SandboxError` when it cannot."""
        harness = instance.harness
        assert harness is not None
        archive = await asyncio.to_thread(self.archive, harness.image, harness.repo_dir)
        env = {"BASH_ENV": ACTIVATE_FILE} if agent and activation(instance) else {}
        try:
            sandbox = await ContainerSandbox.start(
                self.limits,
                image=harness.image,
                client=self.client,
                writable_dirs=[harness.repo_dir],
                environment=env,
            )
        except SandboxError as exc:
            raise SandboxError(
                f"{exc} (the image must have python3 on PATH, which runs the sandbox's agent)"
            ) from exc
        try:
            return sandbox, await _set_up(sandbox, instance, archive, hide_tests=agent)
        except BaseException:
            await sandbox.close()
            raise

    def archive(self, image: str, path: str) -> bytes:
        """A tar of ``path`` in ``image``, read through the engine (as root), once per pair."""
        with self._lock:
            if (image, path) not in self._archives:
                try:
                    container = self.client.containers.create(image, ["true"])
                    try:
                        chunks, _ = container.get_archive(path)
                        self._archives[image, path] = b"".join(chunks)
                    finally:
                        container.remove(force=True)
                except Exception as exc:  # the engine's or the SDK's: not the agent's doing
                    raise SandboxError(f"copying {path} out of {image} failed: {exc}") from exc
            return self._archives[image, path]


async def grade_in_image(
    instance: SWEInstance, patch: str, *, repos: ImageRepos, timeout: float
) -> SWEGrade:
    """Grade ``patch`` (a git diff against the repository's starting commit) in a fresh sandbox
    of ``instance``'s image, as SWE-bench's harness does (see the module docstring)."""
    harness = instance.harness
    assert harness is not None
    try:
        tests = b""
        if harness.format == R2E_GYM:
            tests = await asyncio.to_thread(repos.archive, harness.image, TESTS_DIR)
        sandbox, _ = await repos.start(instance, agent=False)
    except SandboxError as exc:
        return SWEGrade(False, infra_error=f"the grading sandbox did not start: {exc}")
    try:
        if harness.format == R2E_GYM:
            return await grade_r2e(sandbox, instance, patch, tests, timeout)
        return await _apply_and_test(sandbox, instance, patch, timeout)
    except SandboxLost as exc:
        return SWEGrade(False, infra_error=f"the grading sandbox was lost: {exc}")
    except SandboxError as exc:  # the patch's code ran there, or its apply did
        return SWEGrade(False, reason=f"the grading sandbox failed: {exc}")
    except SideError as exc:
        return SWEGrade(False, infra_error=str(exc))
    finally:
        await sandbox.close()


async def _apply_and_test(
    sandbox: Sandbox, instance: SWEInstance, patch: str, timeout: float
) -> SWEGrade:
    harness = instance.harness
    assert harness is not None and harness.eval_script is not None
    repo = shlex.quote(harness.repo_dir)
    await sandbox.write_file(_PATCH, patch)
    smith = harness.format == "swe-smith"
    applied = False
    for attempt, command in enumerate(SWESMITH_GIT_APPLY_CMDS if smith else GIT_APPLY_CMDS):
        reset = "git checkout -- . ; git clean -fd ; " if attempt and not smith else ""
        result = await sandbox.exec(["bash", "-c", f"cd {repo} && {reset}{command} {_PATCH}"])
        if result.exit_code == 0:
            applied = True
            break
    if not applied and not smith:
        check = f"cd {repo} && git apply --check --reverse {_PATCH}"
        applied = (await sandbox.exec(["bash", "-c", check])).exit_code == 0
    if not applied:
        judge = "SWE-smith's" if smith else "SWE-bench's"
        return SWEGrade(False, reason=f"the patch does not apply ({judge} git apply chain)")
    if harness.reset_tests:  # SWE-smith's one checkout; a path HEAD lacks fails it, as there
        files = " ".join(shlex.quote(path) for path in harness.reset_tests)
        await sandbox.exec(["bash", "-c", f"cd {repo} && git checkout -- {files}"])
    await sandbox.write_file(_EVAL, harness.eval_script)
    run = await sandbox.exec(
        ["bash", "-c", f"bash {_EVAL} 2>&1"], timeout=timeout, max_output_bytes=_MAX_LOG_BYTES
    )
    if run.timed_out:
        return SWEGrade(False, reason=f"the eval script ran past {timeout:g} s", log=run.stdout)
    if harness.log_parser == SWE_SMITH_PARSER:
        report = await swesmith_report(instance, patch, run.stdout)
        return _grade_of(report, run.stdout, run.exit_code, "swesmith")
    return _verdict(instance, patch, run.stdout, run.exit_code)


def _verdict(instance: SWEInstance, patch: str, log: str, exit_code: int | None) -> SWEGrade:
    """swebench's ``get_eval_report`` on the eval script's output."""
    from swebench.harness.grading import get_eval_report
    from swebench.types import TestSpec

    harness = instance.harness
    assert harness is not None and harness.log_parser is not None
    spec = TestSpec(
        instance_id=instance.instance_id,
        image=harness.image,
        eval_script_list=[],
        repo=instance.repo,
        version=instance.version,
        FAIL_TO_PASS=list(instance.FAIL_TO_PASS),
        PASS_TO_PASS=list(instance.PASS_TO_PASS),
        log_parser=harness.log_parser,
        eval_type=harness.eval_type,
    )
    prediction = {"instance_id": instance.instance_id, "model_patch": patch}
    with tempfile.TemporaryDirectory(prefix="agentrl-harness-") as scratch:
        path = Path(scratch) / "test_output.txt"
        path.write_text(log)
        report = get_eval_report(spec, prediction, str(path), include_tests_status=True)
    verdict = report[instance.instance_id]
    if not verdict["patch_successfully_applied"]:
        verdict.pop("tests_status", None)
    return _grade_of(verdict, log, exit_code, "swebench")


def _grade_of(verdict: dict[str, Any], log: str, exit_code: int | None, judge: str) -> SWEGrade:
    """An :class:`SWEGrade` of swebench's (or swesmith's) report for one instance: ``resolved``
    and, where it read test results, ``tests_status``."""
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS

    tests = verdict.get("tests_status", {})

    def counts(kind: str) -> tuple[int, int]:
        done = tests.get(kind, {"success": [], "failure": []})
        return len(done["success"]), len(done["success"]) + len(done["failure"])

    resolved = bool(verdict["resolved"])
    if resolved:
        reason = ""
    elif "tests_status" not in verdict:
        why = verdict.get("infra_failure_reason", "")
        reason = f"{judge} reads no test results from the eval script's output" + (
            f" ({why})" if why else ""
        )
    else:
        reason = f"a FAIL_TO_PASS or PASS_TO_PASS test did not pass ({judge}'s report)"
    return SWEGrade(
        resolved,
        fail_to_pass=counts(FAIL_TO_PASS),
        pass_to_pass=counts(PASS_TO_PASS),
        reason=reason,
        log=log,
        exit_code=exit_code,
    )


async def _set_up(
    sandbox: Sandbox, instance: SWEInstance, archive: bytes, *, hide_tests: bool
) -> str:
    """Unpack the image's ``repo_dir`` into the sandbox's copy; with a ``base_patch``, apply it,
    remove the ``hidden_tests`` (``hide_tests``) and commit the tree as a new history's root;
    write the activation file; return the repository's commit."""
    harness = instance.harness
    assert harness is not None
    await sandbox.write_file(_ARCHIVE, archive)
    await sandbox.write_file(ACTIVATE_FILE, activation(instance) + "\n")
    repo = shlex.quote(harness.repo_dir)
    script = (
        f"set -e; tar -xf {_ARCHIVE} -C {repo} --strip-components=1 --no-same-owner "
        f"--no-same-permissions; rm {_ARCHIVE}; cd {repo}; "
    )
    if harness.format == R2E_GYM:
        script += set_up_script(agent=hide_tests)
    if harness.base_patch:
        await sandbox.write_file(_PATCH, harness.base_patch)
        hidden = " ".join(shlex.quote(path) for path in harness.hidden_tests)
        script += f"git apply {_PATCH}; rm {_PATCH}; " + (
            f"rm -f -- {hidden}; " if hide_tests and hidden else ""
        )
        script += (  # a new history: the image's holds the tree before the bug, i.e. the fix
            "rm -rf .git; git init -q; git add -A; "
            f"git {_IDENTITY} commit -q --no-verify -m 'base_patch'; "
        )
    result = await sandbox.exec(["bash", "-c", script + "git rev-parse HEAD"], timeout=300)
    commit = result.stdout.strip()
    if result.exit_code != 0 or not commit:
        raise SandboxError(
            f"setting up {instance.instance_id!r} in {harness.image} failed "
            f"(exit {result.exit_code}): {result.stderr.strip()[-2000:]}"
        )
    if not harness.base_patch and instance.base_commit and commit != instance.base_commit:
        raise SandboxError(
            f"{instance.instance_id!r}: {harness.image}'s {harness.repo_dir} is at {commit}, "
            f"not base_commit {instance.base_commit}"
        )
    return commit


def _image_exists(client: Any, image: str) -> bool:
    import docker

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    return True
