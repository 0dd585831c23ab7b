"""glibc's malloc for a training process: one arena (``agentrl train`` and ``agentrl sft`` call
:func:`limit_malloc_arenas` first), large blocks always mapped on their own
(:func:`fix_mmap_threshold`, called beside it), and freed heap memory handed back
(:func:`trim_heap`, which the trainer calls between micro-batches when ``actor.trim_heap`` is on).

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

Large blocks. glibc serves a block of at least ``M_MMAP_THRESHOLD`` bytes with its own ``mmap``,
and ``free`` unmaps it at once; smaller ones come from the heap, where a freed chunk stays resident
until a later request fits it. The threshold starts at 128 KiB and glibc raises it to the size of
every mapped block that is freed (up to 32 MiB), so after the first micro-batches a training
step's activations and per-layer gradients (SmolLM2 at 1,024 tokens: 2.4 MB hidden-state and
6.3 MB MLP tensors, 1-3.5 MB weight gradients) all come from the heap, in sizes that fragment it.
:func:`fix_mmap_threshold` fixes it at 4 MiB (which also turns glibc's raising off), so the larger
of them are mapped on their own again. Measured on the demo's GRPO (two steps of
``examples/math_tool_grpo_cpu.yaml`` from its SFT model, AMD EPYC Zen 4, 2 cores, single runs;
docs/performance.md): the step-2 peak went from 4.07 to 4.03 GB on one batch (this change alone)
and from 4.14 to 4.01 GB on another (with ended episodes' prefix-cache entries dropped as well),
with the same training time; lower thresholds take more (2 MiB 3.87 GB, 1 MiB 3.74 GB) but train
18-28% slower, as every mapped block is zero-filled page by page when first touched.
``MALLOC_MMAP_THRESHOLD_`` in the environment wins.

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

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
M_ARENA_MAX = -8
MMAP_THRESHOLD = 4 << 20
"""The training processes' fixed mmap threshold (see the module docstring)."""


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


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Serve every block of ``nbytes`` or more with its own mapping for the rest of the process
    (glibc's ``M_MMAP_THRESHOLD``, which also stops glibc raising it); True if set, False where
    the environment sets ``MALLOC_MMAP_THRESHOLD_`` or the C library is not glibc."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or _LIBC is None:
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, nbytes))


def trim_heap() -> bool:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim(0)``); True if any
    were, False when none were or the C library is not glibc."""
    return bool(_LIBC.malloc_trim(0)) if _LIBC is not None else False
