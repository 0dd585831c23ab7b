import argparse
import ast
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from agentrl.envs.swe import load_instances
from agentrl.envs.swe.repo import (
    COMMIT_TREE_SH,
    SdistProject,
    build_base_tree,
    build_environment_tree,
    commit_tree,
    files_added_by,
    git_apply,
    git_env,
    sha256_file,
    unpack_sdist,
)
from agentrl.envs.swe.taskgen import MUTATORS, TaskgenConfig, find_candidates, generate, mutate
from agentrl.envs.swe.taskgen.candidates import MutationError
from agentrl.envs.swe.taskgen.cli import add_arguments, main, run
from agentrl.envs.swe.taskgen.project import read_sdist, source_modules
from agentrl.envs.swe.taskgen.testrun import TEST_ENV, SuiteRunner

DATA = Path(__file__).parents[3] / "agentrl" / "envs" / "swe" / "data"

# --- mutators --------------------------------------------------------------------------------

# kind -> (module, the function's body after the first rewrite of that kind)
SNIPPETS = {
    "flip_comparison": ("    return a < b  # keep\n", "    return a > b  # keep\n"),
    "comparison_boundary": ("    return a >= b\n", "    return a > b\n"),
    "change_boolean_operator": ("    return a and (b or a)\n", "    return a or (b or a)\n"),
    "change_arithmetic_operator": (
        "    a += b * 2\n    return a\n",
        "    a -= b * 2\n    return a\n",
    ),
    "off_by_one_constant": ("    return a[1:]\n", "    return a[2:]\n"),
    "off_by_one_bound": ("    return a[: len(b)]\n", "    return a[: len(b) + 1]\n"),
    "replace_return_value": ("    return {a: b}\n", "    return None\n"),
    "drop_negation": ("    return not (a or b)\n", "    return (a or b)\n"),
    "swap_call_arguments": ("    return pow(a, b, 7)\n", "    return pow(b, a, 7)\n"),
    "remove_if_branch": (
        "    if a:\n        b = 1\n    return b\n",
        "    return b\n",
    ),
    "remove_else_branch": (
        "    if a:\n        b = 1\n    else:  # why\n        b = 2\n    return b\n",
        "    if a:\n        b = 1\n    return b\n",
    ),
}
HEAD = "import os\n\n\ndef f(a, b):\n"
TAIL = "\n\nVALUE = 1 < 2\n"


@pytest.mark.parametrize("kind", list(MUTATORS))
def test_each_mutator_changes_only_its_nodes_lines(kind):
    body, expected = SNIPPETS[kind]
    text = HEAD + body + TAIL
    candidate = next(c for c in find_candidates(text) if c.kind == kind)
    mutated = mutate(text, candidate)
    assert mutated == HEAD + expected + TAIL
    ast.parse(mutated)
    before, after = text.splitlines(keepends=True), mutated.splitlines(keepends=True)
    first, last = candidate.line - 1, candidate.end_line
    assert before[:first] == after[:first]
    assert before[last:] == after[len(after) - (len(before) - last) :]
    assert candidate.function == "f"


def test_a_lone_removed_branch_leaves_pass_and_line_endings_and_bytes_stay():
    text = "def f(a):\r\n    s = 'é'; t = 'ü' if a < 1 else 'x'\r\n    for x in a:\r\n        if x:\r\n            print(x)\r\n"
    by_kind = {c.kind: c for c in find_candidates(text)}
    assert mutate(text, by_kind["remove_if_branch"]).endswith("    for x in a:\r\n        pass\r\n")
    mutated = mutate(text, by_kind["flip_comparison"])
    assert mutated == text.replace("a < 1", "a > 1")


def test_only_function_bodies_are_rewritten():
    text = textwrap.dedent(
        """\
        LIMIT = 3 < 4

        class C:
            size = 1 + 2

            def m(self, x: int = 1 + 1) -> int:
                return f"{x + 1}"

        @decorate(1 + 1)
        def g(y=2 - 1):
            return lambda z=0 + 1: z
        """
    )
    assert [c.kind for c in find_candidates(text)] == ["replace_return_value"] * 2
    assert find_candidates(text)[0].function == "C.m"


def test_a_rewrite_that_regroups_operands_is_refused():
    text = "def f(a, b, c):\n    return a and b or c\n"
    candidate = next(c for c in find_candidates(text) if c.kind == "change_boolean_operator")
    assert candidate.description == "'or' -> 'and'"
    with pytest.raises(MutationError, match="changes more than its node"):
        mutate(text, candidate)  # `a and b and c` is one BoolOp, not the rewrite recorded


