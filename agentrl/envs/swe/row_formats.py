"""The benchmarks' published row formats, read into SWE-v0's instance columns plus a
:class:`HarnessSpec` that says how the task runs and is graded on its benchmark's image.

One converter per format, registered in :data:`ROW_FORMATS` (STYLE rule 13); :func:`detect_format`
picks the first format whose columns a source has. What each format guarantees once read:

========== ==============================================================================================
agentrl    SWE-v0's own rows (``write_instances``; generated ones carry ``agentrl_taskgen``): as is.
swebench   SWE-bench, Lite, Verified (JSON-string test lists, Verified's ``difficulty``): image by
           SWE-bench's naming rule (:func:`swebench_image`), base = the image's ``/testbed`` at
           ``base_commit``, log parser from SWE-bench 4.1's repository table; the eval script only
           where the row has one (SWE-bench 4 writes it from its per-version specs, which are not
           copied here: ``scripts/swebench4-eval-scripts`` adds it with swebench 4.1's own code).
swebench5  SWE-bench 5 rows (``image``, ``eval_script``, ``log_parser``, ``eval_type``): all four
           taken as published; ``image_assets`` kept as an extra column.
swe-gym    SWE-Gym (lists, no ``environment_setup_commit``): OpenHands' image name
           ``xingyaoww/sweb.eval.x86_64.<id, __ as _s_>``, parser from SWE-Gym's SWE-bench fork.
swe-smith  SWE-smith (``image_name``, no base commit, no test patch): base = ``/testbed`` with the
           row's ``patch`` applied (the instance branch's tree); the gold fix is its reverse.
           Test command, test files and parser come from SWE-smith's repository profiles, which
           are not copied here: ``scripts/swesmith-eval-scripts`` adds ``eval_script``,
           ``hidden_tests`` and ``reset_tests`` with swesmith's own code, and grading calls its
           ``get_eval_report`` (log parser ``"swesmith"``, :mod:`agentrl.envs.swe.swesmith_grading`).
r2e-gym    R2E-Gym (``docker_image``, ``parsed_commit_content``, ``expected_output_json``): gold fix
           rebuilt as R2E-Gym's ``ParsedCommit.get_patch(test_file=False)``; the task the text
           inside ``[ISSUE]...[/ISSUE]`` (its ``get_task_instruction``); tests by the image's
           ``run_tests.sh``; graded by every test having its expected status
           (:mod:`agentrl.envs.swe.r2e_grading`, R2E-Gym's rules reproduced).
========== ==============================================================================================

Not done here: checking that images exist, running anything on them
(:mod:`agentrl.envs.swe.image_harness`), or reproducing SWE-bench 4's and SWE-smith's test commands.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from agentrl.envs.swe.r2e_commit import r2e_gold_patch, r2e_task_instruction

SWEBENCH_ACTIVATE = "source /opt/miniconda3/bin/activate && conda activate testbed"
"""How SWE-bench's eval scripts (and SWE-smith's) enter the image's environment."""
R2E_ACTIVATE = "source /testbed/.venv/bin/activate"
"""R2E-Gym links ``/testbed/.venv``'s programs onto ``PATH``; activating the venv is the same."""


class HarnessSpec(BaseModel):
    """How an instance runs and is graded on its benchmark's image."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    format: str
    """The row format it was read from (a key of :data:`ROW_FORMATS`)."""
    image: str
    """The image holding the repository and its environment."""
    repo_dir: str = "/testbed"
    """Where the repository lives in the image."""
    activate: str = SWEBENCH_ACTIVATE
    """Shell that enters the environment the benchmark's harness tests in."""
    base_patch: str = ""
    """Applied to ``repo_dir`` to reach the base state; empty when the image holds it already."""
    eval_script: str | None = None
    """The benchmark's own eval script, as published (SWE-bench 5)."""
    test_command: str | None = None
    """The command whose output ``log_parser`` reads, when the row's benchmark fixes one."""
    log_parser: str | None = None
    """The benchmark's name for the parser of the test output; None where not known here."""
    eval_type: str = "pass_and_fail"
    """``pass_and_fail`` or ``fail_only`` (SWE-bench's ``EvalType``), or ``expected_statuses``."""
    expected_statuses: dict[str, str] | None = None
    """Every test's status after the fix (R2E-Gym grades on all of them)."""
    hidden_tests: tuple[str, ...] = ()
    """Test files removed from the agent's tree (SWE-smith: the FAIL_TO_PASS tests' files)."""
    reset_tests: tuple[str, ...] = ()
    """Test files restored (``git checkout --``) after the patch, before the eval script."""


