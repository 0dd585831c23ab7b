"""Running a test's worker under torchrun, again on one known native crash only.

A rank sometimes aborts in native code with "terminate called without an active exception" and
no Python traceback (seen in CI and fresh-checks in the actor, checkpoint and FP8 jobs, both idle
and under load; never on demand). :func:`run_torchrun` runs the job up to ``attempts`` times on
exactly that signature, with every rank's Python and C++ stacks printed, and keeps each failed
attempt's stderr in the result, so the next occurrence shows where it happened. Any other
failure is returned at once.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HELPERS = Path(__file__).parent
"""tests/: on the workers' PYTHONPATH, so a worker script anywhere under it imports the shared
helpers (``fsdp_worker``) as the tests do."""

NATIVE_ABORT = "terminate called without an active exception"


def run_torchrun(
    command: list[str], *, timeout: float, attempts: int = 3
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (a ``torch.distributed.run`` job); the last attempt's result, its stderr
    preceded by the earlier attempts'."""
    path = os.pathsep.join(filter(None, [str(HELPERS), os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "PYTHONFAULTHANDLER": "1",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
    }
    failed: list[str] = []
    for _ in range(attempts):
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode == 0 or NATIVE_ABORT not in done.stderr:
            break
        failed.append(done.stderr[-4000:])
    if failed and done.returncode != 0:
        done.stderr = "\n---- next attempt ----\n".join([*failed[:-1], done.stderr])
    return done
