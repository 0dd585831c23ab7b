"""Environment servers for tests: ``agentrl env serve`` as real processes on loopback, with the
test environments of ``tests/env_server/serve_test_envs.py`` registered."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agentrl.engine_pool.sglang_engine import free_port

SERVE = Path(__file__).parent / "env_server" / "serve_test_envs.py"


def start_server(env_id: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``agentrl env serve ENV_ID ARGS`` (bodies up to 64 KiB); (process, base URL)."""
    port = free_port()
    command = [sys.executable, str(SERVE), "serve", env_id, *args, "--port", str(port)]
    command += ["--max-body-bytes", "65536"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return process, f"http://127.0.0.1:{port}"


def wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()
    if "(ready)" not in line:
        process.kill()
        pytest.fail(f"the server did not start: {line}{process.communicate()[1]}")


@contextmanager
def env_servers(**specs: list[str]) -> Iterator[dict[str, tuple[subprocess.Popen[str], str]]]:
    """``name=[ENV_ID, args...]`` servers, started together, ready on entry; each must exit 0
    on SIGTERM (its sessions closed) unless a test killed it."""
    started = {name: start_server(*spec) for name, spec in specs.items()}
    try:
        for process, _ in started.values():
            wait_ready(process)
        yield started
    finally:
        for process, _ in started.values():
            if process.poll() is None:
                process.terminate()
        for process, _ in started.values():
            code = process.wait(timeout=30)
            assert code in (0, -9), process.stderr.read() if process.stderr else ""
