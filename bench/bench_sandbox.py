"""Sandbox tool calls: warm latency of a persistent session vs a new process or container per call.

**Latency** of a trivial Python statement (``print(1 + 1)``), p50 and p99 over ``--calls`` calls
(``--fresh-calls`` for a fresh container per call), after ``--warmup`` calls per path, one call at
a time. The paths of a backend take turns call by call, so a neighbour's load hits them alike.

* container backend (`agentrl.tools.container`, through the docker SDK; for Podman set
  ``DOCKER_HOST=unix:///run/podman/podman.sock``):

  - **run_python**: agentrl's persistent interpreter, ``sandbox.run_python(code)``;
  - **exec python3 -c**: ``sandbox.exec(["python3", "-c", code])``, a new interpreter per call
    inside the same session;
  - **docker exec_run**: the baseline other frameworks use, ``container.exec_run([...])`` on a warm
    container of the same image and limits (the sandbox's own container, its agent left idle);
  - **fresh container**: ``client.containers.run(image, [...])`` per call (create, start, wait,
    logs, remove), with the same limits.

* bwrap backend (`agentrl.tools.bwrap`):

  - **run_python** and **exec python3 -c**, as above;
  - **fresh bwrap**: one bubblewrap process per call, the sandbox's own command line with
    ``python3 -c`` in place of the agent (its cgroups made once and reused: no setup per call);
  - **bare subprocess**: ``subprocess.run(["python3", "-c", code])`` with no isolation at all
    (TRL / verifiers-style code), for reference.

Prints p50 and p99 in ms over the correct calls, the failed calls (an exception or a wrong
output; each is printed), each path's p50 over run_python's, and whether the p50 meets the issue's
target (<= 20 ms).

**Concurrency**: ``--concurrency`` sandboxes started at once (prints the time to start them all),
each running ``--calls-per-sandbox`` calls one after another, all sandboxes at once under asyncio:
``run_python`` of a little work (``sum(range(1000))``) alternating with ``exec("echo hi")``. Prints
calls, wall time, calls/s and failures (any exception, non-zero exit or wrong output; each is
printed). For the container backend the baseline runs the same calls with docker SDK ``exec_run``
(``python3 -c`` and ``echo hi``) into the same containers from ``--concurrency`` threads
(``asyncio.to_thread``), and the ratio ours/baseline is printed. Every sandbox and container is
removed on every exit path.

A failure in agentrl's paths (or a sandbox that does not start) makes the benchmark exit 1; a
baseline's failures are only reported (Podman's exec API can lose the output of a short-lived
``exec`` on a loaded machine, as Docker's has: moby/moby#27289, containers/podman#9096).

Wall-clock numbers on a small machine (2 cores here) move with whatever else runs on it.

    python -m bench.bench_sandbox [--backend container|bwrap|both] [--calls 200] [--fresh-calls 20]
        [--concurrency 32] [--calls-per-sandbox 50] [--image localhost/agentrl-python:latest]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentrl.tools.bwrap import BubblewrapSandbox, _command, _make_cgroups, _remove_cgroups
from agentrl.tools.container import DEFAULT_IMAGE, ContainerSandbox, _remove, connect
from agentrl.tools.sandbox import (
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxLimits,
    agent_command,
)
from bench import percentile

STATEMENT = "print(1 + 1)"
EXPECTED = "2\n"
TARGET_P50_MS = 20.0
LIMITS = SandboxLimits(memory_mb=256, pids=64)
PYTHON = "/usr/bin/python3"
BENCH_LABEL = "agentrl.bench"
OWNER = f"{socket.gethostname()}:{os.getpid()}"

OURS = ("run_python", "exec python3 -c")
"""agentrl's paths: a failure in them fails the benchmark; a baseline's is only reported."""

Call = Callable[[], Awaitable[str]]


# --- latency -------------------------------------------------------------------------------------


@dataclass
class Latency:
    """One path's timed calls: seconds of each correct call, and what went wrong in the others."""

    seconds: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


