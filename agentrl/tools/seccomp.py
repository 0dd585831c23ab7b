"""The system-call filter of every sandbox: one policy, compiled for bubblewrap and for containers.

:data:`POLICY` is the single list of what the box may not call; everything else is allowed. It
follows what Docker's default profile refuses to a container holding no extra capabilities (our
boxes hold none), and goes further where agent work has no use for a call:

* :func:`compile_bpf` turns it into the classic-BPF program bubblewrap loads with ``--seccomp FD``
  (through libseccomp, via the ``pyseccomp`` ctypes binding).
* :func:`oci_profile_json` turns it into the OCI/Docker seccomp profile a container engine loads
  (``security_opt=["seccomp=<json>"]``).

Both are built for the host's architecture family (x86_64 with its i386 and x32 system-call
tables, or aarch64 with arm), so a 32-bit ``int 0x80`` call meets the same rules; any other
architecture is refused with :class:`SeccompUnsupported`.

What it does NOT cover:

* ``clone3`` takes its flags behind a pointer, which seccomp cannot read, so it is refused
  outright with ``ENOSYS`` (glibc then falls back to ``clone``, whose flags are checked).
* ``personality`` stays allowed (Docker allows only a few values): with ``no_new_privs`` set by
  both backends no set-id program gains anything from a weakened memory layout, and the kernel
  clears the risky personality bits on set-id execution anyway.
* ``socketcall`` (the multiplexed socket call of 32-bit x86) hides its arguments behind a
  pointer, so libseccomp turns the ``AF_VSOCK`` rule into a refusal of every
  ``socketcall(SYS_SOCKET)``: a 32-bit program that makes sockets through it gets none (the
  direct ``socket`` call, which current 32-bit C libraries use, is checked as on 64-bit).
* Default allow: a system call added to the kernel after this list was written is allowed until
  it is listed (Docker's allow-list refuses it). In containers this profile replaces the engine's.
* It narrows the kernel surface; it does not remove it. A bug in an allowed call is still an
  escape.

Choices that cost something: ``ptrace`` (and ``process_vm_readv``/``writev``, ``kcmp``...) is
refused outright, not only across processes as the kernel's own checks do (Docker allows it on
kernels since 4.8): in a box every process runs as the same uid, so "other processes" would
include the agent that reports results; the price is that debuggers and profilers (gdb, strace,
py-spy) do not work in the box.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import platform
from dataclasses import dataclass
from typing import Any

from agentrl.tools.sandbox import SandboxError


class SeccompUnsupported(SandboxError):
    """The filter cannot be built here: an unknown architecture, or libseccomp is missing."""


@dataclass(frozen=True)
class ArgTest:
    """The rule applies only when ``(argument[index] & mask) == value`` (a masked comparison)."""

    index: int
    mask: int
    value: int


@dataclass(frozen=True)
class Denial:
    """System calls the box may not make, and why; they fail with ``errno`` instead of running."""

    names: tuple[str, ...]
    reason: str
    errno: int = errno.EPERM
    when: ArgTest | None = None
    """None: always denied. Otherwise denied only when the argument test holds."""


# Namespace flags of clone(2) and unshare(2): each creates a namespace; CLONE_NEWUSER does it
# without privilege and hands the caller every capability inside the new namespace.
_CLONE_NEW = {
    "CLONE_NEWNS": 0x0002_0000,
    "CLONE_NEWCGROUP": 0x0200_0000,
    "CLONE_NEWUTS": 0x0400_0000,
    "CLONE_NEWIPC": 0x0800_0000,
    "CLONE_NEWUSER": 0x1000_0000,
    "CLONE_NEWPID": 0x2000_0000,
    "CLONE_NEWNET": 0x4000_0000,
}
_CLONE_NEWTIME = 0x80  # unshare(2) only: in clone(2) these bits are the exit signal
_AF_VSOCK = 40
_NAMESPACES = (
    "new namespaces: a user namespace grants every capability inside it, and with them kernel "
    "code an unprivileged process never reaches (the usual road of container escapes)"
)

POLICY: tuple[Denial, ...] = (
    *(
        Denial(("clone", "unshare"), _NAMESPACES, when=ArgTest(0, flag, flag))
        for flag in _CLONE_NEW.values()
    ),
    Denial(("unshare",), _NAMESPACES, when=ArgTest(0, _CLONE_NEWTIME, _CLONE_NEWTIME)),
    Denial(
        ("clone3",),
        "its flags sit behind a pointer seccomp cannot read; ENOSYS makes glibc use clone",
        errno=errno.ENOSYS,
    ),
    Denial(("setns",), "joining another process's namespaces"),
    Denial(
        ("io_uring_setup", "io_uring_enter", "io_uring_register"),
        "io_uring: a large, fast-changing kernel surface with a record of privilege escalations",
    ),
    Denial(("bpf",), "loads programs into the kernel"),
    Denial(("keyctl", "add_key", "request_key"), "the kernel keyrings are not namespaced"),
    Denial(("userfaultfd",), "stalls the kernel mid-copy: the classic way to win a kernel race"),
    Denial(("perf_event_open",), "performance counters: side channels and kernel bugs"),
    Denial(
        (
            *("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module"),
            *("create_module", "get_kernel_syms", "query_module"),
        ),
        "replacing or extending the running kernel",
    ),
    Denial(
        (
            *("mount", "umount", "umount2", "pivot_root", "chroot", "mount_setattr"),
            *("fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree"),
        ),
        "changing the filesystem view the isolation is built from",
    ),
    Denial(
        (
            *("ptrace", "process_vm_readv", "process_vm_writev", "process_madvise"),
            *("kcmp", "pidfd_getfd"),
        ),
        "reading or changing other processes, the agent that reports results among them; only "
        "debuggers and profilers need it",
    ),
    Denial(
        ("mbind", "get_mempolicy", "set_mempolicy", "set_mempolicy_home_node"),
        "NUMA memory placement (CAP_SYS_NICE in Docker's profile)",
    ),
    Denial(("migrate_pages", "move_pages"), "moving the pages of (other) processes across nodes"),
    Denial(
        (
            *("reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog"),
            *("settimeofday", "stime", "clock_settime", "clock_settime64", "vhangup"),
            *("sethostname", "setdomainname"),
        ),
        "the host's state: power, swap, accounting, quotas, kernel log, clock, names",
    ),
    Denial(("iopl", "ioperm"), "raw access to I/O ports"),
    Denial(("open_by_handle_at",), "opens any file by handle, around the mount view (Shocker)"),
    Denial(("fanotify_init",), "watching filesystem-wide events"),
    Denial(
        (
            *("lookup_dcookie", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl"),
            *("vm86", "vm86old"),
        ),
        "obsolete interfaces nothing current uses: old kernel surface",
    ),
    Denial(
        ("socket",),
        "AF_VSOCK reaches the hypervisor's host directly, around the network namespace",
        when=ArgTest(0, 0xFFFF_FFFF, _AF_VSOCK),
    ),
)
"""What the sandbox may not call; default allow."""

# The architectures a filter covers, by host machine: the native one first, then the other
# system-call tables a process on it can enter (i386 through int 0x80, x32).
_ARCHES = {
    "x86_64": ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"),
    "aarch64": ("SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"),
}


def denied_names() -> frozenset[str]:
    """Every system call :data:`POLICY` names."""
    return frozenset(name for denial in POLICY for name in denial.names)


def architectures(machine: str | None = None) -> tuple[str, ...]:
    """The libseccomp architecture names a filter for ``machine`` (default: this host) covers."""
    machine = machine or platform.machine()
    try:
        return _ARCHES[machine]
    except KeyError:
        raise SeccompUnsupported(
            f"no system-call filter for architecture {machine!r} (supported: "
            f"{', '.join(_ARCHES)}): the sandboxes refuse to start without one"
        ) from None


def oci_profile(machine: str | None = None) -> dict[str, Any]:
    """:data:`POLICY` as an OCI/Docker seccomp profile (``defaultAction`` allow)."""
    syscalls = []
    for denial in POLICY:
        rule: dict[str, Any] = {
            "names": list(denial.names),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": denial.errno,
        }
        if denial.when is not None:
            test = denial.when  # for SCMP_CMP_MASKED_EQ, "value" is the mask
            rule["args"] = [
                {
                    "index": test.index,
                    "value": test.mask,
                    "valueTwo": test.value,
                    "op": "SCMP_CMP_MASKED_EQ",
                }
            ]
        syscalls.append(rule)
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": list(architectures(machine)),
        "syscalls": syscalls,
    }


@functools.cache
def oci_profile_json() -> str:
    """:func:`oci_profile` for this host, as compact JSON text."""
    return json.dumps(oci_profile(), separators=(",", ":"))


@functools.cache
def compile_bpf() -> bytes:
    """:data:`POLICY` as a classic-BPF program for this host (what ``bwrap --seccomp`` reads).

    Raises :class:`SeccompUnsupported` when the architecture is not supported or libseccomp
    (Debian's ``libseccomp2``, through the ``pyseccomp`` package) is missing or too old.
    """
    return _export(_build(), "export_bpf")


def readable_filter() -> str:
    """libseccomp's pseudo-code of the compiled program (PFC), for review and tests."""
    return _export(_build(), "export_pfc").decode()


def _build() -> Any:
    """:data:`POLICY` as a ``pyseccomp.SyscallFilter`` for this host's architectures."""
    arches = architectures()
    try:
        import pyseccomp
    except (ImportError, OSError) as exc:  # OSError: pyseccomp found no libseccomp.so.2
        raise SeccompUnsupported(
            f"cannot build the system-call filter: {exc}. Install libseccomp "
            "(`sudo sandboxes/setup.sh --bwrap-only`) and the `pyseccomp` package"
        ) from exc
    program = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for arch in arches[1:]:  # the native one is there already
        program.add_arch(getattr(pyseccomp.Arch, arch.removeprefix("SCMP_ARCH_")))
    for denial in POLICY:
        args = []
        if denial.when is not None:
            test = denial.when
            args.append(pyseccomp.Arg(test.index, pyseccomp.MASKED_EQ, test.mask, test.value))
        for name in denial.names:
            if pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) == -1:
                raise SeccompUnsupported(
                    f"libseccomp does not know the system call {name!r}: it is too old "
                    "for the sandbox's filter (2.5.4 or later works)"
                )
            program.add_rule(pyseccomp.ERRNO(denial.errno), name, *args)
    return program


def _export(program: Any, method: str) -> bytes:
    with os.fdopen(os.memfd_create("agentrl-seccomp"), "w+b") as exported:
        getattr(program, method)(exported)
        exported.seek(0)
        return exported.read()


def filter_fd() -> int:
    """A new file descriptor holding :func:`compile_bpf`'s program, at offset 0 (close-on-exec).

    bubblewrap reads it to the end: pass it with ``pass_fds`` and close it once it has started.
    """
    program = compile_bpf()
    fd = os.memfd_create("agentrl-seccomp-bpf")
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
