"""`agentrl.malloc`: glibc's arenas capped for a training process (`limit_malloc_arenas`), freed
heap pages handed back (`trim_heap`).

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


TRIM = """
import ctypes
from agentrl.malloc import trim_heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD: 64 KiB blocks come from the heap, not mmap
def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024
blocks, guards = [], []
for _ in range(3200):  # 200 MiB of heap, each block followed by a small live one
    blocks.append(libc.malloc(64 << 10))
    ctypes.memset(blocks[-1], 1, 64 << 10)  # resident
    guards.append(libc.malloc(64))
for block in blocks:  # freed, but fragmented: no free chunk borders the heap's top
    libc.free(block)
freed = rss()
trimmed = trim_heap()
print(trimmed, freed - rss())
"""


def test_trim_heap_hands_freed_heap_pages_back() -> None:
    """Freed heap chunks between live blocks stay resident until trim_heap returns them."""
    run = subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    trimmed, returned = run.stdout.split()
    assert trimmed == "True"
    assert int(returned) > 150 << 20  # most of the 200 MiB freed