async def latencies(paths: dict[str, Call], calls: int, warmup: int) -> dict[str, Latency]:
    """Time ``calls`` calls of each path, the paths taking turns; failed calls are not timed."""
    results = {name: Latency() for name in paths}
    for round_ in range(warmup + calls):
        for name, call in paths.items():
            start = time.perf_counter()
            try:
                out = await call()
            except Exception as exc:  # the sandbox or engine failed: recorded, not timed
                out = f"{type(exc).__name__}: {exc}"
            elapsed = time.perf_counter() - start
            if out != EXPECTED:
                results[name].failures.append(f"{name} call {round_}: got {out!r}")
            elif round_ >= warmup:
                results[name].seconds.append(elapsed)
    return results


def print_latency_table(results: dict[str, Latency], ours: str) -> None:
    p50_ours = percentile(results[ours].seconds, 0.5)
    print(
        f"{'path':<22} {'calls':>5} {'fail':>4} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'p50 / ' + ours:>18} {'p50 <= 20 ms':>13}"
    )
    for name, result in results.items():
        p50, p99 = percentile(result.seconds, 0.5), percentile(result.seconds, 0.99)
        print(
            f"{name:<22} {len(result.seconds):>5} {len(result.failures):>4} {p50 * 1e3:>8.2f} "
            f"{p99 * 1e3:>8.2f} {p50 / p50_ours:>17.1f}x "
            f"{'yes' if p50 * 1e3 <= TARGET_P50_MS else 'no':>13}"
        )
    for result in results.values():
        print_failures(result.failures)


def print_failures(failures: list[str], most: int = 20) -> None:
    for failure in failures[:most]:
        print(f"FAILURE {failure}")
    if len(failures) > most:
        print(f"FAILURE ... and {len(failures) - most} more")


def session_paths(sandbox: Sandbox) -> dict[str, Call]:
    async def run_python() -> str:
        return _stdout(await sandbox.run_python(STATEMENT))

    async def exec_python() -> str:
        return _stdout(await sandbox.exec(["python3", "-c", STATEMENT]))

    return dict(zip(OURS, (run_python, exec_python), strict=True))


def _stdout(result: ExecResult) -> str:
    if result.exit_code != 0:
        raise RuntimeError(f"exit code {result.exit_code}: {result.stderr[-500:]}")
    return result.stdout


def container_options(limits: SandboxLimits) -> dict[str, Any]:
    """The limits `ContainerSandbox` applies, for one-shot containers; labelled for clean-up."""
    tmpfs = f"rw,size={limits.disk_mb}m,mode=1777"
    return {
        "working_dir": Sandbox.workdir,
        "user": "65534:65534",
        "network_mode": "none",
        "mem_limit": f"{limits.memory_mb}m",
        "memswap_limit": f"{limits.memory_mb}m",
        "pids_limit": limits.pids,
        "nano_cpus": int(limits.cpus * 1e9),
        "read_only": True,
        "tmpfs": {Sandbox.workdir: tmpfs, "/tmp": tmpfs},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "labels": {BENCH_LABEL: OWNER},
    }


def remove_bench_containers(client: Any) -> None:
    """Remove every one-shot container this process left (an interrupted call leaves one)."""
    for container in client.containers.list(all=True, filters={"label": f"{BENCH_LABEL}={OWNER}"}):
        _remove(container)


async def container_latency(client: Any, args: argparse.Namespace) -> bool:
    """Print the container paths' table; True if agentrl's own paths had no failures."""
    options = container_options(LIMITS)
    argv = ["python3", "-c", STATEMENT]

    async def fresh_container() -> str:  # blocks the loop on purpose: nothing else runs
        container = client.containers.run(args.image, argv, detach=True, **options)
        try:
            status = container.wait()["StatusCode"]
            out = container.logs(stdout=True, stderr=False).decode()
        finally:
            _remove(container)
        if status != 0:
            raise RuntimeError(f"fresh container exited {status}")
        return out

    try:
        async with await ContainerSandbox.start(LIMITS, image=args.image, client=client) as sandbox:
            warm = client.containers.get(sandbox.container_id)

            async def exec_run() -> str:
                result = warm.exec_run(argv)
                if result.exit_code != 0:
                    raise RuntimeError(f"exec_run exited {result.exit_code}: {result.output!r}")
                return result.output.decode()

            paths = {**session_paths(sandbox), "docker exec_run": exec_run}
            results = await latencies(paths, args.calls, args.warmup)
        fresh = {"fresh container": fresh_container}
        results |= await latencies(fresh, args.fresh_calls, args.warmup)
    finally:
        await asyncio.to_thread(remove_bench_containers, client)
    print_latency_table(results, "run_python")
    return not any(results[name].failures for name in OURS)


