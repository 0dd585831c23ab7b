"""R2E-Gym rows of the shipped SWE instances, and the images they run on in R2E-Gym's layout.

An R2E-Gym task is one commit of a repository: its row (R2E-Gym's ``DatasetRow``, the 14 columns
of its Hugging Face datasets) names the image holding the repository at the commit's parent
(``docker_image``), the commit itself (``parsed_commit_content``: R2E-Gym's ``ParsedCommit``, the
gold fix and the test changes) and the status of every hidden test once it is applied
(``expected_output_json``). Each shipped instance is written here as such a commit:

* the commit: the instance's base tree (``base_commit``, the bug in) with the gold ``patch`` and
  the ``test_patch`` applied, committed with ``base_commit`` as its parent (fixed identity and
  date, so its sha, ``commit_hash``, is the same wherever it is made); ``parsed_commit_content``
  is that diff read as R2E-Gym's ``CommitParser.parse_git_diff`` reads one (no file contents, as
  there without a repository); ``repo_name`` is the project's name;
* the hidden tests as R2E-Gym's ``repo_testextract`` makes them: each file the commit adds to the
  tests, in the diff's order, as ``r2e_tests/test_<n>.py``, beside the helper modules of their
  directory they import (R2E-Gym copies Pillow's ``Tests/helper.py`` the same way; tabulate's
  tests import ``common``); run by R2E-Gym's test command (``repo_analysis_args.tests_cmd``)
  after the project's test environment, which is the image's ``/testbed/run_tests.sh``;
* ``expected_output_json``: R2E-Gym's parser on that command's output in the commit's tree, run
  in the task's own image (R2E-Gym runs it in its build directory, whose environment its image
  then copies), so writing rows needs the images built; a row is written only when every
  FAIL_TO_PASS test of the instance is there and passes;
* ``problem_statement`` inside ``[ISSUE]...[/ISSUE]``, as R2E-Gym's rows hold it;
* ``docker_image``: :func:`image_name`, ``agentrl-r2e/<name>_final:<commit_hash>`` (R2E-Gym's
  ``namanjain12/<repo>_final:<commit_hash>`` under this project's name), built by
  ``sandboxes/build.sh swe-testbed`` from ``sandboxes/swe-r2e/Containerfile``: the project's image
  plus ``/testbed`` (the base tree at ``base_commit``, ``run_tests.sh`` untracked beside it, and
  ``.venv``, a virtual environment over the image's Python, which git ignores as uv's do) and
  ``/r2e_tests`` (readable by root only, so the agent's uid cannot read it; the grader's copy is
  taken through the engine).

    python -m agentrl.envs.swe.r2e_rows OUT.jsonl [--instances FILE] [INSTANCE_ID...]
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.envs.swe.image_harness import SHIPPED_R2E_IMAGES
from agentrl.envs.swe.instances import GIT_SHA, SWEInstance
from agentrl.envs.swe.projects import TESTBED_BUILD_COMMAND, Project, load_projects, project_of
from agentrl.envs.swe.r2e_commit import parsed_commit, r2e_is_test_file
from agentrl.envs.swe.r2e_grading import parse_log_pytest, strip_output
from agentrl.envs.swe.repo import build_base_tree, files_added_by, git_apply, git_env
from agentrl.envs.swe.rows_cli import rows_cli, write_jsonl
from agentrl.tools.container import connect

R2E_TESTS_CMD = (
    "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' "
    ".venv/bin/python -W ignore -m pytest -rA r2e_tests"
)
"""R2E-Gym's test command for its Python repositories (``RepoAnalysisArgs.tests_cmd``)."""
COMMIT_MESSAGE = "fix"
_IDENTITY = {
    "GIT_AUTHOR_NAME": "agentrl",
    "GIT_AUTHOR_EMAIL": "agentrl@localhost",
    "GIT_COMMITTER_NAME": "agentrl",
    "GIT_COMMITTER_EMAIL": "agentrl@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
_IMPORT = re.compile(r"^(?:from\s+(\w+)\s+import|import\s+(\w+))", re.M)


def image_name(name: str, commit_hash: str) -> str:
    """The image of project ``name``'s commit ``commit_hash`` in R2E-Gym's layout."""
    return f"{SHIPPED_R2E_IMAGES}{name.lower()}_final:{commit_hash}"


def r2e_test_files(instance: SWEInstance, tree: Path) -> dict[str, str]:
    """``r2e_tests/``'s files (name -> text): the test files ``test_patch`` adds, read from
    ``tree`` (the commit's), as ``test_<n>.py``, and the sibling modules they import."""
    added = [path for path in files_added_by(instance.test_patch) if r2e_is_test_file(path)]
    files = {f"test_{n}.py": (tree / path).read_text() for n, path in enumerate(added, 1)}
    for path in added:
        source = (tree / path).read_text()
        for match in _IMPORT.finditer(source):
            module = match.group(1) or match.group(2)
            helper = tree / Path(path).parent / f"{module}.py"
            if helper.is_file() and str(Path(path).parent / helper.name) not in added:
                files.setdefault(helper.name, helper.read_text())
    return files


def run_tests_script(project: Project) -> str:
    """``/testbed/run_tests.sh``: the project's test environment, then R2E-Gym's command."""
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in project.spec.test_env.items())
    return f"{env} {R2E_TESTS_CMD}\n" if env else f"{R2E_TESTS_CMD}\n"


