"""Soak test of the sandboxes: concurrent Code-v0 episodes for a bounded time, with faults injected.

    python -m bench.soak_sandboxes --minutes 20 [--concurrency 12] [--backends container,bwrap]

What runs: ``--concurrency`` episodes at once, split over the backends, one after another until the
time is up. Each is a real ``agentrl/Code-v0`` episode (``mode="multi"``, python and bash tools,
one submission) run by the real :class:`~agentrl.rollout.EpisodeRunner` against a scripted engine,
so every episode's reward is known in advance: a plain python call, a plain bash call, a one-second
python call, maybe a fault of its own (a call that hangs past the tool timeout, one that fills
memory, a fork bomb), and the problem's canonical solution (reward 1) or a wrong one (reward 0).
Each backend cycles through the kinds; when the time is up, a backend on which a workload never
ran (the faults cut its episodes short) starts episodes for up to ``cover_s`` more until it has.
Tools and grading take their sandboxes from one :class:`~agentrl.tools.SandboxPool` per backend;
container sandboxes are spread by :class:`~agentrl.tools.container_hosts.ContainerHosts` over two
extra ``podman system service`` processes started here. On a schedule the run also kills a sandbox
in the middle of a tool call (``podman kill`` or SIGKILL of bubblewrap), and SIGKILLs one of the
Podman services, then starts it again a few seconds later.

What is checked (:attr:`SoakReport.problems` lists every violation; the command exits 1 on any):

* every episode started ended exactly once, with its expected reward, or flagged (the runner's
  ``infra_error`` or ``error``); a wrong reward without a flag is a failure;
* afterwards nothing is left: no container with this process's label, no conmon of one of its
  containers, no mount naming one, no bubblewrap cgroup of this process, no child process,
  no Podman service started here, no new ``agentrl*`` entry in the temporary directory.

Printed: the latency of the plain tool calls (``run_python`` and ``exec`` of a one-liner, as the
sandbox answers them) under the soak's load, p50/p90/p99/max, next to the same calls on one idle
sandbox measured first in the same run, with ratios; the failure rate of tool calls; the episodes'
verdicts and the faults injected. ``--plot`` writes the latency histograms as a PNG.

Podman 4.3 itself leaves something when its service is SIGKILLed in the middle of starting a
container: a ``runc init`` process stuck in the container's cgroup (``libpod_parent/libpod-<id>``),
which outlives the container's removal, and sometimes only the empty cgroup. That is Podman's, not
agentrl's (agentrl removes the container); the soak lists it (``PODMAN LEFT``), kills the process
and removes the cgroup, and does not count it as a failure. The same goes for a ``conmon`` of a
container Podman no longer has (seen after such a kill, about one soak in three on a 2-core Zen 4),
and for a container left in Podman's ``removing`` state by a service SIGKILLed in the middle of
removing it (seen once, in CI: its API then answered every request about it, the listing of all
containers included, with a 500 until ``podman rm -f`` cleared it).

Not covered: a real second machine (the Podman services share this machine and its image store),
network faults between hosts, a grading sandbox killed by anything but its host's engine dying (by
design a failed submission, see :mod:`agentrl.envs.code.grading`), and engines other than Podman.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from agentrl.engine_pool import GenerateResult, SamplingParams
from agentrl.envs.code import CodeEnv
from agentrl.envs.code.problems import load_problems
from agentrl.rollout import EpisodeRunner, RolloutTask, Trajectory
from agentrl.tools import Sandbox, SandboxLimits, SandboxPool, sandbox_factory
from agentrl.tools.bwrap import BubblewrapSandbox
from agentrl.tools.container import LABEL, ContainerSandbox
from agentrl.tools.container_hosts import ContainerHosts
from bench import percentile
from bench.podman_services import PodmanService

LIMITS = SandboxLimits(memory_mb=128, pids=32, cpus=1.0)
TOOL_TIMEOUT = 3.0
PROBLEMS = (0, 2, 4, 7, 12, 23)  # HumanEval problems whose tests run in well under a second
OWNER = f"{socket.gethostname()}:{os.getpid()}"
IMAGE_PATH = Path(__file__).parents[1] / "docs" / "images" / "sandbox_soak.png"

# The tool calls of the scripts: (tool, code). "plain" calls are the ones whose latency is reported.
PLAIN_PYTHON = ("python", "print(sum(range(1000)))")
PLAIN_BASH = ("bash", "echo hi")
SLOW = ("python", "import time; time.sleep(1); print('slept')")
FAULTS = {
    "hang": ("python", "while True: pass"),
    "memory": ("python", "blob = b'x' * (1 << 30)"),
    "fork": ("bash", ":(){ :|:& };:"),
}
WORKLOADS = {code: name for name, (_, code) in FAULTS.items()} | {
    PLAIN_PYTHON[1]: "plain",
    PLAIN_BASH[1]: "plain",
    SLOW[1]: "slow",
}
KINDS = ("correct", "wrong", "hang", "memory", "fork")
"""Episode kinds, in turn on each backend: all but "wrong" submit the canonical solution (reward 1)."""
COVERED = ("plain", "slow", *FAULTS, "grading")
"""The workloads every backend must have run before the soak ends (see ``SoakConfig.cover_s``)."""


# --- recording every sandbox call -------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One call on a sandbox: which backend, what it ran, how long it took, how it ended."""

    backend: str
    workload: str
    """plain / slow / hang / memory / fork (tool calls), grading (the harness), other."""
    seconds: float
    outcome: str
    """ok (an ExecResult, whatever its exit code), timed_out, crashed (SandboxError raised)."""


