"""SWE-bench 5 rows of SWE instances, for SWE-bench's own harness to evaluate.

SWE-bench's harness (``python -m swebench.harness.run_evaluation``, swebench 5.x) reads a dataset
whose rows carry, besides SWE-bench's columns (those of
:class:`~agentrl.envs.swe.instances.SWEInstance`), four more: ``image`` (the container image the
instance runs in), ``eval_script`` (the bash script it runs there after applying the
prediction in ``/testbed``), ``log_parser`` (the name of the function, in its
``PARSER_REGISTRY``, that reads the test output) and ``eval_type`` (``pass_and_fail``: every
``FAIL_TO_PASS`` test must pass and every ``PASS_TO_PASS`` one pass or be skipped).

What is SWE-bench's: those columns and their meaning, the image naming rule
(:func:`~agentrl.envs.swe.row_formats.swebench_image`), the markers the harness slices the test
output with and the shape of the eval script, as SWE-bench writes it for a pytest repository::

    cd /testbed
    git checkout BASE_COMMIT -- TEST_FILES_TEST_PATCH_CHANGES   # reset the tests to the base
    rm -f TEST_FILES_TEST_PATCH_ADDS
    git apply -v - <<'DELIMITER'  ... test_patch ... DELIMITER
    : '>>>>> Start Test Output'
    TEST_COMMAND TEST_FILES
    : '>>>>> End Test Output'
    (the reset again)

and the test ids as SWE-bench's datasets hold them: cut at the first space, since its pytest log
parser reads the first two words of a ``-rA`` summary line.

What is ours: the image, one of ``sandboxes/build.sh swe-testbed``'s (SWE-bench's layout without
conda: :mod:`agentrl.envs.swe.testbed`), so the script activates no conda environment; the test
command, the project's own (``python3 -m pytest ... -rA``, its environment variables exported
first), as SWE-bench's specifications name one per repository; and the test files it runs: those
``test_patch`` touches (SWE-bench's rule) and also the files holding the ``PASS_TO_PASS`` tests,
which for generated instances lie beyond ``test_patch`` (SWE-bench's harness counts a test absent
from the output as failed).

    python -m agentrl.envs.swe.swebench_rows OUT.jsonl [--instances FILE] [INSTANCE_ID...]
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.envs.swe.instances import SWEInstance
from agentrl.envs.swe.repo import files_added_by
from agentrl.envs.swe.rows_cli import rows_cli, write_jsonl
from agentrl.envs.swe.testbed import TESTBED, SWEBenchImage, swebench_images

START_TEST_OUTPUT = ">>>>> Start Test Output"
"""SWE-bench's marker before the test output (``swebench.harness.constants``)."""
END_TEST_OUTPUT = ">>>>> End Test Output"
"""SWE-bench's marker after it; the harness records the test command's exit status here."""
LOG_PARSER = "parse_log_pytest"
"""SWE-bench's parser of ``pytest -rA`` output (``swebench.harness.log_parsers``)."""
EVAL_TYPE = "pass_and_fail"
"""SWE-bench's ``EvalType.PASS_AND_FAIL``."""

_DIFF_FILES = re.compile(r"^diff --git a/(\S+) b/\S+$", re.MULTILINE)


def swebench_test_id(test: str) -> str:
    """A test id as SWE-bench's datasets hold it: cut at the first whitespace."""
    return test.split()[0]


def files_to_run(instance: SWEInstance) -> list[str]:
    """The files the eval script runs: those ``test_patch`` touches and those of the
    ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` tests, sorted."""
    tests = (*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS)
    return sorted(set(_DIFF_FILES.findall(instance.test_patch)) | {t.split("::")[0] for t in tests})


def eval_script(instance: SWEInstance, test_command: str, test_env: dict[str, str]) -> str:
    """The row's ``eval_script``: reset the test files ``test_patch`` touches to
    ``base_commit``, apply it, run ``test_command`` on :func:`files_to_run` between SWE-bench's
    markers (with ``test_env`` exported), and reset the test files again."""
    added = files_added_by(instance.test_patch)
    changed = [path for path in _DIFF_FILES.findall(instance.test_patch) if path not in added]
    reset = []
    if changed:
        reset.append(f"git checkout {instance.base_commit} -- {_words(changed)}")
    if added:
        reset.append(f"rm -f {_words(added)}")
    apply = []
    if instance.test_patch:
        delimiter = "EOF_" + hashlib.sha256(instance.test_patch.encode()).hexdigest()[:12]
        apply = [f"git apply -v - <<'{delimiter}'\n{instance.test_patch}\n{delimiter}"]
    exports = [f"export {_words(f'{k}={v}' for k, v in sorted(test_env.items()))}"]
    lines = [
        "#!/bin/bash",
        "set -uxo pipefail",
        f"cd {TESTBED}",
        "git status",
        f"git -c core.fileMode=false diff {instance.base_commit}",
        *reset,
        *apply,
        *(exports if test_env else []),
        f": '{START_TEST_OUTPUT}'",
        f"{test_command} {_words(files_to_run(instance))}",
        f": '{END_TEST_OUTPUT}'",
        *reset,
    ]
    return "\n".join(lines) + "\n"


def swebench_row(image: SWEBenchImage) -> dict[str, Any]:
    """The SWE-bench 5 row of ``image``'s instance: its columns (test ids cut as SWE-bench's
    datasets hold them) plus ``image``, ``eval_script``, ``log_parser`` and ``eval_type``."""
    instance, project = image.instance, image.project.spec
    row = instance.to_row()
    row["FAIL_TO_PASS"] = [swebench_test_id(test) for test in instance.FAIL_TO_PASS]
    row["PASS_TO_PASS"] = [swebench_test_id(test) for test in instance.PASS_TO_PASS]
    row["image"] = image.name
    row["eval_script"] = eval_script(instance, project.test_command, project.test_env)
    row["log_parser"] = LOG_PARSER
    row["eval_type"] = EVAL_TYPE
    return row


def write_rows(instances: Sequence[SWEInstance], path: str | Path) -> list[dict[str, Any]]:
    """Write the rows of ``instances`` (from shipped projects) to ``path`` as JSON lines;
    returns them."""
    rows = [swebench_row(image) for image in swebench_images(instances)]
    write_jsonl(rows, path)
    return rows


def _words(words: Any) -> str:
    return " ".join(shlex.quote(word) for word in words)


def main(argv: Sequence[str] | None = None) -> None:
    rows_cli(
        argv,
        prog="python -m agentrl.envs.swe.swebench_rows",
        description="Write SWE instances as SWE-bench 5 rows (a dataset for its harness).",
        write=write_rows,
    )


if __name__ == "__main__":
    main()