async def bwrap_latency(args: argparse.Namespace) -> bool:
    """Print the bwrap paths' table; True if agentrl's own paths had no failures."""
    bwrap = shutil.which("bwrap")
    assert bwrap is not None  # BubblewrapSandbox.start checked
    agent = agent_command(LIMITS, PYTHON)
    cgroups = _make_cgroups(LIMITS)
    try:
        box = _command(bwrap, PYTHON, LIMITS, cgroups)
        assert box[-len(agent) :] == agent, "bwrap._command no longer ends with the agent's argv"
        one_shot = [*box[: -len(agent)], PYTHON, "-c", STATEMENT]

        async def fresh_bwrap() -> str:
            return _run(one_shot)

        async def bare_subprocess() -> str:
            return _run([PYTHON, "-c", STATEMENT])

        async with await BubblewrapSandbox.start(LIMITS, python=PYTHON) as sandbox:
            paths = {
                **session_paths(sandbox),
                "fresh bwrap": fresh_bwrap,
                "bare subprocess": bare_subprocess,
            }
            results = await latencies(paths, args.calls, args.warmup)
    finally:
        await _remove_cgroups(cgroups)
    print_latency_table(results, "run_python")
    return not any(results[name].failures for name in OURS)


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"exit code {done.returncode}: {done.stderr[-500:]}")
    return done.stdout


# --- concurrency ---------------------------------------------------------------------------------


def work(i: int) -> tuple[str, str]:
    """Call ``i`` of a sandbox: (command, expected stdout); even calls are Python, odd ones shell."""
    if i % 2 == 0:
        return f"sum(range(1000)) + {i}", f"{sum(range(1000)) + i}\n"
    return "echo hi", "hi\n"


async def run_sessions(sandboxes: list[Sandbox], calls: int, failures: list[str]) -> int:
    """Each sandbox makes ``calls`` calls in turn, all sandboxes at once; returns calls made."""

    async def one(index: int, sandbox: Sandbox) -> int:
        made = 0
        for i in range(calls):
            command, expected = work(i)
            made += 1
            try:
                if i % 2 == 0:
                    result = await sandbox.run_python(command)
                else:
                    result = await sandbox.exec(command)
                if result.exit_code != 0 or result.stdout != expected:
                    failures.append(f"sandbox {index} call {i}: {result}")
            except Exception as exc:
                failures.append(f"sandbox {index} call {i}: {type(exc).__name__}: {exc}")
        return made

    return sum(await asyncio.gather(*(one(k, s) for k, s in enumerate(sandboxes))))


async def run_exec_run(containers: list[Any], calls: int, failures: list[str]) -> int:
    """The baseline: the same calls as docker ``exec_run``, one thread per container."""

    def one(index: int, container: Any) -> int:
        made = 0
        for i in range(calls):
            command, expected = work(i)
            argv = ["python3", "-c", f"print({command})"] if i % 2 == 0 else ["sh", "-c", command]
            made += 1
            try:
                result = container.exec_run(argv)
                if result.exit_code != 0 or result.output.decode() != expected:
                    failures.append(f"container {index} call {i}: {result}")
            except Exception as exc:
                failures.append(f"container {index} call {i}: {type(exc).__name__}: {exc}")
        return made

    made = await asyncio.gather(*(asyncio.to_thread(one, k, c) for k, c in enumerate(containers)))
    return sum(made)