class Recorder:
    """Every sandbox call of the run, and the sandboxes now running a tool call (kill targets)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.busy: dict[int, tuple[str, Sandbox]] = {}  # id(traced) -> (backend, the real box)
        self.container_ids: set[str] = set()
        self.starts: list[float] = []


class TracedSandbox:
    """A sandbox whose calls are timed and recorded; everything else is the sandbox's own."""

    def __init__(self, box: Sandbox, backend: str, recorder: Recorder) -> None:
        self.box, self.backend, self.recorder = box, backend, recorder

    @property
    def alive(self) -> bool:
        return self.box.alive

    async def exec(self, cmd: str | list[str], **kwargs: Any) -> Any:
        code = cmd[-1] if isinstance(cmd, list) else cmd
        workload = "grading" if code == "judge" else WORKLOADS.get(code, "other")
        return await self._timed(workload, self.box.exec(cmd, **kwargs))

    async def run_python(self, code: str, **kwargs: Any) -> Any:
        return await self._timed(WORKLOADS.get(code, "other"), self.box.run_python(code, **kwargs))

    async def _timed(self, workload: str, call: Any) -> Any:
        tool = workload not in ("grading", "other")
        if tool:
            self.recorder.busy[id(self)] = (self.backend, self.box)
        start = time.perf_counter()
        outcome = "crashed"
        try:
            result = await call
            outcome = "timed_out" if result.timed_out else "ok"
            return result
        finally:
            self.recorder.busy.pop(id(self), None)
            seconds = time.perf_counter() - start
            self.recorder.calls.append(Call(self.backend, workload, seconds, outcome))

    def __getattr__(self, name: str) -> Any:  # read_file, write_file, ping, close...
        return getattr(self.box, name)

    async def __aenter__(self) -> TracedSandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.box.close()


def traced_factory(backend: str, recorder: Recorder, hosts: ContainerHosts | None) -> Any:
    options = {"hosts": hosts} if backend == "container" else {}
    inner = sandbox_factory(backend, LIMITS, **options)

    async def start() -> TracedSandbox:
        began = time.perf_counter()
        box = await inner()
        recorder.starts.append(time.perf_counter() - began)
        if isinstance(box, ContainerSandbox):
            recorder.container_ids.add(box.container_id)
        return TracedSandbox(box, backend, recorder)

    return start


# --- scripted episodes ------------------------------------------------------------------------


def tool_turn(call: tuple[str, str]) -> str:
    tool, code = call
    return f"Let me check.\n<{tool}>{code}</{tool}>"


