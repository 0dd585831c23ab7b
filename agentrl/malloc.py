"""glibc's malloc for a training process: one arena (``agentrl train`` and ``agentrl sft`` call
:func:`limit_malloc_arenas` first), and freed heap memory handed back (:func:`trim_heap`, which
the trainer calls between micro-batches when ``actor.trim_heap`` is on).

glibc gives each thread that allocates its own arena (up to 8 per core), and memory freed in one
arena serves only allocations from that arena. A trainer process allocates from several threads at
once: the training step runs in a worker thread while the embedded engine generates from another,
so the engine's freed KV cache and activations cannot serve the trainer's and the process's
resident set grows to about the sum of each thread's peak. With one arena they reuse each other's
freed memory. Measured on the demo's GRPO (two steps of ``examples/math_tool_grpo_cpu.yaml``, AMD
EPYC Zen 4, 2 cores): peak RSS 4.81 -> 4.24 GB, step time unchanged within noise
(docs/performance.md). Threads then share the arena's lock; a training process allocates large
tensors from few threads, so the contention is not measurable there.

``MALLOC_ARENA_MAX`` in the environment wins (nothing is changed then); other C libraries (musl)
and other systems are left alone.

What is freed stays resident: glibc keeps freed heap chunks for reuse, and a chunk that no later
request fits (activations, logits and gradients come in many sizes) holds its pages. ``malloc_trim``
returns the free pages anywhere in the heap to the system (``MADV_DONTNEED``); the next
allocations fault fresh pages in. Between micro-batches that is what one micro-batch's peak
leaves behind (docs/performance.md: about 0.5 GB of the demo's GRPO peak).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8  # glibc's malloc.h


def _glibc() -> ctypes.CDLL | None:
    """The process's C library if it is glibc (mallopt and malloc_trim differ or are absent in
    others), else None."""
    if os.name != "posix":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") else None


_LIBC = _glibc()


def limit_malloc_arenas(arenas: int = 1) -> bool:
    """Cap glibc's malloc arenas at ``arenas`` for the rest of the process (arenas that threads
    already hold stay); True if the cap was set, False where the environment sets
    ``MALLOC_ARENA_MAX`` or the C library is not glibc."""
    if "MALLOC_ARENA_MAX" in os.environ or _LIBC is None:
        return False
    return bool(_LIBC.mallopt(M_ARENA_MAX, arenas))


def trim_heap() -> bool:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim(0)``); True if any
    were, False when none were or the C library is not glibc."""
    return bool(_LIBC.malloc_trim(0)) if _LIBC is not None else False
