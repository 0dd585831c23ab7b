"""The sandbox protocol through the bubblewrap backend (the container backend shares the agent and
client code; tests/tools/test_sandbox_isolation.py runs both), and the backends' start errors."""

import asyncio
import gc
import os
import signal

import docker
import psutil
import pytest

from agentrl.tools import BubblewrapSandbox, SandboxCrashed, SandboxError, SandboxLimits
from agentrl.tools.container import ContainerSandbox


@pytest.fixture
async def sandbox():
    async with await BubblewrapSandbox.start(SandboxLimits(memory_mb=256, pids=64)) as box:
        yield box


async def test_exec_reports_exit_code_output_and_stdin(sandbox):
    result = await sandbox.exec("cat; echo err >&2; exit 3", stdin="from stdin\n")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "from stdin\n", "err\n")
    assert not result.timed_out and not result.truncated and result.duration_s > 0
    argv = await sandbox.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "c"])
    assert argv.stdout == "['a b', 'c']\n"
    assert (await sandbox.exec("pwd")).stdout == f"{sandbox.workdir}\n"
    killed = await sandbox.exec("kill -9 $$")
    assert killed.exit_code == -9


async def test_python_keeps_state_prints_trailing_values_and_reports_errors(sandbox):
    assert (await sandbox.run_python("import math\nx = 6")).stdout == ""
    assert (await sandbox.run_python("x * 7")).stdout == "42\n"
    assert (await sandbox.run_python("math.sqrt(x * 6)")).stdout == "6.0\n"
    assert (await sandbox.run_python("None")).stdout == ""
    raised = await sandbox.run_python("1 / 0")
    assert raised.exit_code == 1 and raised.stderr.endswith("ZeroDivisionError: division by zero\n")
    assert "agentrl" not in raised.stderr  # the traceback shows only the user's code
    assert (await sandbox.run_python("def (:")).exit_code == 1
    exited = await sandbox.run_python("import sys\nsys.exit(4)")
    assert exited.exit_code == 4 and not exited.restarted
    assert (await sandbox.run_python("print(x)")).stdout == "6\n"  # still the same interpreter
    shell = await sandbox.run_python("import os\nos.system('echo from a child')")
    assert shell.stdout == "from a child\n0\n"  # fd-level output is captured too
    died = await sandbox.run_python("import os\nos._exit(9)")
    assert died.restarted and died.exit_code == 9
    assert (await sandbox.run_python("'x' in dir()")).stdout == "False\n"
    reads = await sandbox.run_python("input()")
    assert reads.exit_code == 1 and "EOFError" in reads.stderr  # stdin is not the control channel


async def test_files_round_trip_and_errors_are_clear(sandbox):
    await sandbox.write_file("deep/dir/data.bin", bytes(range(256)))
    assert await sandbox.read_file("deep/dir/data.bin") == bytes(range(256))
    assert await sandbox.read_file("/work/deep/dir/data.bin", max_bytes=3) == b"\x00\x01\x02"
    await sandbox.write_file("text.txt", "héllo")
    assert (await sandbox.exec("cat text.txt")).stdout == "héllo"
    with pytest.raises(SandboxError, match="No such file"):
        await sandbox.read_file("missing.txt")
    with pytest.raises(SandboxError, match=r"Read-only file system|Permission denied"):
        await sandbox.write_file("/usr/evil", "x")
    assert sandbox.alive  # a refused request leaves the sandbox usable


async def test_calls_run_concurrently(sandbox):
    started = asyncio.get_running_loop().time()
    results = await asyncio.gather(*(sandbox.exec(f"sleep 1; echo {i}") for i in range(4)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
    assert asyncio.get_running_loop().time() - started < 3.5


async def test_bad_arguments_and_closed_sandboxes_raise(sandbox):
    with pytest.raises(ValueError, match="timeout"):
        await sandbox.exec("true", timeout=0)
    with pytest.raises(ValueError, match="max_output_bytes"):
        await sandbox.run_python("1", max_output_bytes=-1)
    await sandbox.close()
    await sandbox.close()
    assert not sandbox.alive
    with pytest.raises(SandboxCrashed, match="closed"):
        await sandbox.exec("true")


async def test_a_dead_agent_fails_pending_and_later_calls(sandbox):
    call = asyncio.create_task(sandbox.exec("sleep 30", timeout=60))
    await asyncio.sleep(0.3)
    with pytest.raises(SandboxCrashed, match="exited"):  # the agent is the shell's parent
        await sandbox.exec("kill -9 $PPID")
    with pytest.raises(SandboxCrashed, match="exited"):
        await asyncio.wait_for(call, 15)
    with pytest.raises(SandboxCrashed):
        await sandbox.run_python("1")


async def test_a_call_the_agent_never_answers_fails_and_leaves_no_unretrieved_error(sandbox):
    """A frozen agent: the call gives up after its wait, the sandbox is marked crashed, and the
    reply future it failed is not left for asyncio to report as a never-retrieved exception."""
    reports: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: reports.append(context))
    for process in psutil.Process(sandbox.pid).children(recursive=True):  # the agent among them
        process.send_signal(signal.SIGSTOP)
    with pytest.raises(SandboxCrashed, match=r"did not answer a 'ping' call within 0\.5 s"):
        await sandbox.ping(timeout=0.5)
    with pytest.raises(SandboxCrashed, match="did not answer"):
        await sandbox.run_python("1")
    gc.collect()
    assert [r["message"] for r in reports] == []


async def test_bwrap_start_errors_are_clear():
    with pytest.raises(SandboxError, match="no Python interpreter"):
        await BubblewrapSandbox.start(python="/usr/bin/no-such-python")
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)