def test_candidates_are_listed_in_source_order_and_filtered_by_kind():
    text = HEAD + "    if a == b:\n        return a - 1\n    return b\n"
    kinds = [c.kind for c in find_candidates(text, ["flip_comparison", "off_by_one_constant"])]
    assert kinds == ["flip_comparison", "off_by_one_constant", "off_by_one_constant"]


# --- repository trees ------------------------------------------------------------------------


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / "notes.log").write_text("ignored by .gitignore, yet part of the tree\n")
    (root / "empty").mkdir()
    return root


def _ls_tree(repo: Path) -> list[str]:
    result = subprocess.run(
        ["git", "ls-tree", "-r", "HEAD"],
        cwd=repo,
        env=git_env(repo),
        capture_output=True,
        text=True,
    )
    return [
        line.split(maxsplit=3)[0] + " " + line.split("\t")[1] for line in result.stdout.splitlines()
    ]


def test_commit_tree_is_deterministic_and_takes_every_file(tmp_path):
    tree = _tree(tmp_path / "tree")
    first = commit_tree(shutil.copytree(tree, tmp_path / "a", symlinks=True), "message")
    second = commit_tree(shutil.copytree(tree, tmp_path / "b", symlinks=True), "message")
    assert first == second
    assert commit_tree(shutil.copytree(tree, tmp_path / "c"), "other message") != first
    assert _ls_tree(tmp_path / "a") == [
        "100644 .gitignore",
        "100644 notes.log",
        "100644 pkg/mod.py",
        "100755 run.sh",
    ]
    with pytest.raises(RuntimeError, match="already a git repository"):
        commit_tree(tmp_path / "a", "message")


