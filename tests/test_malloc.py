"""`agentrl.malloc.limit_malloc_arenas`: glibc's arenas capped for a training process.

Each case runs in a fresh interpreter (the cap acts on arenas made later in the process): threads
allocate and free small blocks, then glibc's ``malloc_stats`` lists the arenas on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import ctypes, sys, threading
from agentrl.malloc import limit_malloc_arenas
print(limit_malloc_arenas() if sys.argv[1] == "cap" else None, flush=True)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
barrier = threading.Barrier(4)
def work():
    barrier.wait()  # all four threads allocate at once: glibc would give each its own arena
    blocks = [libc.malloc(4096) for _ in range(2000)]
    for block in blocks:
        libc.free(block)
threads = [threading.Thread(target=work) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
libc.malloc_stats()
"""

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc only",
)


def arenas(mode: str, **env: str) -> tuple[str, int]:
    environment = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    run = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=environment
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip(), run.stderr.count("Arena ")


def test_one_arena_serves_every_thread_once_capped() -> None:
    assert arenas("cap") == ("True", 1)
    printed, uncapped = arenas("no cap")
    assert printed == "None"
    assert uncapped > 1  # what the cap changes: glibc's default gives threads arenas of their own


def test_the_environment_wins() -> None:
    result, count = arenas("cap", MALLOC_ARENA_MAX="3")
    assert result == "False" and 1 < count <= 3