class FieldError(ValueError):
    """A source column is missing or malformed; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# swebench 4.1.0, swebench/harness/log_parsers/{python,javascript,java,go,rust,ruby,php,c}.py,
# MAP_REPO_TO_PARSER: repository -> parser function, named as swebench 5's PARSER_REGISTRY names it.
SWEBENCH_LOG_PARSERS = {
    "astropy/astropy": "parse_log_astropy",
    "django/django": "parse_log_django",
    "marshmallow-code/marshmallow": "parse_log_marshmallow",
    "matplotlib/matplotlib": "parse_log_matplotlib",
    "mwaskom/seaborn": "parse_log_seaborn",
    "pallets/flask": "parse_log_flask",
    "psf/requests": "parse_log_requests",
    "pvlib/pvlib-python": "parse_log_pvlib",
    "pydata/xarray": "parse_log_xarray",
    "pydicom/pydicom": "parse_log_pydicom",
    "pylint-dev/astroid": "parse_log_astroid",
    "pylint-dev/pylint": "parse_log_pylint",
    "pytest-dev/pytest": "parse_log_pytest",
    "pyvista/pyvista": "parse_log_pyvista",
    "scikit-learn/scikit-learn": "parse_log_scikit",
    "sqlfluff/sqlfluff": "parse_log_sqlfluff",
    "sphinx-doc/sphinx": "parse_log_sphinx",
    "sympy/sympy": "parse_log_sympy",
    "redis/redis": "parse_log_redis",
    "jqlang/jq": "parse_log_jq",
    "nlohmann/json": "parse_log_doctest",
    "micropython/micropython": "parse_log_micropython_test",
    "valkey-io/valkey": "parse_log_redis",
    "fmtlib/fmt": "parse_log_googletest",
    "caddyserver/caddy": "parse_log_gotest",
    "hashicorp/terraform": "parse_log_gotest",
    "prometheus/prometheus": "parse_log_gotest",
    "gohugoio/hugo": "parse_log_gotest",
    "gin-gonic/gin": "parse_log_gotest",
    "google/gson": "parse_log_maven",
    "apache/druid": "parse_log_maven",
    "javaparser/javaparser": "parse_log_maven",
    "projectlombok/lombok": "parse_log_ant",
    "apache/lucene": "parse_log_gradle_custom",
    "reactivex/rxjava": "parse_log_gradle_custom",
    "Automattic/wp-calypso": "parse_log_calypso",
    "chartjs/Chart.js": "parse_log_chart_js",
    "markedjs/marked": "parse_log_marked",
    "processing/p5.js": "parse_log_p5js",
    "diegomura/react-pdf": "parse_log_react_pdf",
    "babel/babel": "parse_log_jest",
    "vuejs/core": "parse_log_vitest",
    "facebook/docusaurus": "parse_log_jest",
    "immutable-js/immutable-js": "parse_log_immutable_js",
    "mrdoob/three.js": "parse_log_tap",
    "preactjs/preact": "parse_log_karma",
    "axios/axios": "parse_log_tap",
    "phpoffice/phpspreadsheet": "parse_log_phpunit",
    "laravel/framework": "parse_log_phpunit",
    "php-cs-fixer/php-cs-fixer": "parse_log_phpunit",
    "briannesbitt/carbon": "parse_log_phpunit",
    "jekyll/jekyll": "parse_log_jekyll",
    "fluent/fluentd": "parse_log_ruby_unit",
    "fastlane/fastlane": "parse_log_rspec_transformed_json",
    "jordansissel/fpm": "parse_log_rspec_transformed_json",
    "faker-ruby/faker": "parse_log_ruby_unit",
    "rubocop/rubocop": "parse_log_rspec_transformed_json",
    "burntsushi/ripgrep": "parse_log_cargo",
    "sharkdp/bat": "parse_log_cargo",
    "astral-sh/ruff": "parse_log_cargo",
    "tokio-rs/tokio": "parse_log_cargo",
    "uutils/coreutils": "parse_log_cargo",
    "nushell/nushell": "parse_log_cargo",
    "tokio-rs/axum": "parse_log_cargo",
}
# swebench 5.0.2, swebench/harness/constants/__init__.py: repositories graded fail-only.
SWEBENCH_FAIL_ONLY_REPOS = frozenset(
    {
        "chartjs/Chart.js",
        "processing/p5.js",
        "markedjs/marked",
        "bpmn-io/bpmn-js",
        "openlayers/openlayers",
        "eslint/eslint",
    }
)
# SWE-Gym/SWE-Bench-Fork@242429c, swebench/harness/log_parsers.py (MAP_REPO_TO_PARSER, matched
# case-insensitively there): every SWE-Gym repository's parser is parse_log_pytest except
# pydantic's, a fork-only parser that also strips pytest's "[...]" after FAILED.
SWE_GYM_LOG_PARSERS = {
    "python/mypy": "parse_log_pytest",
    "getmoto/moto": "parse_log_pytest",
    "conan-io/conan": "parse_log_pytest",
    "modin-project/modin": "parse_log_pytest",
    "project-monai/monai": "parse_log_pytest",
    "iterative/dvc": "parse_log_pytest",
    "dask/dask": "parse_log_pytest",
    "bokeh/bokeh": "parse_log_pytest",
    "pydantic/pydantic": "parse_log_pytest_pydantic",
    "pandas-dev/pandas": "parse_log_pytest",
    "facebookresearch/hydra": "parse_log_pytest",
}
SWEBENCH5_EVAL_TYPES = frozenset({"pass_and_fail", "fail_only"})
SWE_SMITH_PARSER = "swesmith"
"""A SWE-smith row's log parser: its repository profile's, run by swesmith's own grading."""
SWE_SMITH_ADDED = ("eval_script", "hidden_tests", "reset_tests")
"""The columns ``scripts/swesmith-eval-scripts`` adds to a SWE-smith row."""