@pytest.mark.slow
async def test_container_start_errors_are_clear(monkeypatch):
    with pytest.raises(SandboxError, match="not found: build it"):
        await ContainerSandbox.start(image="localhost/agentrl-no-such-image:latest")
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/agentrl-no-such-engine.sock")
    with pytest.raises(SandboxError, match="no container engine answers"):
        await ContainerSandbox.start()
    assert docker  # the SDK is a dependency of the project


@pytest.mark.slow
def test_remove_orphans_clears_containers_of_dead_owners_only():
    from agentrl.tools.container import DEFAULT_IMAGE, LABEL, connect, remove_orphans

    client = connect()
    host = __import__("socket").gethostname()
    dead = client.containers.create(DEFAULT_IMAGE, ["true"], labels={LABEL: f"{host}:999999999"})
    mine = client.containers.create(
        DEFAULT_IMAGE, ["true"], labels={LABEL: f"{host}:{os.getpid()}"}
    )
    try:
        assert remove_orphans(client) >= 1
        listed = client.containers.list(all=True, filters={"label": LABEL}, sparse=True)
        ids = {c.id for c in listed}  # sparse: other tests' containers come and go meanwhile
        assert dead.id not in ids and mine.id in ids
    finally:
        mine.remove(force=True)


@pytest.mark.slow
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
async def test_a_closed_container_sandbox_leaves_no_socket_open():
    """The client start() made, and the attach stream's socket, are closed with the sandbox: the
    garbage collector would otherwise find them unclosed, in some later test."""
    sandbox = await ContainerSandbox.start()
    adapter = sandbox._client.api.get_adapter("http+docker://")
    attached = sandbox._connection.response._sock
    await sandbox.exec("true")
    assert len(adapter.pools) > 0 and attached.fileno() >= 0
    await sandbox.close()
    assert len(adapter.pools) == 0, "the client's connection pools are closed"
    await asyncio.sleep(0)  # the attach transport closes its socket on the next loop turn
    assert attached.fileno() == -1, "the attach stream's socket is really closed"
    del sandbox, adapter, attached
    with pytest.raises(SandboxError, match="not found: build it"):
        await ContainerSandbox.start(image="localhost/agentrl-no-such-image:latest")
    gc.collect()


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.3])
async def test_a_cancelled_container_start_leaves_no_container(after_s):
    """Cancelled while the engine creates, attaches or starts: the task ends cancelled (not as a
    failed start), and the container the engine made anyway is removed."""
    from agentrl.tools.container import LABEL, connect

    client = connect()
    mine = {"label": f"{LABEL}={__import__('socket').gethostname()}:{os.getpid()}"}
    before = {c.id for c in client.containers.list(all=True, filters=mine)}
    start = asyncio.ensure_future(ContainerSandbox.start(SandboxLimits(memory_mb=128)))
    await asyncio.sleep(after_s)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    left: set[str] = set()
    for _ in range(100):  # the engine call may still be running in its thread
        left = {c.id for c in client.containers.list(all=True, filters=mine)} - before
        if not left:
            break
        await asyncio.sleep(0.1)
    client.close()
    assert not left, f"containers left behind: {left}"


@pytest.mark.slow
async def test_a_writable_directory_is_empty_and_the_sandbox_users_and_variables_are_added():
    """``writable_dirs`` hides what the image holds there (the SWE base image's /usr/share/doc)
    behind an empty tmpfs the sandbox user owns, so git accepts a repository in it; the root
    file system stays read-only; ``environment`` adds variables; a relative path is refused."""
    where = "/usr/share/doc"
    async with await ContainerSandbox.start(
        image="localhost/agentrl-swe-base:latest",
        writable_dirs=[where],
        environment={"AGENTRL_PROBE": "yes"},
    ) as box:
        listing = await box.exec(f"ls -A {where}; stat -c %U {where}; echo $AGENTRL_PROBE")
        assert listing.stdout == "nobody\nyes\n", listing
        repo = await box.exec(f"cd {where} && git init -q && git status --short && echo ok")
        assert repo.stdout.endswith("ok\n"), repo
        elsewhere = await box.exec("touch /usr/share/other 2>&1; echo $?")
        assert "Read-only file system" in elsewhere.stdout
    with pytest.raises(ValueError, match="absolute paths"):
        await ContainerSandbox.start(writable_dirs=["testbed"])
