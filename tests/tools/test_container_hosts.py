"""ContainerHosts: container sandboxes spread over several engines, a failed one out and back in.

The slow tests start two more Podman API services, on sockets of their own over the host's image
store (so the images are there), spread real sandboxes over them, kill one while its sandboxes are
in use, restart it, then kill both; and copy an image to a third service with a store of its own.
"""

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from agentrl.tools import SandboxCrashed, SandboxError, SandboxLimits, SandboxPool, sandbox_factory
from agentrl.tools.container import LABEL, remove_by_id
from agentrl.tools.container_hosts import ENV_VAR, ContainerHosts, HostConfig
from bench.podman_services import PodmanService

LIMITS = SandboxLimits(memory_mb=128, pids=32)
BUILD = Path(__file__).parents[2] / "sandboxes" / "build.sh"


A = "unix:///run/agentrl-test/a.sock"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://localhost:2375", "scheme must be one of"),
        ("unix://relative.sock", "absolute path"),
        ("tcp://engine", "host and a port"),
        ("tcp://engine:port", "host and a port"),
        ("ssh://", "needs a host"),
        ("/run/podman/podman.sock", "scheme"),
    ],
)
def test_malformed_host_urls_fail_with_the_url_and_the_rule(url, problem):
    with pytest.raises(ValueError, match=problem) as error:
        HostConfig(url)
    assert repr(url) in str(error.value)


def test_configuration_errors_are_clear(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="TLS options apply to tcp"):
        HostConfig(A, tls_ca_cert=str(tmp_path / "ca.pem"))
    with pytest.raises(ValueError, match=r"TLS file.*ca\.pem"):
        HostConfig("tcp://engine:2376", tls_ca_cert=str(tmp_path / "ca.pem"))
    with pytest.raises(ValueError, match="unique"):
        ContainerHosts([A, A])
    with pytest.raises(ValueError, match="client or hosts"):
        sandbox_factory("container", hosts=ContainerHosts([A]), client=object())
    monkeypatch.setenv(ENV_VAR, f"{A},engine.example:2376")
    with pytest.raises(ValueError, match=r"'engine\.example:2376'.*scheme"):
        sandbox_factory("container")


async def test_unreachable_tls_and_ssh_endpoints_fail_fast_with_their_errors(tmp_path, monkeypatch):
    """TLS over tcp:// and ssh:// are checked only this far: client construction, no engine."""
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("not a certificate\n")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(tmp_path))
    tls = HostConfig.from_url("tcp://127.0.0.1:1")
    assert tls.tls and tls.tls_client_cert == (
        str(tmp_path / "cert.pem"),
        str(tmp_path / "key.pem"),
    )
    hosts = ContainerHosts([tls, "ssh://nobody@127.0.0.1:1"])
    started = time.monotonic()
    with pytest.raises(SandboxError, match="no container host") as error:
        await hosts.start(LIMITS)
    assert time.monotonic() - started < 20
    assert str(error.value).count("down (") == 2


@pytest.fixture
def two_services():
    if os.geteuid() != 0 or shutil.which("podman") is None:
        pytest.fail("these tests need root and podman: run `sudo sandboxes/setup.sh`")
    directory = Path(tempfile.mkdtemp(prefix="agentrl-hosts-"))
    services = [PodmanService(directory / "a.sock"), PodmanService(directory / "b.sock")]
    try:
        for service in services:
            service.start()
        for service in services:
            service.wait_until_answering()
        yield services
    finally:
        for service in services:
            service.kill()
        # The containers this process made, on any host (they share one store): removed.
        mine = f"label={LABEL}={socket.gethostname()}:{os.getpid()}"
        ids = subprocess.run(
            ["podman", "ps", "-aq", "--filter", mine], capture_output=True, text=True, check=True
        ).stdout.split()
        if ids:
            subprocess.run(["podman", "rm", "-f", *ids], capture_output=True, check=True)
        shutil.rmtree(directory)