def episode_turns(kind: str, problem_index: int) -> list[str]:
    """The assistant turns of one episode of ``kind`` on HumanEval problem ``problem_index``."""
    problem = load_problems(None, [problem_index])[0]
    body = problem.canonical_solution if kind != "wrong" else "    return None\n"
    turns = [tool_turn(PLAIN_PYTHON), tool_turn(PLAIN_BASH), tool_turn(SLOW)]
    if kind in FAULTS:
        turns += [tool_turn(FAULTS[kind]), tool_turn(PLAIN_PYTHON)]
    return [*turns, f"Here it is.\n```python\n{problem.prompt}{body}```"]


class ScriptedEngine:
    """An engine that writes each episode's scripted turns (the group number picks the script)."""

    weight_version = 0

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.scripts: dict[int, list[str]] = {}
        self.turns: Counter[str] = Counter()

    async def end_session(self, session_id: str) -> None:
        """Nothing is kept per session."""

    async def generate(
        self, input_ids: Any, sampling: SamplingParams, session_id: str | None = None
    ) -> GenerateResult:
        assert session_id is not None
        group = int(session_id.split(":")[1])  # the runner's "env:group:sample:seed"
        script = self.scripts[group]
        text = script[min(self.turns[session_id], len(script) - 1)]
        self.turns[session_id] += 1
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end_of_turn]
        return GenerateResult(ids, [0.0] * len(ids), "stop", 0, [0] * len(ids), len(input_ids))


# --- the run ----------------------------------------------------------------------------------


@dataclass
class SoakConfig:
    seconds: float = 30.0
    """How long new episodes are started; the ones running then are finished."""
    cover_s: float = 60.0
    """After ``seconds``, how long a backend on which some workload has not run yet (its episodes
    were cut short by the faults) keeps starting episodes, fault-free, until every one has."""
    concurrency: int = 8
    """Episodes at once, split over the backends."""
    backends: tuple[str, ...] = ("container", "bwrap")
    kill_every_s: float = 3.0
    """A sandbox with a tool call in flight is killed this often."""
    restart_every_s: float = 15.0
    """One of the two Podman services (in turn) is SIGKILLed this often..."""
    down_s: float = 3.0
    """...and started again after this long."""
    baseline_calls: int = 100
    """Plain tool calls on one idle sandbox per backend, before the soak."""
    seed: int = 0


@dataclass
class SoakReport:
    config: SoakConfig
    verdicts: Counter[str] = field(default_factory=Counter)
    """ok / infra_error / error, per episode."""
    problems: list[str] = field(default_factory=list)
    """Every violation: a wrong reward, a lost or repeated episode, a leak."""
    calls: list[Call] = field(default_factory=list)
    baseline: list[Call] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    starts: list[float] = field(default_factory=list)
    episodes: int = 0
    wall_s: float = 0.0
    podman_leftovers: list[str] = field(default_factory=list)
    """What Podman itself left when a service was SIGKILLed mid-start (cleared by the soak)."""


