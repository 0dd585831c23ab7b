"""Running a test's worker under torchrun, again on one known native crash only.

A rank sometimes aborts in native code with "terminate called without an active exception" and
no Python traceback: in CI and fresh-checks in the actor, checkpoint and FP8 jobs (idle and under
load), and once in a fresh-check in the 2-rank `agentrl train` over a pool, after its last step
and export; never on demand (PyTorch's issue 190489 shows the same message at exit).
:func:`run_torchrun` runs the job up to ``attempts`` times on exactly that signature, with every
rank's Python and C++ stacks printed, keeps each failed attempt's stderr in the result, and warns
when a later attempt passed, so each occurrence shows in the test report. Any other failure is
returned at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from collections.abc import Mapping
from pathlib import Path

HELPERS = Path(__file__).parent
"""tests/: on the workers' PYTHONPATH, so a worker script anywhere under it imports the shared
helpers (``fsdp_worker``) as the tests do."""

NATIVE_ABORT = "terminate called without an active exception"


def run_torchrun(
    command: list[str],
    *,
    timeout: float,
    attempts: int = 3,
    env: Mapping[str, str] | None = None,
    output_dir: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (a ``torch.distributed.run`` job) in ``env`` (default: this process's);
    the last attempt's result, its stderr preceded by the earlier attempts'. ``output_dir``, the
    job's outputs, is removed before a repeated attempt, so that it starts afresh (a training
    run would resume from the aborted attempt's checkpoint)."""
    base = dict(os.environ if env is None else env)
    path = os.pathsep.join(filter(None, [str(HELPERS), base.get("PYTHONPATH")]))
    job_env = {
        **base,
        "PYTHONPATH": path,
        "PYTHONFAULTHANDLER": "1",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
    }
    failed: list[str] = []
    for attempt in range(attempts):
        if attempt and output_dir is not None:
            shutil.rmtree(output_dir, ignore_errors=True)
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=job_env)
        if done.returncode == 0 or NATIVE_ABORT not in done.stderr:
            break
        failed.append(done.stderr[-4000:])
    if failed and done.returncode != 0:
        done.stderr = "\n---- next attempt ----\n".join([*failed[:-1], done.stderr])
    elif failed:  # passed on a later attempt: the abort still shows in the test report
        warnings.warn(
            f"{len(failed)} attempt(s) of {command[-1]} ended in {NATIVE_ABORT!r}; the stderr "
            f"of the last one: {failed[-1][-2000:]}",
            RuntimeWarning,
            stacklevel=2,
        )
    return done
