import asyncio
import os
import signal

import pytest

from agentrl.envs.math.verifier import VerifierPool


@pytest.fixture(scope="module")
def pool():
    pool = VerifierPool(workers=2)
    yield pool
    pool.shutdown()


@pytest.mark.parametrize(
    ("gold", "prediction", "correct"),
    [
        ("7", "7", True),
        ("1234", "1,234", True),
        ("\\frac{3}{4}", "0.75", True),
        ("\\frac{3}{4}", "\\dfrac{3}{4}", True),
        ("2", "3", False),
        ("x^2+1", "1+x^2", True),
        ("7", "seven-ish", False),
    ],
)
async def test_verdicts(pool, gold, prediction, correct):
    verdict = await pool.verify(gold, prediction)
    assert verdict.correct is correct and verdict.error is None


async def test_a_killed_worker_gives_an_error_verdict_and_the_pool_recovers():
    """One worker, so the check submitted after the kill cannot be served by a survivor."""
    pool = VerifierPool(workers=1)
    try:
        assert (await pool.verify("1", "1")).correct
        worker = await asyncio.get_running_loop().run_in_executor(pool.executor(), os.getpid)
        os.kill(worker, signal.SIGKILL)
        verdict = await pool.verify("1", "1")
        assert verdict.correct is False and "died" in verdict.error
        assert (await pool.verify("2", "2")).correct, "a fresh pool serves the next check"
    finally:
        pool.shutdown()
