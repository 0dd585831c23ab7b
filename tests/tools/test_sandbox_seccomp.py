"""The system-call filter (agentrl.tools.seccomp), adversarially, on both sandbox backends.

Each backend runs one probe program once (a module-scoped fixture) that makes every denied call
with arguments an unfiltered kernel answers differently (success, ``EFAULT``, ``EBADF``,
``ESRCH``, ``ENOSYS`` where a feature is compiled out...), so on this project's machines
``EPERM`` can only come from the filter (checked once with an empty policy: every family test
failed); one test per denied family reads its part of the result. The probe's numbers are
x86_64's. The ordinary-work test runs on the host's ``/usr`` (bwrap) and on the SWE base image
(the Python image has nothing but ``python3``).
"""

import asyncio
import errno
import io
import json
import platform
import re
import zipfile

import pytest

from agentrl.tools import SandboxLimits, sandbox_factory, seccomp

LIMITS = SandboxLimits(memory_mb=512, pids=128, cpus=1.0, disk_mb=128, max_file_mb=32)
BACKENDS = ["bwrap", pytest.param("container", marks=pytest.mark.slow)]
SWE_IMAGE = "localhost/agentrl-swe-base:latest"

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the probe's system-call numbers are x86_64's"
)

# Each denied call, its x86_64 number and arguments. The unshare command, then clone, run before
# unshare(2): once that succeeds (no filter) the process sits in a user namespace without a uid
# mapping, where creating another one fails whatever the filter says.
PROBE = r"""
import ctypes, errno, json, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NEWUSER, SIGCHLD = 0x10000000, 17
CALLS = {
    "clone": (56, NEWUSER | SIGCHLD, 0, 0, 0, 0),
    "unshare": (272, NEWUSER),
    "clone3": (435, 0, 0),
    "setns": (308, -1, 0),
    "io_uring_setup": (425, 1, 0),
    "bpf": (321, 0, 0, 0),
    "keyctl": (250, 0, -3, 0),
    "add_key": (248, b"user", b"agentrl", b"x", 1, -2),
    "request_key": (249, b"user", b"agentrl-none", 0, 0),
    "userfaultfd": (323, 1),
    "perf_event_open": (298, 0, 0, -1, -1, 0),
    "mount": (165, 0, 0, 0, 0, 0),
    "umount2": (166, 0, 0),
    "kexec_load": (246, 0, 0, 0, 0),
    "init_module": (175, 0, 0, b""),
    "finit_module": (313, -1, b"", 0),
    "delete_module": (176, b"agentrl", 0),
    "ptrace": (101, 7, os.getpid(), 0, 0),
    "process_vm_readv": (310, os.getpid(), 0, 0, 0, 0, 0),
    "socket": (41, 40, 1, 0),
    "open_by_handle_at": (304, -1, 0, 0),
}
found = {}
command = subprocess.run(["unshare", "-U", "-r", "id", "-u"], capture_output=True, text=True)
found["unshare -U -r id -u"] = command.stdout.strip() or command.stderr.strip()
for name, (number, *args) in CALLS.items():
    ctypes.set_errno(0)
    result = libc.syscall(number, *args)
    if name == "clone" and result == 0:
        os._exit(0)
    if name == "clone" and result > 0:
        os.waitpid(result, 0)
    found[name] = "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
found["Seccomp"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")]
print(json.dumps(found))
"""

EPERM = errno.errorcode[errno.EPERM]
FAMILIES = {
    "user namespaces": {"clone": EPERM, "unshare": EPERM, "clone3": "ENOSYS", "setns": EPERM},
    "io_uring": {"io_uring_setup": EPERM},
    "bpf": {"bpf": EPERM},
    "keyrings": {"keyctl": EPERM, "add_key": EPERM, "request_key": EPERM},
    "userfaultfd": {"userfaultfd": EPERM},
    "perf events": {"perf_event_open": EPERM},
    "mounts": {"mount": EPERM, "umount2": EPERM},
    "kernel code": dict.fromkeys(
        ("kexec_load", "init_module", "finit_module", "delete_module"), EPERM
    ),
    "other processes": {"ptrace": EPERM, "process_vm_readv": EPERM},
    "vsock": {"socket": EPERM},
    "file handles": {"open_by_handle_at": EPERM},
}