async def concurrency(
    start: Callable[[], Awaitable[Sandbox]], client: Any, args: argparse.Namespace
) -> bool:
    """Print the concurrent run (and the exec_run baseline when ``client``).

    True if every sandbox started and every agentrl call succeeded.
    """
    sandboxes: list[Sandbox] = []
    failures: list[str] = []
    baseline_failures: list[str] = []
    began = time.perf_counter()
    started = await asyncio.gather(
        *(start() for _ in range(args.concurrency)), return_exceptions=True
    )
    start_s = time.perf_counter() - began
    try:
        for result in started:
            if isinstance(result, BaseException):
                failures.append(f"start: {type(result).__name__}: {result}")
            else:
                sandboxes.append(result)
        print(f"started {len(sandboxes)}/{args.concurrency} sandboxes at once in {start_s:.2f} s")
        print(f"{'run':<16} {'calls':>6} {'wall s':>8} {'calls/s':>9} {'failures':>9}")
        ours = await timed_run("agentrl", run_sessions, sandboxes, args, failures)
        if client is not None:
            containers = [client.containers.get(s.container_id) for s in sandboxes]
            theirs = await timed_run(
                "docker exec_run", run_exec_run, containers, args, baseline_failures
            )
            print(f"calls/s agentrl / docker exec_run: {ours / theirs:.1f}x")
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True)
    print_failures(failures)
    print_failures(baseline_failures)
    return not failures


async def timed_run(
    name: str,
    run: Callable[..., Awaitable[int]],
    boxes: list[Any],
    args: argparse.Namespace,
    failures: list[str],
) -> float:
    """Run ``run`` over ``boxes``, print its row, return its calls/s."""
    before = len(failures)
    began = time.perf_counter()
    made = await run(boxes, args.calls_per_sandbox, failures)
    wall = time.perf_counter() - began
    print(f"{name:<16} {made:>6} {wall:>8.2f} {made / wall:>9.1f} {len(failures) - before:>9}")
    return made / wall


# --- entry point ---------------------------------------------------------------------------------


async def bench_backend(backend: str, args: argparse.Namespace) -> bool:
    """Latency and concurrency of one backend; True if it ran without failures."""
    print(f"\n--- {backend} ---")
    if backend == "container":
        import docker  # optional: only the container backend needs it

        # A connection per thread, so that concurrent calls do not queue for the socket pool.
        client = docker.from_env(max_pool_size=args.concurrency)

        def start() -> Awaitable[Sandbox]:
            return ContainerSandbox.start(LIMITS, image=args.image, client=client)

        print(f"image {args.image}; {LIMITS}")
        print(f"latency of {STATEMENT!r}, after {args.warmup} warm-up calls per path:")
        ok = await container_latency(client, args)
    else:
        client = None

        def start() -> Awaitable[Sandbox]:
            return BubblewrapSandbox.start(LIMITS, python=PYTHON)

        print(f"python {PYTHON}; {LIMITS}")
        print(f"latency of {STATEMENT!r}, after {args.warmup} warm-up calls per path:")
        ok = await bwrap_latency(args)
    print(
        f"\nconcurrency: {args.concurrency} sandboxes x {args.calls_per_sandbox} calls "
        "(run_python 'sum(range(1000)) + i' alternating with exec 'echo hi'):"
    )
    return await concurrency(start, client, args) and ok


async def available(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or None when it can."""
    try:
        if backend == "container":
            await asyncio.to_thread(connect)
        else:
            async with await BubblewrapSandbox.start(LIMITS, python=PYTHON):
                pass
    except (SandboxError, ImportError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def amain(args: argparse.Namespace) -> int:
    # Enough threads for every blocking docker call (and every exec_run of the baseline) at once;
    # asyncio's default pool has only min(32, cores + 4) threads.
    workers = max(args.concurrency, 8)
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=workers))
    print(f"{os.cpu_count()} CPU cores; load average {os.getloadavg()[0]:.2f} before the run")
    backends = ["container", "bwrap"] if args.backend == "both" else [args.backend]
    ran, ok = 0, True
    for backend in backends:
        reason = await available(backend)
        if reason is not None:
            if args.backend != "both":
                print(f"{backend}: not available: {reason}", file=sys.stderr)
                return 1
            print(f"\n--- {backend} --- skipped, not available: {reason}")
            continue
        ok = await bench_backend(backend, args) and ok
        ran += 1
    return 0 if ran and ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["container", "bwrap", "both"], default="both")
    parser.add_argument("--calls", type=int, default=200, help="latency calls per fast path")
    parser.add_argument("--fresh-calls", type=int, default=20, help="calls of 'fresh container'")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per path first")
    parser.add_argument("--concurrency", type=int, default=32, help="sandboxes at once")
    parser.add_argument("--calls-per-sandbox", type=int, default=50)
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    return asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
