"""One adversarial test per isolation property, on both sandbox backends.

The container backend needs Podman's (or Docker's) API at ``DOCKER_HOST`` and the image from
``sandboxes/build.sh``; the test command sets both up, so these tests fail rather than skip when
they are missing.
"""

import asyncio
import os
import signal
from pathlib import Path

import pytest

from agentrl.tools import SandboxCrashed, SandboxLimits, SandboxPool, sandbox_factory
from agentrl.tools.bwrap import BubblewrapSandbox
from agentrl.tools.container import ContainerSandbox, connect

LIMITS = SandboxLimits(memory_mb=256, pids=64, cpus=1.0, disk_mb=64, max_file_mb=8)
BACKENDS = ["bwrap", pytest.param("container", marks=pytest.mark.slow)]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
async def sandbox(backend):
    async with await sandbox_factory(backend, LIMITS)() as box:
        yield box


def host_processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def kill_from_outside(box) -> None:
    """Kill the whole box the way a crash would: not through the agent."""
    if isinstance(box, BubblewrapSandbox):
        os.killpg(box.pid, signal.SIGKILL)
    else:
        assert isinstance(box, ContainerSandbox)
        connect().containers.get(box.container_id).kill()


async def test_network_egress_is_refused(sandbox):
    code = "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=3)"
    result = await sandbox.run_python(code)
    assert result.exit_code == 1
    assert "Network is unreachable" in result.stderr or "Errno 101" in result.stderr


async def test_writes_outside_the_work_directory_are_refused(sandbox):
    result = await sandbox.exec(
        "id -u; for p in /usr/evil /etc/evil /evil /bin/evil; do "
        "touch $p 2>/dev/null && echo WROTE $p; done; touch /work/ok /tmp/ok && echo fine"
    )
    assert result.stdout == "65534\nfine\n"
    assert "0000000000000000" in (await sandbox.exec("grep CapEff /proc/self/status")).stdout


async def test_file_size_limit_stops_a_disk_bomb(sandbox):
    result = await sandbox.exec("head -c 100000000 /dev/zero > big; echo $?; wc -c < big")
    assert "File size limit exceeded" in result.stderr
    status, size = result.stdout.split()
    assert status != "0" and int(size) == LIMITS.max_file_mb << 20


async def test_fork_bomb_is_contained_by_the_pids_limit(sandbox):
    bomb = "import os\nwhile True:\n    os.fork()"
    result = await sandbox.exec(["python3", "-c", bomb], timeout=5)
    assert result.timed_out or result.exit_code != 0
    assert "Resource temporarily unavailable" in result.stderr or result.timed_out
    after = await sandbox.run_python("print('alive')")  # the box recovers
    assert after.stdout == "alive\n"
    # and no zombies hold the pids limit: an init in the box reaps the bomb's orphans
    count = "import os, time; time.sleep(1); print(sum(p.isdigit() for p in os.listdir('/proc')))"
    assert int((await sandbox.run_python(count)).stdout) < 10


async def test_memory_bomb_is_killed_and_the_host_is_not(sandbox):
    result = await sandbox.exec(["python3", "-c", "b = bytearray(1 << 30)"], timeout=30)
    assert result.exit_code in (-9, 137) or "MemoryError" in result.stderr
    assert (await sandbox.exec("echo still here")).stdout == "still here\n"


async def test_infinite_loop_is_killed_at_the_timeout_with_no_orphans(sandbox):
    marker = "987654.5"
    command = f"sleep {marker} & sleep {marker} & while true; do :; done"
    result = await sandbox.exec(command, timeout=1.0)
    assert result.timed_out and result.exit_code is None
    assert 1.0 <= result.duration_s < 5.0
    inside = await sandbox.exec(f"grep -l '[{marker[0]}]{marker[1:]}' /proc/[0-9]*/cmdline || true")
    assert inside.stdout == ""
    assert host_processes_with(f"sleep {marker}") == []
    looped = await sandbox.run_python("x = 1\nwhile True: pass", timeout=1.0)
    assert looped.timed_out and looped.restarted
    assert (await sandbox.run_python("print('fresh')")).stdout == "fresh\n"


async def test_huge_output_is_truncated_at_the_cap(sandbox):
    result = await sandbox.exec(
        "yes | head -c 5000000; yes e | head -c 300000 >&2", max_output_bytes=1000
    )
    assert result.truncated and result.exit_code == 0
    assert len(result.stdout) == 1000 and len(result.stderr) == 1000
    printed = await sandbox.run_python("print('x' * 10**6)", max_output_bytes=100)
    assert printed.truncated and printed.stdout == "x" * 100


async def test_a_box_killed_mid_call_errors_and_the_pool_replaces_it(backend):
    async with SandboxPool(sandbox_factory(backend, LIMITS), warm=1) as pool:
        async with pool.acquire() as box:
            call = asyncio.create_task(box.exec("sleep 60", timeout=120))
            await asyncio.sleep(0.5)
            kill_from_outside(box)
            with pytest.raises(SandboxCrashed):
                await asyncio.wait_for(call, 30)
            assert not box.alive
            with pytest.raises(SandboxCrashed):
                await box.run_python("1")
        assert pool.stats.crashed == 1
        async with pool.acquire() as fresh:
            assert (await fresh.run_python("print(2)")).stdout == "2\n"


async def test_state_from_one_episode_is_never_visible_in_the_next(backend):
    marker = "876543.5"
    async with SandboxPool(sandbox_factory(backend, LIMITS), warm=2) as pool:
        async with pool.acquire() as first:
            await first.write_file("secret.txt", "episode one")
            await first.exec("echo leak > /tmp/leak")
            await first.run_python("secret = 1")
            # setsid: the sleeper leaves the command's process group, so it outlives the call
            await first.exec(f"setsid sleep {marker} >/dev/null 2>&1 < /dev/null & sleep 0.5")
            assert host_processes_with(f"sleep {marker}")
        async with pool.acquire() as second:
            listing = await second.exec("ls -A /work /tmp | grep -v agentrl || true")
            assert "secret" not in listing.stdout and "leak" not in listing.stdout
            assert (await second.run_python("print('secret' in dir())")).stdout == "False\n"
            pattern = f"[{marker[0]}]{marker[1:]}"  # matches the sleeper, not grep itself
            seen = await second.exec(f"grep -l '{pattern}' /proc/[0-9]*/cmdline || true")
            assert seen.stdout == ""
    assert host_processes_with(f"sleep {marker}") == []
