"""SWE-smith's own code for SWE-smith rows, run by the swebench side interpreter (not agentrl's).

    PYTHONPATH=.venv-swebench/swebench4 .venv-swebench/bin/python swesmith_side.py rows IN OUT
    ... swesmith_side.py grade  < {"instance": ROW, "patch": DIFF, "log": TEXT}

swesmith (0.0.9, installed beside swebench 4.1 by ``scripts/setup-swebench-env``: it imports
swebench 4's harness constants, which swebench 5 no longer has) holds, per repository, a profile:
the test command (``get_test_cmd``), the test files of an instance's tests (``get_test_files``)
and the log parser. This script imports nothing of agentrl, so the side interpreter needs only
swesmith and its imports.

``rows``: each SWE-smith row again, with three more columns from its profile (every other column
as it was):

* ``eval_script``: the script SWE-smith's harness (``swesmith.harness.utils.run_patch_in_container``)
  writes to ``/eval.sh`` and runs with bash: ``set -uxo pipefail``, ``cd /testbed``, the
  profile's ``get_test_cmd(instance)`` between SWE-smith's output markers;
* ``hidden_tests``: the files of the FAIL_TO_PASS tests, which SWE-smith's instance branch removes
  in its second commit ("Remove F2P Tests"), so the agent works without them;
* ``reset_tests``: the files of all the instance's tests, which the harness restores (``git
  checkout --``) after applying a prediction.

``grade``: SWE-smith's ``get_eval_report`` for one prediction on one eval log, as JSON.

Repositories SWE-smith has no profile for: ``AGENTRL_SWESMITH_PROFILES`` names Python files (joined
with ``os.pathsep``) run before anything else; each defines its profiles as SWE-smith's own do (a
``PythonProfile`` subclass per repository) and registers them (``registry.register_profile``).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
from pathlib import Path

# Run as a script, this file's directory comes first on sys.path, and its modules (env.py,
# grading.py, swesmith_grading.py, ...) would stand in for top-level ones: leave it off.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import swebench  # noqa: E402
from swebench.harness.constants import DOCKER_WORKDIR  # noqa: E402
from swesmith.constants import TEST_OUTPUT_END, TEST_OUTPUT_START  # noqa: E402
from swesmith.harness.grading import get_eval_report  # noqa: E402
from swesmith.profiles import registry  # noqa: E402

PROFILES_VARIABLE = "AGENTRL_SWESMITH_PROFILES"


def load_profiles() -> None:
    for path in filter(None, os.environ.get(PROFILES_VARIABLE, "").split(os.pathsep)):
        runpy.run_path(path)


def eval_script(test_command: str) -> str:
    """``run_patch_in_container``'s ``/eval.sh`` (swesmith 0.0.9, harness/utils.py)."""
    lines = [
        "#!/bin/bash",
        "set -uxo pipefail",
        f"cd {DOCKER_WORKDIR}",
        f": '{TEST_OUTPUT_START}'",
        test_command,
        f": '{TEST_OUTPUT_END}'",
    ]
    return "\n".join(lines) + "\n"


def with_eval_script(row: dict) -> dict:
    profile = registry.get_from_inst(row)
    test_command, _ = profile.get_test_cmd(row)
    f2p_files, p2p_files = profile.get_test_files(row)
    return {
        **row,
        "eval_script": eval_script(test_command),
        "hidden_tests": list(f2p_files),
        "reset_tests": sorted({*f2p_files, *p2p_files}),
    }


def rows(source: Path, target: Path) -> None:
    out = []
    for number, line in enumerate(source.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        try:
            out.append(with_eval_script(row))
        except KeyError as exc:  # the registry's: no profile for the row's repository
            sys.exit(f"swesmith-eval-scripts: {source}:{number}: {exc.args[0]}")
    target.write_text("".join(json.dumps(row) + "\n" for row in out))
    print(f"swesmith-eval-scripts: {len(out)} rows with eval scripts written to {target}")


def grade(request: dict) -> dict:
    instance = request["instance"]
    prediction = {"instance_id": instance["instance_id"], "model_patch": request["patch"]}
    with tempfile.TemporaryDirectory(prefix="agentrl-swesmith-") as scratch:
        log = Path(scratch) / "test_output.txt"
        log.write_text(request["log"])
        return get_eval_report(prediction, instance, str(log))


def main() -> None:
    assert swebench.__version__ == "4.1.0", swebench.__version__
    load_profiles()
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "rows" and len(sys.argv) == 4:
        rows(Path(sys.argv[2]), Path(sys.argv[3]))
    elif command == "grade" and len(sys.argv) == 2:
        json.dump(grade(json.load(sys.stdin)), sys.stdout)
    else:
        sys.exit("usage: swesmith_side.py rows IN.jsonl OUT.jsonl | grade < REQUEST.json")


if __name__ == "__main__":
    main()
