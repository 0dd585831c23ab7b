"""``agentrl/SWE-v0``: fix a bug in a repository inside a sandbox; reward from its hidden tests.

Each episode gets a fresh sandbox from its project's image (:mod:`agentrl.envs.swe.projects`)
holding the instance's repository at ``base_commit`` in :data:`~agentrl.envs.swe.workspace.REPO_DIR`
(one commit, no future history, no hidden tests: :mod:`agentrl.envs.swe.workspace`). The agent
sees the problem statement and works with five tools, in the Hermes format (``<tool_call>`` JSON)
or the tag format (:class:`~agentrl.tools.arg_tags.ArgTagParser`):

- ``bash(command)``: a command in the repository (no network);
- ``view(path, start_line, end_line)``: a file with line numbers;
- ``create(path, content)``: write a file;
- ``str_replace(path, old, new)``: replace one exact occurrence;
- ``submit()``: end the episode and have the work graded.

``tool_set="str_replace_editor"`` replaces ``view``/``create``/``str_replace`` with SWE-agent's and
OpenHands' one editor tool, ``str_replace_editor(command, path, ...)`` (:mod:`agentrl.tools.editor`:
openhands-aci's behaviour and OpenHands' schema), beside ``bash`` and ``submit``.

A turn without a tool call gets a reminder. On ``submit``, or on the last turn that the standard
``max_turns`` argument allows (default 30 for this environment; :attr:`AgentEnv.final_turn`), the
environment takes ``git diff`` of the repository against ``base_commit`` and grades
it in a second, fresh sandbox (:mod:`agentrl.envs.swe.grading`): reward 1.0 when every
FAIL_TO_PASS and PASS_TO_PASS test passes, else 0.0. ``info`` then holds ``resolved``, the
passed/total counts of both lists, ``grading_reason``, ``patch_bytes``, ``submitted`` (False
when the turn limit ended the episode) and ``submission``, the patch as SWE-bench's prediction
row (``instance_id``, ``model_name_or_path``, ``model_patch``: what ``agentrl eval`` writes as
``predictions.jsonl`` for ``swebench.harness.run_evaluation``). An infrastructure failure (no grading sandbox, a
repository that would not set up, a sandbox whose host went away) sets ``info["infra_error"]``
(:data:`~agentrl.envs.INFRA_ERROR`) and ends the episode; its reward means nothing. What the agent
can cause is never one: its episode sandbox dying or refusing work before the diff (it ran its own
commands there) scores 0, and so does everything :mod:`agentrl.envs.swe.grading` blames on the
patch. The diff does not depend on the agent's git settings, and grading reads the changed files
from the patched tree itself.

**Benchmark rows on their own images.** Instances read from a benchmark's rows (``harness`` set:
SWE-bench 5 rows, ``load_instances(path, format="swebench5")``, and SWE-bench rows to which
``scripts/swebench4-eval-scripts`` added swebench 4.1's eval script) run on the image the row names,
in its layout: the repository at ``harness.repo_dir`` (``/testbed``), the tools' shell in it with
the row's environment activated, graded in a fresh container of the image by the row's
``eval_script`` and swebench's own log parser and grading, as SWE-bench's harness does
(:mod:`agentrl.envs.swe.image_harness`, which says what that path guarantees and what it does
not). Only ``sandbox="container"`` runs them; a row without an ``eval_script`` or whose image the
engine lacks is refused at construction, with the command that builds or pulls the image.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from agentrl.config import Config
from agentrl.envs.core import INFRA_ERROR, AgentEnv, ResetResult, StepResult
from agentrl.envs.splits import split_of
from agentrl.envs.swe.grading import GIT_ENV, GIT_OPTIONS, MAX_PATCH_BYTES, SWEGrade, grade
from agentrl.envs.swe.image_harness import ImageRepos, check_images, check_rows, grade_in_image
from agentrl.envs.swe.instances import SWEInstance, load_instances
from agentrl.envs.swe.projects import SHIPPED_PROJECTS, Project, load_projects, project_of
from agentrl.envs.swe.workspace import REPO_DIR, BaseTrees, WorkspaceError, checkout
from agentrl.tools import HermesParser, SandboxLimits, ToolCall, ToolSet, sandbox_factory
from agentrl.tools.arg_tags import ArgTagParser
from agentrl.tools.editor import SandboxEditor
from agentrl.tools.sandbox import Sandbox, SandboxError, SandboxLost
from agentrl.tools.sandbox_tools import sandbox_tools
from agentrl.tools.tool import Tool

SHIPPED_INSTANCES = Path(__file__).parent / "data" / "instances.jsonl"
"""The shipped generated instances (``agentrl/envs/swe/data/instances.jsonl``)."""

_TREES = BaseTrees()  # base-tree archives are shared by every environment of the process
# The agent's repository is its own: its git configuration, attributes and hooks are the agent's.
# The diff is taken with the settings that shape a patch fixed here (prefixes, quoting, context,
# no external diff or text conversion), so every setting the agent made gives the same patch text
# or one that does not apply (its own loss). The grader reads the changed paths from the tree the
# patch gives in its own sandbox, never from this text.
_GIT = (
    f"{GIT_ENV} git {GIT_OPTIONS} -c core.quotePath=true -c core.autocrlf=false "
    "-c core.attributesFile=/dev/null -c diff.noprefix=false -c diff.mnemonicPrefix=false "
    "-c diff.relative=false -c diff.suppressBlankEmpty=false"
)
_DIFF_SH = (
    'cd "$2" && ' + f"{_GIT} add -A -- . "
    "':(exclude,glob)**/__pycache__/**' ':(exclude,glob)**/.pytest_cache/**' && "
    f"{_GIT} diff --cached --binary --no-color --no-ext-diff --no-textconv --no-relative "
    '--unified=3 --src-prefix=a/ --dst-prefix=b/ "$1"'
)


class SWEConfig(Config):
    """Keyword arguments of ``gymnasium.make("agentrl/SWE-v0", ...)``."""

    instances: str | Path | None = None
    """A .jsonl/.json/.parquet file of generated instances or of benchmark rows (see
    instance_format); None uses the shipped set."""
    instance_format: str = "auto"
    """The file's row format (load_instances'): "swebench5" runs SWE-bench 5 rows on their own
    images; "auto" picks one by the columns."""
    instance_ids: list[str] | None = None
    """Restrict the episodes to these instance ids (of any split: they replace `split`)."""
    split: Literal["train", "test"] = "train"
    """Held-out splits of the shipped instances by bug (`agentrl.envs.splits`): an instance's key
    is its repository, file and function (two bugs in one function are on one side). Not
    applied when `instance_ids` names the instances; ignored for a file given as `instances`,
    which is used whole, as Math-v0 uses a file (a benchmark's rows keep its own splits)."""
    projects: str | Path = SHIPPED_PROJECTS
    """The directory of the instances' project files and source distributions."""
    tool_format: Literal["hermes", "tags"] = "hermes"
    """How the model calls tools."""
    tool_set: Literal["agentrl", "str_replace_editor"] = "agentrl"
    """The file tools: agentrl's view/create/str_replace, or SWE-agent's and OpenHands' one
    str_replace_editor tool (openhands-aci's behaviour, OpenHands' schema), each with bash and
    submit."""
    system_prompt: str | None = None
    """Replaces the built-in system prompt."""
    sandbox: Literal["container", "bwrap"] = "container"
    """Sandbox backend. bwrap needs git and python3 with pytest under the host's /usr."""
    sandbox_limits: SandboxLimits = SandboxLimits(memory_mb=1024, pids=256, cpus=1.0, disk_mb=512)
    """Limits of the episode's sandbox and of the grading one."""
    tool_timeout: float = Field(60.0, gt=0)
    """Wall-clock limit of one tool call, in seconds."""
    tool_max_output_bytes: int = Field(16_384, ge=256)
    """Cap on each of stdout and stderr of a tool call (the observation's length)."""
    test_timeout: float = Field(600.0, gt=0)
    """Wall-clock limit of the grading test run, in seconds."""


class SWEEnv(AgentEnv):
    """SWE-bench-style bug fixing in a sandbox (see the module docstring)."""

    def __init__(self, **kwargs: Any):
        self.config = config = SWEConfig.build("agentrl/SWE-v0", kwargs)
        if config.instance_ids is not None and "split" in config.model_fields_set:
            raise ValueError("agentrl/SWE-v0: give instance_ids or split, not both")
        loaded = load_instances(
            config.instances or SHIPPED_INSTANCES, format=config.instance_format
        )
        if config.instance_ids is None and config.instances is None:
            loaded = [i for i in loaded if split_of(bug_key(i)) == config.split]
        self.instances = _select(loaded, config.instance_ids)
        harnessed = [i for i in self.instances if i.harness is not None]
        if harnessed and len(harnessed) < len(self.instances):
            raise ValueError("agentrl/SWE-v0: give generated instances and benchmark rows apart")
        repo_dirs = {i.harness.repo_dir for i in harnessed if i.harness is not None}
        self.repo_dir = repo_dirs.pop() if harnessed else REPO_DIR
        if repo_dirs:
            raise ValueError("agentrl/SWE-v0: the rows' repositories lie in different directories")
        self.image_repos: ImageRepos | None = None
        if harnessed:
            check_rows(harnessed, config.sandbox)
            self.image_repos = ImageRepos(config.sandbox_limits)
            try:
                check_images(harnessed, self.image_repos.client)
            except BaseException:
                self.image_repos.close()
                raise
        known = load_projects(config.projects) if not harnessed else {}
        self.projects = {i.instance_id: project_of(i, known) for i in self.instances if known}
        self.instance: SWEInstance | None = None
        self.sandbox: Sandbox | None = None
        self._base = ""  # the commit the episode's diff is taken against
        self._runner_checked = False
        editor = config.tool_set == "str_replace_editor"
        tools = sandbox_tools(
            self._episode_sandbox,
            timeout=config.tool_timeout,
            max_output_bytes=config.tool_max_output_bytes,
            names=("bash",) if editor else ("bash", "view", "create_file", "str_replace"),
            workdir=self.repo_dir,
        )
        tools = [
            dataclasses.replace(t, name="create") if t.name == "create_file" else t for t in tools
        ]
        if editor:
            sandbox_editor = SandboxEditor(
                self._episode_sandbox, workspace_root=self.repo_dir, timeout=config.tool_timeout
            )
            tools.append(sandbox_editor.tool())
        tools.append(Tool.from_function(submit))
        self.tools = ToolSet(tools, sequential=True)  # one sandbox: a call sees the one before
        self.parser = HermesParser() if config.tool_format == "hermes" else ArgTagParser(tools)

    def _factory(self, project: Project) -> Any:
        return sandbox_factory(self.config.sandbox, self.config.sandbox_limits, image=project.image)

    @property
    def num_tasks(self) -> int:
        return len(self.instances)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetResult:
        await super().areset(seed=seed, options=options)
        await self._end_episode()
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(len(self.instances)))
        if not 0 <= index < len(self.instances):
            raise IndexError(f"options['index']={index} is outside 0..{len(self.instances) - 1}")
        self.instance = instance = self.instances[index]
        if self.image_repos is not None:
            await self._start_in_image(instance, self.image_repos)
        else:
            await self._start_generated(instance)
        messages = [
            {
                "role": "system",
                "content": self.config.system_prompt or self.default_system_prompt(),
            },
            {"role": "user", "content": self._task(instance)},
        ]
        tags = {"repo": instance.repo}
        if instance.difficulty is not None:  # SWE-bench Verified's estimate
            tags["difficulty"] = instance.difficulty
        info = {"tools": self.tools.schemas(), "instance_id": instance.instance_id, "tags": tags}
        return messages, info

    async def _start_in_image(self, instance: SWEInstance, repos: ImageRepos) -> None:
        try:
            self.sandbox, self._base = await repos.start(instance, agent=True)
        except SandboxError as exc:
            raise RuntimeError(
                f"agentrl/SWE-v0: cannot start {instance.instance_id!r}: {exc}"
            ) from exc

    async def _start_generated(self, instance: SWEInstance) -> None:
        project = self.projects[instance.instance_id]
        self._base = instance.base_commit
        archive = _TREES.archive(instance, project.sdist)
        try:
            self.sandbox = await self._factory(project)()
            await self._check_runner(self.sandbox)
            await checkout(self.sandbox, instance, archive)
        except (SandboxError, WorkspaceError) as exc:
            await self._end_episode()
            hint = (
                f" (build the image with `{project.build_command}`)"
                if "not found" in str(exc)
                else ""
            )
            raise RuntimeError(
                f"agentrl/SWE-v0: cannot start {instance.instance_id!r}: {exc}{hint}"
            ) from exc

    async def astep(self, action: str) -> StepResult:
        if self.instance is None or self.sandbox is None:
            raise RuntimeError("SWEEnv.step() before reset() (or after the episode ended)")
        parsed = self.parser.parse(action)
        calls = parsed.calls
        submitted = any(call.name == "submit" for call in calls)
        if submitted:
            calls = calls[: next(i for i, call in enumerate(calls) if call.name == "submit")]
        messages = await self.tools.run(calls, parsed.errors)
        info: dict[str, Any] = {"tool_calls": len(parsed.calls), "tool_errors": len(parsed.errors)}
        if submitted or self.final_turn:
            reward, grading = await self._grade()
            return [], reward, True, False, info | grading | {"submitted": submitted}
        if not parsed.calls and not parsed.errors:
            messages = [{"role": "user", "content": self._reminder()}]
        return messages, 0.0, False, False, info

    async def _grade(self) -> tuple[float, dict[str, Any]]:
        assert self.instance is not None and self.sandbox is not None
        instance = self.instance
        try:
            diff = await self.sandbox.exec(
                ["sh", "-c", _DIFF_SH, "sh", self._base, self.repo_dir],
                timeout=120,
                max_output_bytes=MAX_PATCH_BYTES + 1,
            )
        except SandboxLost as exc:
            return 0.0, {INFRA_ERROR: f"taking the diff failed: {exc}", "resolved": False}
        except SandboxError as exc:
            # The agent ran its own commands in this sandbox: a box that died or refuses work
            # now (killed agent, exhausted limits) is its doing; only a lost host is not.
            why = f"the sandbox failed before the diff was taken: {exc}"
            return 0.0, {"resolved": False, "grading_reason": why}
        finally:
            await self._end_episode()
        info: dict[str, Any] = {"patch_bytes": len(diff.stdout.encode())}
        if diff.exit_code == 0 and not diff.truncated:  # SWE-bench's prediction row
            info["submission"] = {
                "instance_id": instance.instance_id,
                "model_name_or_path": None,  # the model's name: agentrl eval fills it in
                "model_patch": diff.stdout,
            }
        if diff.exit_code != 0 or diff.truncated:
            # The agent can break its own repository (delete .git, rewrite objects): its fault.
            why = (
                f"is larger than {MAX_PATCH_BYTES} bytes"
                if diff.truncated
                else f"failed: {diff.stderr.strip()[-500:]}"
            )
            return 0.0, info | {"resolved": False, "grading_reason": f"git diff {why}"}
        result = await self._grade_patch(instance, diff.stdout)
        info |= result.info() | {"reward_components": {"resolved": float(result.resolved)}}
        if result.infra_error is not None:
            info[INFRA_ERROR] = result.infra_error
        return float(result.resolved), info

    async def _grade_patch(self, instance: SWEInstance, patch: str) -> SWEGrade:
        if self.image_repos is not None:
            return await grade_in_image(
                instance, patch, repos=self.image_repos, timeout=self.config.test_timeout
            )
        project = self.projects[instance.instance_id]
        return await grade(
            instance,
            patch,
            sandboxes=self._factory(project),
            archive=_TREES.archive(instance, project.sdist),
            test_command=project.spec.test_command,
            test_env=project.spec.test_env,
            timeout=self.config.test_timeout,
        )

    async def _check_runner(self, sandbox: Sandbox) -> None:
        """Once per environment: the sandbox has what episodes and grading need (bwrap sees the
        host's /usr, which may lack them)."""
        if self._runner_checked:
            return
        probe = await sandbox.exec(
            ["sh", "-c", "git --version && tar --version && python3 -m pytest --version"],
            timeout=60,
        )
        if probe.exit_code != 0:
            raise WorkspaceError(
                f"the {self.config.sandbox} sandbox lacks git, tar or python3 with pytest "
                f"({(probe.stdout + probe.stderr).strip()[-300:]}); on bwrap install them on the "
                "host (`sudo sandboxes/setup.sh` does: git, python3-pytest)"
            )
        self._runner_checked = True

    async def aclose(self) -> None:
        await self._end_episode()
        if self.image_repos is not None:
            self.image_repos.close()
            self.image_repos = None

    async def _episode_sandbox(self) -> Sandbox:
        if self.sandbox is None:
            raise SandboxError("the episode has ended: there is no sandbox")
        return self.sandbox

    async def _end_episode(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            await sandbox.close()

    def _task(self, instance: SWEInstance) -> str:
        return (
            f"The repository {instance.repo} (version {instance.version}) is checked out in "
            f"{self.repo_dir}. Resolve this issue:\n\n{instance.problem_statement.strip()}\n\n"
            "Change the source files, not the tests; call submit when you are done."
        )

    def _reminder(self) -> str:
        return f"Call a tool to work on the repository, or submit. {self._call_examples()}"

    def _call_examples(self) -> str:
        examples = [
            ToolCall("bash", {"command": "grep -rn 'def ' --include=*.py | head"}),
            *_file_examples(self.config.tool_set, self.repo_dir),
            ToolCall("submit", {}),
        ]
        return "For example:\n" + "\n".join(self.parser.format(call) for call in examples)

    def default_system_prompt(self) -> str:
        return (
            "You are a software engineer fixing a bug in a Python repository inside a sandbox "
            "without network access. Explore the code, reproduce the problem, edit the source "
            f"and run the tests with bash. Tools: {', '.join(self.tools.names[:-1])} and submit. "
            f"The repository is {self.repo_dir}. "
            f"{_file_notes(self.config.tool_set, self.repo_dir)}{self._call_examples()}\nThe work is graded by hidden tests when you submit or "
            "your turns run out."
        )


def _file_notes(tool_set: str, repo_dir: str) -> str:
    if tool_set == "agentrl":
        return ""
    return (
        "str_replace_editor's commands are view (a file, or a directory two levels deep), "
        "create (new files only), str_replace, insert and undo_edit; its paths are absolute "
        f"(the repository is {repo_dir}). "
    )


def _file_examples(tool_set: str, repo_dir: str) -> list[ToolCall]:
    if tool_set == "agentrl":
        return [
            ToolCall("view", {"path": "README.md", "start_line": 1, "end_line": 20}),
            ToolCall("str_replace", {"path": "pkg/mod.py", "old": "a < b", "new": "a <= b"}),
        ]
    return [
        ToolCall("str_replace_editor", {"command": "view", "path": repo_dir}),
        ToolCall(
            "str_replace_editor",
            {
                "command": "str_replace",
                "path": f"{repo_dir}/pkg/mod.py",
                "old_str": "a < b",
                "new_str": "a <= b",
            },
        ),
    ]


def submit() -> str:
    """Submit the repository's current state for grading; ends the episode."""
    return "submitted"


def bug_key(instance: SWEInstance) -> str:
    """What decides an instance's split: its bug (see ``SWEConfig.split``)."""
    taskgen = instance.agentrl_taskgen
    if taskgen is None:
        return instance.instance_id
    return f"{instance.repo}:{taskgen.file}:{taskgen.function}"


def _select(instances: list[SWEInstance], ids: list[str] | None) -> list[SWEInstance]:
    if ids is None:
        return instances
    by_id = {instance.instance_id: instance for instance in instances}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise ValueError(f"unknown instance ids {unknown}; known: {sorted(by_id)[:10]}...")
    return [by_id[i] for i in ids]
