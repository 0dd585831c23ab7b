"""Answer checking with math-verify, off the event loop, with a time limit.

math-verify parses LaTeX and expressions with sympy, which can take long on adversarial input, and
its own time limits use ``signal.alarm`` (main thread only). So checks run in a pool of worker
processes (spawn context: safe with threads and torch in the parent) where both limits work, and the
caller awaits them with an outer deadline (counted from when a worker is free, not while queued). A check that times out, or a pool whose worker died,
returns a :class:`Verdict` with ``error`` set instead of raising; a dead pool is replaced.

The pool is shared by every environment in the process. Worker processes import ``__main__`` (spawn),
so scripts that create environments at import time need an ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import os
import threading
import weakref
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """``correct`` is math-verify's judgement; ``error`` says why no judgement was possible."""

    correct: bool
    error: str | None = None


def _warm_up() -> None:
    import math_verify  # noqa: F401  (import sympy and the grammars once per worker)


def check_answer(gold: str, prediction: str, timeout_s: int) -> bool:
    """Runs in a worker: does ``prediction`` (an extracted final answer) equal ``gold``?"""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    gold_parsed = parse(f"${gold}$", configs, parsing_timeout=timeout_s)
    if not gold_parsed:
        gold_parsed = parse(gold, configs, parsing_timeout=timeout_s)
    pred_parsed = parse(f"${prediction}$", configs, parsing_timeout=timeout_s)
    if not pred_parsed:
        pred_parsed = parse(prediction, configs, parsing_timeout=timeout_s)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout_s))


class VerifierPool:
    """A lazily started, self-healing process pool for :func:`check_answer`."""

    def __init__(self, workers: int | None = None):
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        # One semaphore per event loop keeps at most `workers` checks submitted, so the deadline
        # measures the check itself rather than time spent queued behind other checks.
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_warm_up,
                )
            return self._executor

    def _discard(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is broken:
                self._executor = None
        broken.shutdown(wait=False, cancel_futures=True)

    async def verify(self, gold: str, prediction: str, timeout_s: int = 5) -> Verdict:
        """Check ``prediction`` against ``gold`` without blocking the running loop.

        ``timeout_s`` bounds each of math-verify's parse and compare calls inside the worker; the
        outer deadline (four of those plus a margin for a cold worker start) catches a stuck worker.
        """
        loop = asyncio.get_running_loop()
        slots = self._slots.setdefault(loop, asyncio.Semaphore(self.workers))
        async with slots:
            executor = self.executor()
            try:
                future = loop.run_in_executor(executor, check_answer, gold, prediction, timeout_s)
                correct = await asyncio.wait_for(future, timeout=4 * timeout_s + 60)
            except TimeoutError:
                self._discard(executor)
                return Verdict(False, f"verifier timed out after {4 * timeout_s + 60} s")
            except BrokenProcessPool:
                self._discard(executor)
                return Verdict(False, "verifier worker died; pool restarted")
            except Exception as exc:
                return Verdict(False, f"verifier failed: {type(exc).__name__}: {exc}")
        return Verdict(correct)

    def shutdown(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


shared_pool = VerifierPool()
atexit.register(shared_pool.shutdown)
