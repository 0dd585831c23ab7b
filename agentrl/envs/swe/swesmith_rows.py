"""SWE-smith rows of the shipped SWE instances, and the images they run on.

A SWE-smith task is a bug injected into a repository's clean tree: its row (the seven columns
of the SWE-bench/SWE-smith dataset) names the image holding that tree at ``/testbed``
(``image_name``) and the diff that makes the bug (``patch``); the fix is the diff's reverse.
agentrl's generated instances are made the same way (AST mutations of a project's sdist,
:mod:`agentrl.envs.swe.taskgen`), so each is written here as a SWE-smith row of its project:

* the repository SWE-smith's way: ``<owner>__<name>.<commit[:8]>`` for ``repo``
  ``agentrl-taskgen/<name>`` at the clean tree's commit (``environment_setup_commit``), as
  ``swesmith/<that>`` (SWE-smith's mirror), and instance ids ``<that>.taskgen__<n>``;
* ``patch``: the gold fix reversed, the bug as a diff of the clean tree;
* ``image_name`` by SWE-smith's rule (``RepoProfile.image_name``, swesmith 0.0.9), one image per
  project: its project image plus ``/testbed``, the clean tree (the sdist, tests included) as a
  git repository at ``environment_setup_commit``, built by ``sandboxes/build.sh swe-testbed``
  (``python -m agentrl.envs.swe.testbed list`` names it beside the SWE-bench-layout ones);
* ``FAIL_TO_PASS``/``PASS_TO_PASS`` as SWE-smith's datasets hold them: the pytest node ids its
  parser can read from pytest's ``--verbose`` lines (an id, spaces, the status), so not those
  with whitespace in a parameter: SWE-smith's validation, which lists the tests from that
  parser's output, never holds them either, and keeps no task without a FAIL_TO_PASS test, so
  neither does :func:`write_rows` (``inflection__0.5.1-3``'s are all parametrised with spaces).

SWE-smith knows a repository by its profile; the shipped projects' profiles are in
:data:`PROFILES` (a file swesmith runs, ``$AGENTRL_SWESMITH_PROFILES``): SWE-smith's
``PythonProfile`` with the project's test command, in ``--verbose`` mode as SWE-smith's, and no
conda environment to enter (these images have none, as the SWE-bench-layout ones).

    python -m agentrl.envs.swe.swesmith_rows OUT.jsonl [--instances FILE] [INSTANCE_ID...]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.envs.swe.instances import SWEInstance
from agentrl.envs.swe.row_formats import reverse_diff
from agentrl.envs.swe.rows_cli import rows_cli, write_jsonl

PROFILES = Path(__file__).parent / "data" / "swesmith_profiles.py"
"""SWE-smith profiles of the shipped projects, for ``$AGENTRL_SWESMITH_PROFILES``."""


def _clean_commit(instance: SWEInstance) -> str:
    if not instance.environment_setup_commit:
        raise ValueError(f"{instance.instance_id} has no environment_setup_commit (clean tree)")
    return instance.environment_setup_commit[:8]


def repo_name(instance: SWEInstance) -> str:
    """SWE-smith's ``RepoProfile.repo_name``: ``<owner>__<name>.<commit[:8]>``."""
    owner, _, name = instance.repo.partition("/")
    return f"{owner}__{name}.{_clean_commit(instance)}"


def image_name(instance: SWEInstance) -> str:
    """SWE-smith's ``RepoProfile.image_name`` (x86_64, org ``swebench``)."""
    owner, _, name = instance.repo.partition("/")
    return f"swebench/swesmith.x86_64.{owner}_1776_{name}.{_clean_commit(instance)}".lower()


def swesmith_test_ids(tests: Sequence[str]) -> list[str]:
    """The tests SWE-smith's pytest parser can name: no whitespace in the id."""
    return [test for test in tests if len(test.split()) == 1]


def swesmith_row(instance: SWEInstance) -> dict[str, Any] | None:
    """``instance`` in SWE-smith's seven published columns; None when SWE-smith's parser can
    name none of its FAIL_TO_PASS tests (SWE-smith keeps no such task)."""
    name = repo_name(instance)
    fail_to_pass = swesmith_test_ids(instance.FAIL_TO_PASS)
    if not fail_to_pass:
        return None
    return {
        "instance_id": f"{name}.taskgen__{instance.instance_id.rpartition('-')[2]}",
        "repo": f"swesmith/{name}",
        "patch": reverse_diff(instance.patch),
        "FAIL_TO_PASS": fail_to_pass,
        "PASS_TO_PASS": swesmith_test_ids(instance.PASS_TO_PASS),
        "image_name": image_name(instance),
        "problem_statement": instance.problem_statement,
    }


def write_rows(instances: Sequence[SWEInstance], path: str | Path) -> list[dict[str, Any]]:
    """Write the SWE-smith rows of ``instances`` (those :func:`swesmith_row` can write) to
    ``path`` as JSON lines; returns them."""
    rows = [row for instance in instances if (row := swesmith_row(instance)) is not None]
    write_jsonl(rows, path)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    rows_cli(
        argv,
        prog="python -m agentrl.envs.swe.swesmith_rows",
        description="Write SWE instances as SWE-smith rows (its seven published columns).",
        write=write_rows,
        left_out="no FAIL_TO_PASS test SWE-smith's parser can name",
    )


if __name__ == "__main__":
    main()