async def _probe(backend: str) -> dict:
    async with await sandbox_factory(backend, LIMITS)() as box:
        await box.write_file("probe.py", PROBE)
        result = await box.exec(["python3", "probe.py"], timeout=60)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module", params=BACKENDS)
def probed(request) -> dict:
    """What the probe found in a fresh box of each backend (one box per backend)."""
    return asyncio.run(_probe(request.param))


@pytest.mark.parametrize("family", FAMILIES)
def test_denied_family_fails_with_its_errno(probed, family):
    expected = FAMILIES[family]
    assert {name: probed[name] for name in expected} == expected


def test_unshare_command_cannot_become_root(probed):
    assert "Operation not permitted" in probed["unshare -U -r id -u"]
    assert probed["Seccomp"] == ["2"]  # filter mode


def test_profile_and_compiled_filter_deny_the_same_calls():
    """libseccomp's readable form of the BPF program names every call of the JSON profile."""
    profile = seccomp.oci_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    profiled = {name for rule in profile["syscalls"] for name in rule["names"]}
    assert profiled == seccomp.denied_names()
    readable = seccomp.readable_filter()
    compiled = set(re.findall(r'# filter for syscall "(\w+)"', readable))
    # libseccomp adds i386's socketcall(SYS_SOCKET) for the socket rule (its arguments are hidden)
    assert compiled == profiled | {"socketcall"}
    assert "ERRNO(38)" in readable  # clone3's ENOSYS
    assert len(seccomp.compile_bpf()) % 8 == 0  # whole sock_filter instructions


def test_unsupported_architecture_is_refused_clearly():
    with pytest.raises(seccomp.SeccompUnsupported, match=r"riscv64.*supported: x86_64"):
        seccomp.architectures("riscv64")


def _tiny_wheel() -> bytes:
    """A pure-Python wheel, built in memory: ``agentrl_tiny`` 1.0 with one module."""
    dist = "agentrl_tiny-1.0.dist-info"
    files = {
        "agentrl_tiny.py": "ANSWER = 42\n",
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: agentrl-tiny\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr(
            f"{dist}/RECORD", "".join(f"{name},,\n" for name in files) + f"{dist}/RECORD,,\n"
        )
    return buffer.getvalue()


ORDINARY_TEST = """
import subprocess, sys, threading
from concurrent.futures import ProcessPoolExecutor

def square(x):
    return x * x

def test_subprocesses_threads_and_a_process_pool():
    out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True)
    assert out.stdout == "42\\n"
    seen = []
    threads = [threading.Thread(target=seen.append, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seen) == list(range(8))
    with ProcessPoolExecutor(2) as pool:
        assert list(pool.map(square, range(5))) == [0, 1, 4, 9, 16]
"""

ORDINARY_WORK = """set -e
python3 -m pip install --quiet --no-index --no-deps --target site agentrl_tiny-1.0-py3-none-any.whl
PYTHONPATH=site python3 -c 'import agentrl_tiny; print("wheel", agentrl_tiny.ANSWER)'
mkdir repo && cd repo && git init -q . && echo hi > a.txt && git add a.txt
git -c user.name=agent -c user.email=agent@example.com commit -q -m first
echo commits $(git rev-list --count HEAD) && cd ..
printf '#include <stdio.h>\\nint main(void){puts("compiled");return 0;}\\n' > hello.c
cc -o hello hello.c && ./hello
python3 -m pytest -q -p no:cacheprovider test_ordinary.py 2>&1 | tail -1
"""


@pytest.mark.parametrize("backend", BACKENDS)
async def test_ordinary_agent_work_still_runs(backend):
    async with await sandbox_factory(backend, LIMITS, image=SWE_IMAGE)() as box:
        await box.write_file("agentrl_tiny-1.0-py3-none-any.whl", _tiny_wheel())
        await box.write_file("test_ordinary.py", ORDINARY_TEST)
        result = await box.exec(ORDINARY_WORK, timeout=120)
    assert result.exit_code == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == ["wheel 42", "commits 1", "compiled"], result.stdout + result.stderr
    assert lines[3].startswith("1 passed"), result.stdout + result.stderr