@dataclass(frozen=True)
class R2ECommit:
    """One instance as an R2E-Gym commit: the fix and test diff, its hidden tests, its script."""

    instance: SWEInstance
    project: Project
    commit_hash: str
    diff: str
    tests: dict[str, str]
    """``r2e_tests/``'s files."""
    run_tests: str
    """``/testbed/run_tests.sh``."""

    @property
    def image(self) -> str:
        return image_name(self.project.spec.name, self.commit_hash)

    @property
    def key(self) -> str:
        """Its build context's name (and ``agentrl.swe.instance`` label)."""
        return f"r2e-{self.instance.instance_id}"


def r2e_commit(instance: SWEInstance, project: Project, tree: Path) -> R2ECommit:
    """Make ``instance``'s commit in ``tree`` (created): the base tree with the fix and the
    tests applied, committed with ``base_commit`` as parent."""
    base = build_base_tree(project.sdist, instance, tree)
    git_apply(tree, instance.patch)
    git_apply(tree, instance.test_patch)
    commit = _commit(tree, parent=base)
    diff = _git(tree, "diff", "--no-color", "--no-ext-diff", base, commit)
    return R2ECommit(
        instance, project, commit, diff, r2e_test_files(instance, tree), run_tests_script(project)
    )


def r2e_commits(instances: Sequence[SWEInstance]) -> list[R2ECommit]:
    """The commit of each of ``instances`` (made in scratch trees)."""
    projects = load_projects()
    commits = []
    for instance in instances:
        with tempfile.TemporaryDirectory(prefix="agentrl-r2e-") as scratch:
            tree = Path(scratch) / "tree"
            commits.append(r2e_commit(instance, project_of(instance, projects), tree))
    return commits


def r2e_row(commit: R2ECommit, client: Any) -> dict[str, Any] | None:
    """``commit`` as R2E-Gym's row, its expected statuses from :func:`run_in_image`; None when a
    FAIL_TO_PASS test of the instance does not pass there (R2E-Gym keeps no such commit)."""
    instance, name = commit.instance, commit.project.spec.name
    output, code = run_in_image(commit, client)
    expected = parse_log_pytest(strip_output(output))
    wanted = [test.partition("::")[2].replace("::", ".") for test in instance.FAIL_TO_PASS]
    if not wanted or any(expected.get(test) != "PASSED" for test in wanted):
        return None
    parsed = parsed_commit(commit.diff, instance.base_commit, commit.commit_hash, COMMIT_MESSAGE)
    changed = [line for line in instance.patch.splitlines() if line[:1] in ("+", "-")]
    return {
        "repo_name": name,
        "docker_image": commit.image,
        "commit_hash": commit.commit_hash,
        "parsed_commit_content": json.dumps(parsed),
        "execution_result_content": json.dumps(
            {
                "repo_name": name,
                "new_commit_hash": commit.commit_hash,
                "test_file_codes": list(commit.tests.values()),
                "test_file_names": list(commit.tests),
                "setup_res_code": 0,
                "setup_res_stdout": "",
                "setup_res_stderr": "",
                "new_commit_res_code": code,
                "new_commit_res_stdout": output,
                "new_commit_res_stderr": "",
            }
        ),
        "modified_files": _paths(commit.diff),
        "modified_entity_summaries": [],
        "relevant_files": _paths(instance.patch),
        "num_non_test_files": len(_paths(instance.patch)),
        "num_non_test_func_methods": 0,
        "num_non_test_lines": sum(1 for line in changed if line[:3] not in ("+++", "---")),
        "prompt": "",
        "problem_statement": f"[ISSUE]{instance.problem_statement}[/ISSUE]",
        "expected_output_json": json.dumps(expected),
    }