class Soak:
    def __init__(self, config: SoakConfig, tokenizer: Any, workdir: Path) -> None:
        self.config, self.tokenizer, self.workdir = config, tokenizer, workdir
        self.report = SoakReport(config)
        self.recorder = Recorder()
        self.services = [PodmanService(workdir / "a.sock"), PodmanService(workdir / "b.sock")]
        self.random = random.Random(config.seed)
        self.engine = ScriptedEngine(tokenizer)
        self.groups = itertools.count()
        self.counts: Counter[str] = Counter()  # episodes started per backend: each cycles the kinds
        self.started: dict[tuple[str, int], str] = {}  # (backend, group) -> kind
        self.ended: dict[tuple[str, int], Trajectory] = {}

    async def run(self) -> SoakReport:
        began = time.monotonic()
        self.before = snapshot()
        hosts = None
        try:
            if "container" in self.config.backends:
                for service in self.services:
                    service.start()
                await asyncio.gather(
                    *(asyncio.to_thread(s.wait_until_answering) for s in self.services)
                )
                hosts = ContainerHosts([s.url for s in self.services], retry_after_s=1.0)
            factories = {b: traced_factory(b, self.recorder, hosts) for b in self.config.backends}
            await self.measure_baseline(factories)
            await self.soak(factories)
        finally:
            if hosts is not None:
                hosts.close()
            for service in self.services:
                service.kill()
        self.report.calls = self.recorder.calls
        self.report.starts = self.recorder.starts
        self.report.wall_s = time.monotonic() - began
        self.account()
        self.report.problems += find_leaks(
            self.recorder.container_ids,
            self.workdir,
            self.before,
            podman_left=self.report.podman_leftovers,
        )
        return self.report

    async def measure_baseline(self, factories: dict[str, Any]) -> None:
        for factory in factories.values():
            async with await factory() as box:
                for i in range(self.config.baseline_calls):
                    if i % 2:
                        await box.exec(["bash", "-c", PLAIN_BASH[1]], timeout=TOOL_TIMEOUT)
                    else:
                        await box.run_python(PLAIN_PYTHON[1], timeout=TOOL_TIMEOUT)
        self.report.baseline, self.recorder.calls = self.recorder.calls, []
        self.recorder.starts.clear()

    async def soak(self, factories: dict[str, Any]) -> None:
        deadline = time.monotonic() + self.config.seconds
        share = max(1, self.config.concurrency // len(factories))
        pools = {b: SandboxPool(f, warm=max(2, share // 2)) for b, f in factories.items()}
        faults = [asyncio.ensure_future(self.kill_sandboxes(deadline))]
        if "container" in factories:
            faults.append(asyncio.ensure_future(self.restart_hosts(deadline)))
        try:
            async with contextlib.AsyncExitStack() as stack:
                for pool in pools.values():
                    await stack.enter_async_context(pool)
                workers = [
                    self.worker(backend, pool, deadline)
                    for backend, pool in pools.items()
                    for _ in range(share)
                ]
                await asyncio.gather(*workers)
                await asyncio.gather(*faults)  # every host is back before the pools close
        finally:
            for task in faults:
                task.cancel()
            await asyncio.gather(*faults, return_exceptions=True)

    async def worker(self, backend: str, pool: SandboxPool, deadline: float) -> None:
        def make_env() -> Any:
            return CodeEnv(  # not gymnasium.make: a spec holding a pool cannot be copied
                mode="multi",
                tools=("python", "bash"),
                max_attempts=1,
                sandbox=backend,
                sandbox_pool=pool,
                sandbox_limits=LIMITS,
                tool_timeout=TOOL_TIMEOUT,
                test_timeout=10.0,
            )

        runner = EpisodeRunner(
            make_env,
            self.engine,
            self.tokenizer,
            SamplingParams(max_new_tokens=1024),
            env_id="agentrl/Code-v0",
            max_total_tokens=8192,
        )
        cover_until = deadline + self.config.cover_s
        while time.monotonic() < deadline or (
            time.monotonic() < cover_until and not self.covered(backend)
        ):
            group, n = next(self.groups), self.counts[backend]
            self.counts[backend] += 1
            kind = KINDS[n % len(KINDS)]
            problem = PROBLEMS[(n // len(KINDS)) % len(PROBLEMS)]
            self.engine.scripts[group] = episode_turns(kind, problem)
            self.started[backend, group] = kind
            task = RolloutTask(group, 0, group, {"index": problem})
            trajectory = await runner.run(task)
            if (backend, group) in self.ended or trajectory.group != group:
                self.report.problems.append(f"episode {backend}:{group} ended twice")
            self.ended[backend, group] = trajectory

    def covered(self, backend: str) -> bool:
        """Whether every workload of the scripts has run on ``backend``."""
        ran = {c.workload for c in self.recorder.calls if c.backend == backend}
        return set(COVERED) <= ran

    async def kill_sandboxes(self, deadline: float) -> None:
        """Every ``kill_every_s``, kill a sandbox that is running a tool call, from outside."""
        while time.monotonic() + self.config.kill_every_s < deadline:
            await asyncio.sleep(self.config.kill_every_s)
            if not self.recorder.busy:
                self.report.faults["no sandbox busy to kill"] += 1
                continue
            backend, box = self.random.choice(list(self.recorder.busy.values()))
            if isinstance(box, BubblewrapSandbox):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(box.pid, signal.SIGKILL)
            elif isinstance(box, ContainerSandbox):
                await asyncio.to_thread(
                    subprocess.run, ["podman", "kill", box.container_id], capture_output=True
                )
            self.report.faults[f"{backend} sandbox killed mid-call"] += 1

    async def restart_hosts(self, deadline: float) -> None:
        """Every ``restart_every_s``, SIGKILL a Podman service (in turn); restart it after ``down_s``."""
        for service in itertools.cycle(self.services):
            if time.monotonic() + self.config.restart_every_s + self.config.down_s > deadline:
                return
            await asyncio.sleep(self.config.restart_every_s)
            service.kill()
            self.report.faults["podman service SIGKILLed and restarted"] += 1
            await asyncio.sleep(self.config.down_s)
            service.start()
            await asyncio.to_thread(service.wait_until_answering)

    def account(self) -> None:
        """Every episode started ended once, with its expected reward or flagged."""
        report = self.report
        report.episodes = len(self.started)
        for key in self.started.keys() - self.ended.keys():
            report.problems.append(f"episode {key} was started and never ended")
        for key in self.ended.keys() - self.started.keys():
            report.problems.append(f"episode {key} ended without being started")
        for key, trajectory in self.ended.items():
            kind = self.started.get(key)
            expected = 0.0 if kind == "wrong" else 1.0
            if trajectory.error:
                report.verdicts["error"] += 1
            elif trajectory.infra_error:
                report.verdicts["infra_error"] += 1
            elif trajectory.reward == expected and trajectory.stop_reason == "terminated":
                report.verdicts["ok"] += 1
            else:
                report.verdicts["wrong reward"] += 1
                feedback = trajectory.messages[-1].get("content", "")[-300:]
                report.problems.append(
                    f"episode {key} ({kind}): reward {trajectory.reward}, expected {expected}, "
                    f"stop {trajectory.stop_reason}; last message: {feedback!r}"
                )


# --- leaks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """This process's containers, child processes and bubblewrap cgroups before the run: in a
    test session other tests' warm pools and helpers are there too, and are not the run's."""

    containers: frozenset[str]
    children: frozenset[int]
    cgroups: frozenset[Path]


def snapshot() -> Snapshot:
    return Snapshot(
        frozenset(_own_containers()),
        frozenset(child.pid for child in psutil.Process().children(recursive=True)),
        frozenset(_own_cgroups()),
    )


def _own_containers() -> list[str]:
    listed = subprocess.run(
        ["podman", "ps", "-aq", "--no-trunc", "--filter", f"label={LABEL}={OWNER}"],
        capture_output=True,
        text=True,
    )
    return listed.stdout.split()


def _own_cgroups() -> list[Path]:
    return [
        group
        for controller in ("memory", "pids", "cpu")
        for group in Path(f"/sys/fs/cgroup/{controller}/agentrl").glob(f"sandbox-{os.getpid()}-*")
    ]


def find_leaks(
    container_ids: set[str],
    workdir: Path,
    before: Snapshot | None = None,
    podman_left: list[str] | None = None,
) -> list[str]:
    """What the run left behind (beyond ``before``): containers, conmon, mounts, cgroups,
    processes, services. A conmon whose container Podman no longer has is Podman's leftover (a
    start cut short when its service was SIGKILLed; see the module docstring): it is killed and
    added to ``podman_left`` instead."""
    before = before or Snapshot(frozenset(), frozenset(), frozenset())
    leaks = []
    for cid in _own_containers():
        if cid in before.containers:
            continue
        if _podman_state(cid) == "removing" and podman_left is not None:
            subprocess.run(["podman", "rm", "-f", cid], capture_output=True)
            podman_left.append(f"container {cid[:12]} that its SIGKILLed service left removing")
            continue
        leaks.append(f"container {cid[:12]} is still there")
    mounts = Path("/proc/self/mountinfo").read_text()
    for cid in container_ids:
        if cid in mounts:
            leaks.append(f"a mount of container {cid[:12]} is still there")
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or ())
        owner = next((cid for cid in container_ids if cid in cmdline), None)
        if process.info["name"] == "conmon" and owner is not None:
            if _podman_has(owner):
                leaks.append(
                    f"conmon {process.info['pid']} of one of the run's containers is alive"
                )
            else:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
                if podman_left is not None:
                    podman_left.append(
                        f"conmon {process.info['pid']} of removed container {owner[:12]}"
                    )
        if "system service" in cmdline and str(workdir) in cmdline:
            leaks.append(f"podman service {process.info['pid']} ({cmdline}) is alive")
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.pid not in before.children and child.status() != psutil.STATUS_ZOMBIE:
                leaks.append(f"process {child.pid} ({' '.join(child.cmdline())}) is alive")
    for group in _own_cgroups():
        if group not in before.cgroups:
            leaks.append(f"bubblewrap cgroup {group} is still there")
    return leaks


def _podman_state(container_id: str) -> str:
    """Podman's state of the container (``removing`` for one whose removal was cut short)."""
    state = subprocess.run(
        ["podman", "container", "inspect", "--format", "{{.State.Status}}", container_id],
        capture_output=True,
        text=True,
    )
    return state.stdout.strip().lower()


def _podman_has(container_id: str) -> bool:
    exists = subprocess.run(["podman", "container", "exists", container_id], capture_output=True)
    return exists.returncode == 0


def podman_cgroups() -> set[Path]:
    """Podman's cgroups of containers (cgroup v1, cgroupfs manager), in the pids hierarchy."""
    return set(Path("/sys/fs/cgroup/pids").glob("libpod_parent/libpod-*"))


def clear_podman_leftovers(before: set[Path]) -> list[str]:
    """Podman's own leftovers since ``before``: cgroups of containers that no longer exist, and
    the processes in them (``runc init`` of a start cut short when the service was SIGKILLed).
    They are reported, then killed and removed, so that the machine is left clean."""
    found = []
    for group in sorted(podman_cgroups() - before):
        cid = group.name.removeprefix("libpod-")
        exists = subprocess.run(["podman", "container", "exists", cid], capture_output=True)
        if exists.returncode == 0:
            continue
        pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        names = [" ".join(psutil.Process(p).cmdline()) for p in pids if psutil.pid_exists(p)]
        found.append(f"cgroup of removed container {cid[:12]}, processes {names or 'none'}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for controller in Path("/sys/fs/cgroup").iterdir():
            for _ in range(20):
                try:
                    (controller / "libpod_parent" / group.name).rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # the killed process is still leaving
                    time.sleep(0.05)
    return found


def temp_entries() -> set[str]:
    """Files in the directory where container sandboxes write the seccomp profile (kept, by hash)."""
    directory = Path(tempfile.gettempdir()) / f"agentrl-seccomp-{os.getuid()}"
    return {p.name for p in directory.glob("*")}


async def run_soak(config: SoakConfig, tokenizer: Any) -> SoakReport:
    """Run the soak (see the module docstring) and return its report; cleans up on every path."""
    before, cgroups = temp_entries(), podman_cgroups()
    workdir = Path(tempfile.mkdtemp(prefix="soak-", dir="/run"))  # short socket paths
    try:
        report = await Soak(config, tokenizer, workdir).run()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        leftovers = clear_podman_leftovers(cgroups)
    report.podman_leftovers += leftovers
    report.problems += [f"temporary file {n} was left" for n in sorted(temp_entries() - before)]
    return report


# --- the numbers --------------------------------------------------------------------------------


def plain_seconds(calls: list[Call], backend: str) -> list[float]:
    return [c.seconds for c in calls if c.backend == backend and c.workload == "plain"]


def summary(report: SoakReport, cpu: str) -> str:
    """The report as text: latencies against the idle baseline, failure rates, verdicts, faults."""
    lines = [f"CPU: {cpu}; {os.cpu_count()} cores; soak {report.config.seconds:g} s"]
    lines.append(
        f"{'plain tool calls':<24} {'calls':>6} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8}"
    )
    for backend in report.config.backends:
        rows = {
            f"{backend} idle": plain_seconds(report.baseline, backend),
            f"{backend} soak": plain_seconds(report.calls, backend),
        }
        for name, seconds in rows.items():
            stats = [percentile(seconds, q) * 1e3 for q in (0.5, 0.9, 0.99, 1.0)]
            lines.append(f"{name:<24} {len(seconds):>6} " + " ".join(f"{s:>8.1f}" for s in stats))
        idle, soak = rows.values()
        ratios = [percentile(soak, q) / percentile(idle, q) for q in (0.5, 0.9, 0.99, 1.0)]
        lines.append(f"{'  soak / idle':<24} {'':>6} " + " ".join(f"{r:>7.1f}x" for r in ratios))
    tools = [c for c in report.calls if c.workload not in ("grading", "other")]
    for backend in report.config.backends:
        mine = [c for c in tools if c.backend == backend]
        plain = [c for c in mine if c.workload == "plain"]
        lines.append(
            f"{backend}: {len(mine)} tool calls, {_rate(mine)} raised (sandbox crashed or lost); "
            f"plain calls {_rate(plain)} raised"
        )
    verdicts = ", ".join(f"{k} {v}" for k, v in sorted(report.verdicts.items()))
    lines.append(f"episodes: {report.episodes} ({verdicts}); wall {report.wall_s:.0f} s")
    lines.append("faults: " + ", ".join(f"{k} {v}" for k, v in sorted(report.faults.items())))
    lines.append(
        f"sandbox starts: {len(report.starts)}, p50 {percentile(report.starts, 0.5):.2f} s"
    )
    lines += [f"PODMAN LEFT (cleared) {p}" for p in report.podman_leftovers]
    clean = ["no wrong reward, no lost episode, no leak"]
    lines += [f"PROBLEM {p}" for p in report.problems] or clean
    return "\n".join(lines)


def _rate(calls: list[Call]) -> str:
    crashed = sum(c.outcome == "crashed" for c in calls)
    return f"{crashed} ({100 * crashed / max(len(calls), 1):.2f}%)"


def plot(report: SoakReport, cpu: str, path: Path) -> None:
    """Histograms of the plain tool calls' latency, idle and under the soak, one panel a backend."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    backends = report.config.backends
    figure = Figure(figsize=(6.0 * len(backends), 3.4), dpi=100)
    for i, backend in enumerate(backends):
        axes = figure.add_subplot(1, len(backends), i + 1)
        idle = np.array(plain_seconds(report.baseline, backend)) * 1e3
        soak = np.array(plain_seconds(report.calls, backend)) * 1e3
        edges = np.geomspace(max(min(idle.min(), soak.min()), 0.1), soak.max() * 1.1, 50)
        axes.hist(idle, bins=edges, alpha=0.6, label=f"one idle sandbox ({len(idle)})")
        axes.hist(soak, bins=edges, alpha=0.6, label=f"under the soak ({len(soak)})")
        for q, style in ((0.5, "-"), (0.99, "--")):
            axes.axvline(percentile(list(soak), q), color="C1", linestyle=style, linewidth=1)
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("tool call latency, ms (lines: soak p50, p99)")
        axes.set_ylabel("calls")
        axes.set_title(f"{backend}: plain tool calls", fontsize=10)
        axes.legend(fontsize=8)
    figure.suptitle(
        f"Sandbox soak, {report.config.seconds / 60:g} min, {report.config.concurrency} episodes "
        f"at once, faults injected ({cpu}, {os.cpu_count()} cores)",
        fontsize=10,
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp.png")
    FigureCanvasAgg(figure).print_png(str(partial))
    os.replace(partial, path)


def cpu_name() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--backends", default="container,bwrap")
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds")
    parser.add_argument("--restart-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--plot", type=Path, default=IMAGE_PATH, help="PNG path ('' for none)")
    args = parser.parse_args()
    from agentrl.models import load_tokenizer

    os.environ.setdefault("DOCKER_HOST", "unix:///run/podman/podman.sock")
    config = SoakConfig(
        seconds=args.minutes * 60,
        concurrency=args.concurrency,
        backends=tuple(args.backends.split(",")),
        kill_every_s=args.kill_every,
        restart_every_s=args.restart_every,
    )
    report = asyncio.run(run_soak(config, load_tokenizer()))
    cpu = cpu_name()
    print(summary(report, cpu))
    if str(args.plot):
        plot(report, cpu, args.plot)
        print(f"histogram: {args.plot}")
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