def swebench_image(instance_id: str, namespace: str | None = None, tag: str = "latest") -> str:
    """SWE-bench's instance image name (swebench 5.0.2 ``ImageSpec.name``, x86_64):
    ``sweb.eval.x86_64.<id>:<tag>``, or ``<ns>/...`` with ``__`` written ``_1776_``; lower case."""
    key = f"sweb.eval.x86_64.{instance_id}:{tag}"
    if namespace is not None:
        key = f"{namespace}/{key}".replace("__", "_1776_")
    return key.lower()


def swe_gym_image(instance_id: str) -> str:
    """SWE-Gym's published image (OpenHands' ``get_instance_docker_image``, data kind swebench)."""
    return f"xingyaoww/sweb.eval.x86_64.{instance_id.replace('__', '_s_')}:latest".lower()


def _text(row: Mapping[str, Any], field: str) -> str:
    value = row.get(field)
    if value is None:
        raise FieldError(field, "is missing")
    if not isinstance(value, str):
        raise FieldError(field, f"must be text, got {value!r:.80}")
    return value


def _json(row: Mapping[str, Any], field: str) -> Any:
    try:
        return json.loads(_text(row, field))
    except json.JSONDecodeError as exc:
        raise FieldError(field, f"must be JSON ({exc.msg} at character {exc.pos})") from None


def _with_harness(row: Mapping[str, Any], drop: tuple[str, ...], **harness: Any) -> dict[str, Any]:
    out = {key: value for key, value in row.items() if key not in drop}
    out["harness"] = harness
    return out


def read_agentrl(row: Mapping[str, Any]) -> dict[str, Any]:
    """SWE-v0's own columns, as ``write_instances`` writes them."""
    return dict(row)


def read_swebench(row: Mapping[str, Any]) -> dict[str, Any]:
    """SWE-bench / Lite / Verified: the columns as published; the image by SWE-bench's rule.
    An ``eval_script`` column (``scripts/swebench4-eval-scripts`` adds swebench 4.1's) is kept."""
    repo = row.get("repo")
    return _with_harness(
        row,
        ("eval_script",),
        format="swebench",
        image=swebench_image(_text(row, "instance_id")),
        eval_script=_text(row, "eval_script") if "eval_script" in row else None,
        log_parser=SWEBENCH_LOG_PARSERS.get(repo) if isinstance(repo, str) else None,
        eval_type="fail_only" if repo in SWEBENCH_FAIL_ONLY_REPOS else "pass_and_fail",
    )