def _paths(diff: str) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) ", diff, re.M)


def _git(tree: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", *args],
        cwd=tree,
        env=git_env(tree) | _IDENTITY,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {tree}: {result.stderr.strip()}")
    return result.stdout


def _commit(tree: Path, *, parent: str) -> str:
    _git(tree, "add", "-A", "-f")
    _git(tree, "commit", "-q", "--no-verify", "-m", COMMIT_MESSAGE)
    sha = _git(tree, "rev-parse", "HEAD").strip()
    if not GIT_SHA.fullmatch(sha) or _git(tree, "rev-parse", "HEAD~1").strip() != parent:
        raise RuntimeError(f"committing the fix in {tree} failed")
    return sha


def run_in_image(commit: R2ECommit, client: Any) -> tuple[str, int]:
    """R2E-Gym's run of a new commit, in ``commit``'s own image (``client``: the engine): the
    fix and the tests applied to ``/testbed``, the hidden tests copied in as ``r2e_tests``,
    ``run_tests.sh``; returns the output (both streams) and the exit status. Raises
    RuntimeError when the image is missing or the fix does not apply."""
    import docker  # the SDK is optional: only the container backend needs it

    diff = base64.b64encode(commit.diff.encode()).decode()
    script = (
        'set -e; cd /testbed; printf %s "$AGENTRL_FIX" | base64 -d | git apply; '
        'cp -r /r2e_tests r2e_tests; set +e; bash run_tests.sh 2>&1; echo "$?"'
    )
    try:
        container = client.containers.create(
            commit.image,
            ["bash", "-c", script],
            environment={"AGENTRL_FIX": diff},
            network_mode="none",
        )
    except docker.errors.ImageNotFound:
        raise RuntimeError(
            f"{commit.image} is missing: build it with `{TESTBED_BUILD_COMMAND}`"
        ) from None
    try:  # not containers.run(remove=True): Podman's API may cut the logs of a removed one
        container.start()
        status = container.wait(timeout=600)["StatusCode"]
        logs = container.logs(stdout=True, stderr=True)
    finally:
        container.remove(force=True)
    if status != 0:
        raise RuntimeError(
            f"{commit.key}: the fix does not apply in {commit.image}: {logs[-2000:]!r}"
        )
    output, _, code = logs.decode(errors="replace").rstrip("\n").rpartition("\n")
    return output + "\n", int(code)


def write_rows(instances: Sequence[SWEInstance], path: str | Path) -> list[dict[str, Any]]:
    """Write the R2E-Gym rows of ``instances`` (those :func:`r2e_row` keeps) to ``path`` as
    JSON lines; returns them. Their images must be built (``sandboxes/build.sh swe-testbed``)."""
    client = connect()
    try:
        rows = [row for commit in r2e_commits(instances) if (row := r2e_row(commit, client))]
    finally:
        client.close()
    write_jsonl(rows, path)
    return rows


def write_context(commit: R2ECommit, dest: str | Path) -> Path:
    """Write ``commit``'s image build context into ``dest`` (created): ``testbed/``, the base tree
    at ``base_commit`` with ``run_tests.sh`` untracked, and ``r2e_tests/``."""
    dest = Path(dest)
    dest.mkdir(parents=True)
    sha = build_base_tree(commit.project.sdist, commit.instance, dest / "testbed")
    if sha != commit.instance.base_commit:
        raise RuntimeError(f"{commit.instance.instance_id}: the base tree is commit {sha}")
    (dest / "testbed" / "run_tests.sh").write_text(commit.run_tests)
    (dest / "r2e_tests").mkdir()
    for name, text in commit.tests.items():
        (dest / "r2e_tests" / name).write_text(text)
    return dest


def main(argv: Sequence[str] | None = None) -> None:
    rows_cli(
        argv,
        prog="python -m agentrl.envs.swe.r2e_rows",
        description="Write SWE instances as R2E-Gym rows (its DatasetRow columns).",
        write=write_rows,
        left_out="a FAIL_TO_PASS test does not pass in R2E-Gym's run",
    )


if __name__ == "__main__":
    main()
