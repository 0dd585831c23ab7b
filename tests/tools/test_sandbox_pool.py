"""SandboxPool: warm sandboxes, one per episode, crashed ones detected and replaced."""

import asyncio
import os
import signal

import pytest

from agentrl.tools import SandboxError, SandboxLimits, SandboxPool, sandbox_factory

LIMITS = SandboxLimits(memory_mb=256, pids=64)


async def test_sandboxes_are_started_ahead_and_never_reused():
    async with SandboxPool(sandbox_factory("bwrap", LIMITS), warm=2) as pool:
        await asyncio.sleep(0.5)
        assert pool.stats.started == 2  # warmed before anyone asked
        seen = set()
        for _ in range(3):
            async with pool.acquire() as box:
                seen.add(box.pid)
                assert (await box.run_python("print(1)")).stdout == "1\n"
            assert not box.alive  # destroyed at release
        assert len(seen) == 3 and pool.stats.served == 3


async def test_an_idle_sandbox_that_died_is_replaced_at_hand_out():
    async with SandboxPool(sandbox_factory("bwrap", LIMITS), warm=1) as pool:
        async with pool.acquire() as box:
            pass
        await asyncio.sleep(0.5)  # the refill is idle in the pool now
        idle = pool._idle._queue[0]
        os.killpg(idle.pid, signal.SIGKILL)  # bubblewrap's child follows by PR_SET_PDEATHSIG
        for _ in range(100):  # until the agent's stream has ended
            if not idle.alive:
                break
            await asyncio.sleep(0.05)
        async with pool.acquire() as box:
            assert box is not idle and (await box.exec("echo ok")).stdout == "ok\n"
        assert pool.stats.crashed == 1


async def test_many_concurrent_episodes_each_get_their_own_sandbox():
    async with SandboxPool(sandbox_factory("bwrap", LIMITS), warm=2) as pool:

        async def episode(i: int) -> str:
            async with pool.acquire() as box:
                await box.write_file("id.txt", str(i))
                await asyncio.sleep(0.1)
                return (await box.read_file("id.txt")).decode()

        assert await asyncio.gather(*(episode(i) for i in range(8))) == [str(i) for i in range(8)]


async def test_closed_pools_and_unknown_backends_raise():
    pool = SandboxPool(sandbox_factory("bwrap", LIMITS), warm=1)
    async with pool:
        pass
    with pytest.raises(SandboxError, match="closed"):
        async with pool.acquire():
            pass
    with pytest.raises(ValueError, match="unknown sandbox backend 'firecracker'"):
        sandbox_factory("firecracker")
    with pytest.raises(ValueError, match="warm"):
        SandboxPool(sandbox_factory("bwrap"), warm=-1)