def read_swebench5(row: Mapping[str, Any]) -> dict[str, Any]:
    """SWE-bench 5: ``image``, ``eval_script``, ``log_parser`` and ``eval_type`` as published."""
    eval_type = _text(row, "eval_type")
    if eval_type not in SWEBENCH5_EVAL_TYPES:
        raise FieldError("eval_type", f"must be one of {sorted(SWEBENCH5_EVAL_TYPES)}")
    return _with_harness(
        row,
        ("image", "eval_script", "log_parser", "eval_type"),
        format="swebench5",
        image=_text(row, "image"),
        eval_script=_text(row, "eval_script"),
        log_parser=_text(row, "log_parser"),
        eval_type=eval_type,
    )


def read_swe_gym(row: Mapping[str, Any]) -> dict[str, Any]:
    """SWE-Gym: SWE-bench's columns without ``environment_setup_commit``; lists as lists."""
    repo = row.get("repo")
    return _with_harness(
        row,
        (),
        format="swe-gym",
        image=swe_gym_image(_text(row, "instance_id")),
        log_parser=SWE_GYM_LOG_PARSERS.get(repo.lower()) if isinstance(repo, str) else None,
    )


def read_swe_smith(row: Mapping[str, Any]) -> dict[str, Any]:
    """SWE-smith: ``patch`` makes the bug, so the gold fix is its reverse; no base commit (the
    instance branch is the image's tree with ``patch`` applied) and no test patch. ``version``
    is the mirrored commit in the repository's name (``swesmith/<owner>__<name>.<commit>``)."""
    bug = _text(row, "patch")
    repo = _text(row, "repo")
    out = _with_harness(
        row,
        ("image_name", *SWE_SMITH_ADDED),
        format="swe-smith",
        image=_text(row, "image_name"),
        base_patch=bug,
        eval_script=_text(row, "eval_script") if "eval_script" in row else None,
        log_parser=SWE_SMITH_PARSER,
        hidden_tests=_paths(row, "hidden_tests"),
        reset_tests=_paths(row, "reset_tests"),
    )
    out.update(
        patch=reverse_diff(bug),
        base_commit="",
        test_patch="",
        version=out.get("version") or repo.rpartition(".")[2],
    )
    return out


def _paths(row: Mapping[str, Any], field: str) -> tuple[str, ...]:
    value = row.get(field, [])
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        raise FieldError(field, f"must be a list of paths, got {value!r:.80}")
    return tuple(value)


def read_r2e_gym(row: Mapping[str, Any]) -> dict[str, Any]:
    """R2E-Gym: one commit per row, in the image at its parent; no instance id (made as
    ``<repo_name>-<commit_hash>``), the gold fix rebuilt from ``parsed_commit_content``."""
    commit = _json(row, "parsed_commit_content")
    expected = _json(row, "expected_output_json")
    if not isinstance(commit, dict) or not isinstance(commit.get("file_diffs"), list):
        raise FieldError("parsed_commit_content", "must hold R2E-Gym's ParsedCommit")
    if not isinstance(expected, dict):
        raise FieldError("expected_output_json", "must map each test to its status")
    name, commit_hash = _text(row, "repo_name"), _text(row, "commit_hash")
    drop = ("repo_name", "docker_image", "commit_hash", "parsed_commit_content")
    out = _with_harness(
        row,
        (*drop, "expected_output_json"),
        format="r2e-gym",
        image=_text(row, "docker_image"),
        activate=R2E_ACTIVATE,
        test_command="bash /root/run_tests.sh",
        log_parser="r2egym.parse_log_pytest",
        eval_type="expected_statuses",
        expected_statuses=expected,
    )
    out.update(
        instance_id=f"{name}-{commit_hash}",
        problem_statement=r2e_task_instruction(_text(row, "problem_statement")),
        repo=name,
        base_commit=commit.get("old_commit_hash"),
        patch=r2e_gold_patch(commit),
        test_patch="",
        FAIL_TO_PASS=[test for test, status in expected.items() if status == "PASSED"],
        PASS_TO_PASS=[],
        version=commit_hash,
    )
    return out


@dataclass(frozen=True)
class RowFormat:
    """A published row format: the columns that identify it and its converter."""

    read: Callable[[Mapping[str, Any]], dict[str, Any]]
    has: frozenset[str] = frozenset()
    """Columns it always has."""
    lacks: frozenset[str] = frozenset()
    """Columns it never has."""
    any_of: frozenset[str] = frozenset()
    """When not empty: it has at least one of these."""

    def matches(self, columns: frozenset[str]) -> bool:
        return (
            self.has <= columns
            and not self.lacks & columns
            and (not self.any_of or bool(self.any_of & columns))
        )