def test_the_shell_procedure_gives_the_same_sha_as_commit_tree(tmp_path):
    tree = _tree(tmp_path / "tree")
    expected = commit_tree(shutil.copytree(tree, tmp_path / "a"), "environment")
    copy = shutil.copytree(tree, tmp_path / "b")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}  # as a container would run it
    result = subprocess.run(
        ["sh", "-c", COMMIT_TREE_SH, "sh", "environment"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.stdout.strip() == expected


def test_unpack_strips_the_top_directory(tmp_path):
    sdist = _sdist(tmp_path, {"a.py": "x = 1\n", "sub/b.py": "y = 2\n"})
    assert unpack_sdist(sdist, tmp_path / "clean") == "tiny-0.1"
    assert sorted(
        p.relative_to(tmp_path / "clean").as_posix() for p in (tmp_path / "clean").rglob("*.py")
    ) == [
        "a.py",
        "sub/b.py",
    ]
    info = read_sdist(sdist)
    assert (info.name, info.version, info.license) == ("tiny", "0.1", "MIT")


# --- generation ------------------------------------------------------------------------------

TINY = {
    "tinycalc/__init__.py": '''\
        """A tiny library for the generator's test."""


        def clamp(value, low, high):
            if value < low:
                return low
            if value > high:
                return high
            return value


        def mean(values):
            if not values:
                raise ValueError("mean of nothing")
            return sum(values) / len(values)


        def initials(name):
            return "".join(part[0].upper() for part in name.split() if part)
        ''',
    "tests/test_clamp.py": """\
        from tinycalc import clamp


        def test_inside():
            assert clamp(5, 0, 10) == 5


        def test_below():
            assert clamp(-3, 0, 10) == 0


        def test_above():
            assert clamp(12, 0, 10) == 10
        """,
    "tests/test_other.py": """\
        import pytest

        from tinycalc import initials, mean


        @pytest.mark.parametrize(("values", "expected"), [([1, 2, 3], 2), ([4], 4)])
        def test_mean(values, expected):
            assert mean(values) == expected


        def test_mean_of_nothing():
            with pytest.raises(ValueError):
                mean([])


        def test_initials():
            assert initials("ada  lovelace") == "AL"
        """,
}


def _sdist(tmp_path: Path, files: dict[str, str], name: str = "tiny", version: str = "0.1") -> Path:
    top = f"{name}-{version}"
    files = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nLicense: MIT\n",
        **files,
    }
    path = tmp_path / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for relative, text in files.items():
            data = textwrap.dedent(text).encode()
            info = tarfile.TarInfo(f"{top}/{relative}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    return path


def _run_tests(tree: Path, tests: list[str]) -> dict[str, str]:
    with SuiteRunner(sys.executable, timeout=120) as runner:
        run = runner.run(tree, files=sorted({t.split("::")[0] for t in tests}))
    return {test: run.outcomes.get(test, "missing") for test in tests}


@pytest.mark.slow
def test_generation_end_to_end_on_a_tiny_project(tmp_path):
    sdist = _sdist(tmp_path, TINY, name="tinycalc")
    config = TaskgenConfig(python=sys.executable, max_instances=3, jobs=2, p2p_max=4)
    instances = generate([sdist], tmp_path / "out", config)
    assert len(instances) == 3
    assert load_instances(tmp_path / "out" / "instances.jsonl") == instances
    project = SdistProject.model_validate_json(
        (tmp_path / "out/projects/tinycalc-0.1.json").read_text()
    )
    assert project.sha256 == sha256_file(tmp_path / "out/projects/tinycalc-0.1.tar.gz")
    assert project.passing_tests == 7 and project.license == "MIT"
    env_commit = build_environment_tree(sdist, tmp_path / "env")
    assert (
        {i.environment_setup_commit for i in instances}
        == {env_commit}
        == {project.environment_setup_commit}
    )
    for n, instance in enumerate(instances, 1):
        assert instance.instance_id == f"tinycalc__0.1-{n}"
        info = instance.agentrl_taskgen
        assert info.file == "tinycalc/__init__.py" and info.hidden_tests == files_added_by(
            instance.test_patch
        )
        assert len(instance.PASS_TO_PASS) <= 4
        statement = instance.problem_statement
        assert instance.FAIL_TO_PASS[0] in statement
        assert "diff" not in statement and "__init__" not in statement and "tmp" not in statement
        base = tmp_path / f"base{n}"
        assert build_base_tree(sdist, instance, base) == instance.base_commit
        assert not any((base / file).exists() for file in info.hidden_tests)
        git_apply(base, instance.test_patch)
        outcomes = _run_tests(base, instance.FAIL_TO_PASS + instance.PASS_TO_PASS)
        assert {outcomes[t] for t in instance.FAIL_TO_PASS} <= {"failed", "error"}
        assert {outcomes[t] for t in instance.PASS_TO_PASS} <= {"passed"}
        git_apply(base, instance.patch)
        assert set(_run_tests(base, instance.FAIL_TO_PASS).values()) == {"passed"}
    # The same seed gives the same instances (the command line, this time).
    assert (
        main(
            [str(sdist), "--out", str(tmp_path / "again"), "--max-instances", "3", "--p2p-max", "4"]
        )
        == 0
    )
    again = (tmp_path / "again" / "instances.jsonl").read_text()
    assert again == (tmp_path / "out" / "instances.jsonl").read_text()


def test_bad_options_and_files_are_reported(tmp_path, capsys):
    assert main(["x.tar.gz", "--out", "o", "--kinds", "flip_comparison,nope"]) == 2
    assert "kinds" in capsys.readouterr().err
    assert main([str(tmp_path / "none.tar.gz"), "--out", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "a.py").write_text("")
    with tarfile.open(tmp_path / "bare.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / "a.py", arcname="bare-1/a.py")
    assert main([str(tmp_path / "bare.tar.gz"), "--out", str(tmp_path / "o")]) == 1
    assert "no bare-1/PKG-INFO" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--max-hidden-bytes" in capsys.readouterr().out


def test_the_agentrl_swe_generate_subcommand(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="agentrl swe")
    add_arguments(parser)
    args = parser.parse_args(["generate", "x.tar.gz", "--out", str(tmp_path), "--jobs", "1"])
    assert (args.swe_command, args.jobs) == ("generate", 1)
    assert run(args) == 2 and "no such file: x.tar.gz" in capsys.readouterr().err


def test_default_source_modules_leave_out_tests_docs_and_setup(tmp_path):
    for relative in [
        "pkg/__init__.py",
        "pkg/core.py",
        "pkg/tests/test_core.py",
        "tests/conftest.py",
        "docs/conf.py",
        "setup.py",
        "pkg/core_test.py",
        "pkg.egg-info/x.py",
    ]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    assert source_modules(tmp_path) == ["pkg/__init__.py", "pkg/core.py"]
    assert source_modules(tmp_path, ["docs/*"]) == ["docs/conf.py"]


# --- the shipped set -------------------------------------------------------------------------


def _shipped():
    instances = load_instances(DATA / "instances.jsonl")
    projects = {
        path.name.removesuffix(".json"): SdistProject.model_validate_json(path.read_text())
        for path in sorted((DATA / "projects").glob("*.json"))
    }
    return instances, projects


def test_the_shipped_set_has_at_least_20_instances_over_2_projects():
    instances, projects = _shipped()
    assert len(instances) >= 20 and len(projects) >= 2
    assert len({i.instance_id for i in instances}) == len(instances)
    assert {i.agentrl_taskgen.sdist for i in instances} == {p.sdist for p in projects.values()}
    for project in projects.values():
        assert sha256_file(DATA / "projects" / project.sdist) == project.sha256
        assert project.license in (DATA / "README.md").read_text()
        assert project.test_env == TEST_ENV
    for instance in instances:
        info = instance.agentrl_taskgen
        assert info.hidden_tests == files_added_by(instance.test_patch)
        assert "diff --git" not in instance.problem_statement
        assert info.file not in instance.problem_statement
        assert (
            instance.environment_setup_commit
            == projects[info.sdist.removesuffix(".tar.gz")].environment_setup_commit
        )


@pytest.mark.slow
def test_shipped_trees_rebuild_to_their_commits_and_patches_apply(tmp_path):
    instances, projects = _shipped()
    for project in projects.values():
        sha = build_environment_tree(DATA / "projects" / project.sdist, tmp_path / project.name)
        assert sha == project.environment_setup_commit
    for instance in instances:
        base = tmp_path / instance.instance_id
        sdist = DATA / "projects" / instance.agentrl_taskgen.sdist
        assert build_base_tree(sdist, instance, base) == instance.base_commit, instance.instance_id
        git_apply(base, instance.test_patch, check=True)
        git_apply(base, instance.patch, check=True)


@pytest.mark.slow
def test_one_shipped_instance_per_project_fails_then_passes_on_the_host(tmp_path):
    instances, _ = _shipped()
    first = {}
    for instance in instances:
        first.setdefault(instance.agentrl_taskgen.sdist, instance)
    for sdist, instance in first.items():
        base = tmp_path / instance.instance_id
        build_base_tree(DATA / "projects" / sdist, instance, base)
        git_apply(base, instance.test_patch)
        outcomes = _run_tests(base, instance.FAIL_TO_PASS + instance.PASS_TO_PASS)
        assert {outcomes[t] for t in instance.FAIL_TO_PASS} <= {"failed", "error"}, (
            instance.instance_id
        )
        assert {outcomes[t] for t in instance.PASS_TO_PASS} == {"passed"}, instance.instance_id
        git_apply(base, instance.patch)
        outcomes = _run_tests(base, instance.FAIL_TO_PASS + instance.PASS_TO_PASS)
        assert set(outcomes.values()) == {"passed"}, instance.instance_id


def test_project_files_are_plain_json():
    for path in (DATA / "projects").glob("*.json"):
        assert set(json.loads(path.read_text())) == set(SdistProject.model_fields)


@pytest.fixture(params=["data filter", "same checks"])
def extraction(request, monkeypatch):
    """Both ways unpack_sdist extracts: tarfile's data filter (3.11.4+) and, on Pythons without
    it (Debian 12's 3.11.2, where both cases take this way), the same checks before a plain
    extraction."""
    if request.param == "same checks":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    return request.param


def test_both_extractions_give_the_shipped_environment_commits(tmp_path, extraction):
    _, projects = _shipped()
    for project in projects.values():
        sha = build_environment_tree(DATA / "projects" / project.sdist, tmp_path / project.name)
        assert sha == project.environment_setup_commit


@pytest.mark.parametrize(
    "member",
    [
        tarfile.TarInfo("tiny-0.1/../../escape.py"),
        tarfile.TarInfo("/tiny-0.1/absolute.py"),
        "symlink",
        "device",
    ],
    ids=["dotdot", "absolute", "symlink", "device"],
)
def test_both_extractions_refuse_what_leaves_the_tree(tmp_path, extraction, member):
    sdist = _sdist(tmp_path, {"a.py": "x = 1\n"})
    with tarfile.open(sdist, "r:gz") as archive:
        members = [(m, archive.extractfile(m).read()) for m in archive.getmembers()]
    if member == "symlink":
        member = tarfile.TarInfo("tiny-0.1/link")
        member.type, member.linkname = tarfile.SYMTYPE, "../../../etc/passwd"
    elif member == "device":
        member = tarfile.TarInfo("tiny-0.1/null")
        member.type, member.devmajor, member.devminor = tarfile.CHRTYPE, 1, 3
    with tarfile.open(sdist, "w:gz") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data))
        archive.addfile(member)
    refused = (ValueError, getattr(tarfile, "FilterError", ValueError))
    with pytest.raises(refused):
        unpack_sdist(sdist, tmp_path / "clean")
    assert not (tmp_path / "clean").exists() and not (tmp_path.parent / "escape.py").exists()
