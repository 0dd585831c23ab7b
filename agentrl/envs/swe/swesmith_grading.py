"""SWE-smith rows graded by swesmith's own code, in the swebench side interpreter.

SWE-smith's log parsers live in its repository profiles (``swesmith.profiles``), and swesmith
imports swebench 4's harness, which agentrl's swebench 5 no longer has; so swesmith is not
imported here. ``scripts/setup-swebench-env`` installs swesmith 0.0.9 beside swebench 4.1 in
``.venv-swebench/swebench4``, and :data:`SIDE_SCRIPT` (which imports nothing of agentrl) runs
there: ``scripts/swesmith-eval-scripts`` adds each row's eval script and test files with it, and
:func:`swesmith_report` grades an eval log with swesmith's ``get_eval_report``.

Where the side interpreter is: ``$AGENTRL_SWEBENCH_VENV``, else ``.venv-swebench`` at the
repository root. A SWE-smith row whose repository has no profile in swesmith's registry needs one
(``$AGENTRL_SWESMITH_PROFILES``, see :data:`SIDE_SCRIPT`).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from agentrl.envs.swe.instances import SWEInstance

SIDE_SCRIPT = Path(__file__).with_name("swesmith_side.py")
"""The side interpreter's script: ``rows IN OUT`` and ``grade`` (its module docstring)."""
VENV_VARIABLE = "AGENTRL_SWEBENCH_VENV"
DEFAULT_VENV = Path(__file__).resolve().parents[3] / ".venv-swebench"
SETUP_COMMAND = "scripts/setup-swebench-env"
GRADE_TIMEOUT_S = 300.0


def side_venv() -> Path:
    """The swebench side venv (``$AGENTRL_SWEBENCH_VENV`` or ``.venv-swebench``)."""
    return Path(os.environ.get(VENV_VARIABLE) or DEFAULT_VENV)


def side_command(*args: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run :data:`SIDE_SCRIPT` with ``args``."""
    venv = side_venv()
    env = {**os.environ, "PYTHONPATH": str(venv / "swebench4")}
    return [str(venv / "bin" / "python"), str(SIDE_SCRIPT), *args], env


def side_missing() -> str | None:
    """Why the side interpreter cannot run swesmith, or None when it can."""
    venv = side_venv()
    if not (venv / "bin" / "python").exists() or not (venv / "swebench4" / "swesmith").is_dir():
        return f"swesmith is not installed in {venv} (run `{SETUP_COMMAND}`)"
    return None


class SideError(RuntimeError):
    """The side interpreter failed: an infrastructure fault, never the patch's."""


async def swesmith_report(instance: SWEInstance, patch: str, log: str) -> dict[str, Any]:
    """swesmith's ``get_eval_report`` of ``patch`` on the eval script's output ``log``:
    ``resolved`` and, when swesmith found the test output, ``tests_status``."""
    request = {
        "instance": {
            "instance_id": instance.instance_id,
            "repo": instance.repo,
            "patch": instance.harness.base_patch if instance.harness else "",
            "FAIL_TO_PASS": list(instance.FAIL_TO_PASS),
            "PASS_TO_PASS": list(instance.PASS_TO_PASS),
        },
        "patch": patch,
        "log": log,
    }
    command, env = side_command("grade")
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise SideError(f"cannot start swesmith's grading ({command[0]}): {exc}") from exc
    try:
        out, err = await asyncio.wait_for(
            process.communicate(json.dumps(request).encode()), GRADE_TIMEOUT_S
        )
    except TimeoutError:
        process.kill()
        await process.wait()
        raise SideError(f"swesmith's grading ran past {GRADE_TIMEOUT_S:g} s") from None
    if process.returncode != 0:
        tail = err.decode(errors="replace").strip()[-2000:]
        raise SideError(f"swesmith's grading failed (exit {process.returncode}): {tail}")
    try:
        report = json.loads(out)
    except json.JSONDecodeError as exc:
        raise SideError(f"swesmith's grading printed no JSON report: {exc}") from exc
    if not isinstance(report, dict) or "resolved" not in report:
        raise SideError(f"swesmith's grading printed no report: {report!r:.200}")
    return report