ROW_FORMATS: dict[str, RowFormat] = {
    "agentrl": RowFormat(read_agentrl, any_of=frozenset({"harness", "agentrl_taskgen"})),
    "swebench5": RowFormat(read_swebench5, frozenset({"image", "eval_script", "log_parser"})),
    "r2e-gym": RowFormat(
        read_r2e_gym, frozenset({"docker_image", "parsed_commit_content", "expected_output_json"})
    ),
    "swe-smith": RowFormat(
        read_swe_smith, frozenset({"image_name", "patch"}), frozenset({"base_commit"})
    ),
    "swe-gym": RowFormat(
        read_swe_gym, frozenset({"base_commit"}), frozenset({"environment_setup_commit"})
    ),
    "swebench": RowFormat(read_swebench, frozenset({"base_commit", "environment_setup_commit"})),
}
"""Detection tries these in order: the first whose columns a source has is its format."""


def detect_format(columns: set[str] | frozenset[str]) -> str:
    """The first format of :data:`ROW_FORMATS` that ``columns`` (a source's column names) match."""
    seen = frozenset(columns)
    for name, spec in ROW_FORMATS.items():
        if spec.matches(seen):
            return name
    known = "; ".join(
        f"{name} (has {sorted(spec.has) if spec.has else 'one of ' + str(sorted(spec.any_of))}"
        + (f", lacks {sorted(spec.lacks)})" if spec.lacks else ")")
        for name, spec in ROW_FORMATS.items()
    )
    raise ValueError(f"no known row format has the columns {sorted(seen)}; known: {known}")


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_SWAPPED = {
    "new file mode ": "deleted file mode ",
    "deleted file mode ": "new file mode ",
    "old mode ": "new mode ",
    "new mode ": "old mode ",
    "rename from ": "rename to ",
    "rename to ": "rename from ",
    "copy from ": "copy to ",
    "copy to ": "copy from ",
}


def reverse_diff(diff: str) -> str:
    """The unified diff that undoes ``diff`` (what ``git apply -R`` applies), headers included."""
    out: list[str] = []
    old_left = new_left = 0  # lines of the current hunk not read yet, per side
    lines = diff.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if old_left > 0 or new_left > 0:
            sign = line[:1]
            if sign in ("-", " "):
                old_left -= 1
            if sign in ("+", " "):
                new_left -= 1
            out.append({"-": "+", "+": "-"}.get(sign, sign) + line[1:])
        elif hunk := _HUNK.match(line.rstrip("\n")):
            a, b, c, d, section = hunk.groups()
            old_left, new_left = int(b or 1), int(d or 1)
            ranges = (
                f"-{c}{',' + d if d is not None else ''} +{a}{',' + b if b is not None else ''}"
            )
            out.append(f"@@ {ranges} @@{section}" + line[len(line.rstrip("\n")) :])
        elif line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1][:4] == "+++ ":
            out.append("--- " + _side(lines[index + 1][4:], "a/"))
        elif line.startswith("+++ ") and out and out[-1].startswith("--- "):
            out.append("+++ " + _side(lines[index - 1][4:], "b/"))
        elif line.startswith("diff --git "):
            paths = line[len("diff --git ") :].rstrip("\n").split(" ")
            half = len(paths) // 2
            old, new = " ".join(paths[:half]), " ".join(paths[half:])
            out.append(f"diff --git a/{new[2:]} b/{old[2:]}" + line[len(line.rstrip("\n")) :])
        elif line.startswith("index ") and ".." in line:
            shas, _, mode = line[len("index ") :].partition(" ")
            old_sha, _, new_sha = shas.rstrip("\n").partition("..")
            out.append(f"index {new_sha}..{old_sha}" + (f" {mode}" if mode else "\n"))
        else:
            prefix = next((p for p in _SWAPPED if line.startswith(p)), None)
            out.append(_SWAPPED[prefix] + line[len(prefix) :] if prefix else line)
    return "".join(out)


def _side(header: str, prefix: str) -> str:
    """A ---/+++ path moved to the other side: ``a/x`` <-> ``b/x``, ``/dev/null`` kept."""
    if header.startswith("/dev/null"):
        return header
    return prefix + header[2:] if header[:2] in ("a/", "b/") else header