@pytest.mark.slow
async def test_two_hosts_spread_fail_over_recover_and_all_down(two_services, caplog):
    a, b = two_services
    hosts = ContainerHosts([a.url, b.url], retry_after_s=0.5)
    factory = sandbox_factory("container", LIMITS, hosts=hosts)
    try:
        # (a) Spread: four sandboxes, two per host.
        boxes = await asyncio.gather(*(factory() for _ in range(4)))
        on_a = [box for box in boxes if hosts.host_of(box) == a.url]
        on_b = [box for box in boxes if hosts.host_of(box) == b.url]
        assert len(on_a) == len(on_b) == 2
        assert [s.live for s in hosts.status()] == [2, 2]

        # (b) Host a dies while its sandboxes are in use: their calls fail as any crash does;
        # new sandboxes, warm ones included, all go to b; nothing escapes the pool.
        calls = [asyncio.ensure_future(box.exec("sleep 5; echo late")) for box in on_a]
        await asyncio.sleep(0.3)
        a.kill()
        for call in calls:
            with pytest.raises(SandboxCrashed):
                await call
        for box in on_b:
            assert (await box.exec("echo ok")).stdout == "ok\n"
        async with SandboxPool(factory, warm=2) as pool:
            for _ in range(3):
                async with pool.acquire() as box:
                    assert hosts.host_of(box) == b.url
                    assert (await box.run_python("6 * 7")).stdout == "42\n"
        status = hosts.status()
        assert not status[0].healthy and status[1].healthy and "Error" in status[0].error
        assert caplog.text.count(f"container host {a.url} is out of rotation") == 1  # not per start
        for box in boxes:
            await box.close()  # the dead host's sandboxes close without raising

        # (c) Host a is back: once a health check (made by each start, at most every
        # retry_after_s) reaches it, it is the least loaded again. On a loaded machine the first
        # pings of a service just started may time out, so checks are repeated until one answers.
        a.start()
        a.wait_until_answering()
        async with asyncio.timeout(120):
            while not hosts.status()[0].healthy:
                await asyncio.sleep(0.5)
                await hosts.check()
        async with await factory() as box:
            assert hosts.host_of(box) == a.url
            assert (await box.exec("echo back")).stdout == "back\n"
        assert hosts.status()[0].healthy

        # A host's cap: with one sandbox alive on it, it is full and says so.
        capped = ContainerHosts([HostConfig(b.url, name="b", max_sandboxes=1)])
        try:
            async with await capped.start(LIMITS):
                with pytest.raises(SandboxError, match=r"b: full \(1 sandboxes\)"):
                    await capped.start(LIMITS)
                assert [s.live for s in capped.status()] == [1]
        finally:
            capped.close()

        # (d) Both down: one error naming each host and why.
        a.kill()
        b.kill()
        await asyncio.sleep(0.5)
        with pytest.raises(SandboxError, match="no container host can take a sandbox") as error:
            await factory()
        assert f"{a.url}: down (" in str(error.value) and f"{b.url}: down (" in str(error.value)
    finally:
        hosts.close()


def _exists(container_id: str) -> bool:
    return subprocess.run(["podman", "container", "exists", container_id]).returncode == 0


@pytest.mark.slow
async def test_close_removes_what_a_dead_host_left_and_says_when_it_cannot(two_services, caplog):
    a, _ = two_services
    hosts = ContainerHosts([a.url], retry_after_s=0.0)
    boxes = [await hosts.start(LIMITS) for _ in range(3)]
    ids = [box.container_id for box in boxes]
    a.kill()
    for box in boxes:
        await box.close()  # the engine is gone: the containers are left on the host
    assert all(_exists(i) for i in ids)

    # The host is back. A check starts removing them in a thread and its caller goes away
    # (cancelled, as an episode is at the end of a run); close waits for that removal and
    # removes what is left.
    a.start()
    a.wait_until_answering()
    check = asyncio.ensure_future(hosts.check())
    await asyncio.sleep(0.05)
    check.cancel()
    hosts.close()
    assert not any(_exists(i) for i in ids)
    assert "are left on container host" not in caplog.text

    # A host that does not answer at close: its leftovers stay, and the warning says why.
    hosts = ContainerHosts([a.url], retry_after_s=0.0)
    box = await hosts.start(LIMITS)
    a.kill()
    await box.close()
    hosts.close()
    assert _exists(box.container_id)
    assert f"1 sandbox containers are left on container host {a.url} (" in caplog.text
    assert "does not answer" in caplog.text


@pytest.mark.slow
async def test_remove_by_id_removes_a_container_without_inspecting_it(two_services, caplog):
    a, _ = two_services
    hosts = ContainerHosts([a.url])
    try:
        box = await hosts.start(LIMITS)
        client = HostConfig(a.url).client()
        assert remove_by_id(client, box.container_id) and not _exists(box.container_id)
        assert remove_by_id(client, box.container_id)  # already gone: nothing to do
        other = await hosts.start(LIMITS)
        a.kill()
        assert not remove_by_id(client, other.container_id)  # the engine is gone: logged only
        assert "its engine is unreachable" in caplog.text and _exists(other.container_id)
        client.close()
        await box.close()
    finally:
        hosts.close()


@pytest.fixture
def own_store_service():
    """A Podman service with an image store of its own, empty at first."""
    directory = Path(tempfile.mkdtemp(prefix="agentrl-store-", dir="/var/tmp"))
    service = PodmanService(directory / "c.sock", store=directory)
    try:
        service.start()
        service.wait_until_answering()
        yield service
    finally:
        service.kill()
        service.unmount_store()
        shutil.rmtree(directory)


@pytest.mark.slow
def test_build_script_makes_the_image_available_on_every_host(two_services, own_store_service):
    urls = [service.url for service in (*two_services, own_store_service)]
    build = [str(BUILD), "python", "--hosts", ",".join(urls)]
    first = subprocess.run(build, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    for url in urls[:2]:  # they share this machine's store: nothing to load
        assert f"agentrl-python:latest: up to date on {url}" in first.stderr
    assert f"agentrl-python:latest: loaded on {urls[2]}" in first.stderr
    again = subprocess.run(build, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "loading" not in again.stderr, again.stderr
    assert again.stderr.count("agentrl-python:latest: up to date on") == 3
    bad = subprocess.run([str(BUILD), "--hosts", "a.sock"], capture_output=True, text=True)
    assert bad.returncode == 1 and "bad host URL 'a.sock'" in bad.stderr
