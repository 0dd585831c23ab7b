"""`agentrl.malloc`: glibc's arenas capped for a training process (`limit_malloc_arenas`), large
blocks mapped on their own (`fix_mmap_threshold`), freed heap pages handed back (`trim_heap`).

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


MAPPED = """
import ctypes, sys
from agentrl.malloc import fix_mmap_threshold
print(fix_mmap_threshold() if sys.argv[1] == "fix" else None, flush=True)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024
libc.free(libc.malloc(8 << 20))  # a mapped block freed: glibc raises its threshold past 8 MiB
blocks = []
for _ in range(64):  # 384 MiB of 6 MiB blocks, the size of activations
    blocks.append(libc.malloc(6 << 20))
    ctypes.memset(blocks[-1], 1, 6 << 20)  # resident
held = rss()
for block in blocks[::2]:  # every other one: on the heap, each lies between live blocks
    libc.free(block)
print(held - rss())
"""


def freed_by(mode: str, **env: str) -> tuple[str, int]:
    environment = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"} | env
    run = subprocess.run(
        [sys.executable, "-c", MAPPED, mode], capture_output=True, text=True, env=environment
    )
    assert run.returncode == 0, run.stderr
    fixed, returned = run.stdout.split()
    return fixed, int(returned)


def test_a_fixed_threshold_returns_large_blocks_at_free() -> None:
    """glibc's raised threshold puts 6 MiB blocks on the heap, where a freed one stays resident
    between live ones; with the threshold fixed at 4 MiB each is its own mapping, gone at free."""
    fixed, returned = freed_by("fix")
    assert fixed == "True" and returned > 180 << 20
    fixed, returned = freed_by("default")
    assert fixed == "None" and returned < 20 << 20  # what the fix changes
    fixed, returned = freed_by("fix", MALLOC_MMAP_THRESHOLD_=str(16 << 20))  # the environment wins
    assert fixed == "False" and returned < 20 << 20
