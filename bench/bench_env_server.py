"""``agentrl env serve`` under load: many concurrent WebSocket sessions (issue 34, point 6).

For each environment, one server process (``tests/env_server/serve_test_envs.py serve ENV_ID``:
the command's own ``add_arguments``/``run``, with the tests' environments registered) and this
process as the client, both on this machine:

1. **Sessions held.** ``N`` WebSocket connections to ``/ws`` open at once, each resets (its own
   environment instance). Counted: resets answered with an observation; error replies and
   exceptions are errors. The server's RSS (``/proc/PID/status`` VmRSS) before any session and
   with all of them held gives the memory per session.
2. **Under load.** Every session steps ``--steps`` times, all sessions at once (a closed loop of N
   clients, each sending its next step when the last is answered). Per-step latency as the client
   sees it (send to reply), p50/p99.
2b. **Paced.** Every session steps ``--paced-rounds`` more times, each once per ``--pace-s``
   seconds at its own random phase (an open loop: a step is sent at its time whether or not the
   server kept up), as sessions step when an agent's generation ends rather than all at once.
   The offered load is ``N / pace`` steps per second; per-step latency p50/p99 as above.
3. **One at a time.** With the N sessions still held, ``--probe-steps`` steps of one session, one
   after another (Math-v0: reset with seeds 0, 1, ... N-1 in turn): the latency without queueing.
4. **In-process.** The same environment made in this process (``gymnasium.make``), the same
   actions (Math-v0: the same seeds as the served steps, Echo: one session's 200 steps): ``astep``
   time p50/p99. Each side's first step (lazy imports: Math-v0's verifier takes seconds) is
   reported apart and not timed with the rest. "Added" is each served percentile minus the in-process one.

Environments: ``tests/Echo-v0`` (the example plugin's EchoEnv: a string comparison per step;
``attempts`` large so a session never ends) with ``--trivial-sessions`` (1000), and
``agentrl/Math-v0`` (single turn: every step grades the answer with Math-v0's verifier and ends the
episode, so each step is preceded by a reset, which is not timed) with ``--math-sessions`` (64).

    python -m bench.bench_env_server [--trivial-sessions 1000] [--math-sessions 64] [--steps 5]
        [--pace-s 0.5] [--paced-rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / "tests" / "env_server" / "serve_test_envs.py"
sys.path.insert(0, str(ROOT / "tests" / "plugins" / "agentrl-echo"))

WRONG = "I do not know."  # EchoEnv: not the word, so the episode goes on
MATH_ANSWER = "The answer is \\boxed{0}."


@dataclass
class Run:
    env_id: str
    sessions: int
    held: int = 0
    errors: list[str] = field(default_factory=list)
    rss_before_kib: int = 0
    rss_held_kib: int = 0
    load_ms: list[float] = field(default_factory=list)
    probe_ms: list[float] = field(default_factory=list)
    paced_ms: list[float] = field(default_factory=list)
    pace_s: float = 0.0
    inproc_ms: list[float] = field(default_factory=list)
    open_s: float = 0.0
    cold_ms: float = 0.0
    load_s: float = 0.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start(env_id: str, kwargs: list[str], max_sessions: int, port: int) -> subprocess.Popen[str]:
    command = [sys.executable, str(SERVE), "serve", env_id, *kwargs, "--port", str(port)]
    command += ["--max-sessions", str(max_sessions), "--session-timeout-s", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if "(ready)" not in line:
        process.kill()
        raise RuntimeError(f"the server did not start: {line}{process.communicate()[1]}")
    return process


async def exchange(ws: aiohttp.ClientWebSocketResponse, message: dict[str, Any]) -> dict[str, Any]:
    await ws.send_str(json.dumps(message))
    reply = json.loads(await ws.receive_str())
    if reply.get("type") == "error":
        raise RuntimeError(f"{reply['data'].get('code')}: {reply['data'].get('message')}")
    return reply


async def served(
    run: Run,
    url: str,
    pid: int,
    steps: int,
    probe_steps: int,
    action: str,
    reset_each_step: bool,
    paced_rounds: int,
) -> None:
    run.rss_before_kib = rss_kib(pid)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        sockets: list[aiohttp.ClientWebSocketResponse] = []

        async def open_one(index: int) -> None:
            try:
                ws = await http.ws_connect(f"{url}/ws", max_msg_size=0)
                await exchange(ws, {"type": "reset", "data": {"seed": index}})
                sockets.append(ws)
            except Exception as exc:  # counted, the bench goes on
                run.errors.append(f"open/reset: {type(exc).__name__}: {exc}")

        began = time.perf_counter()
        await asyncio.gather(*(open_one(i) for i in range(run.sessions)))
        run.open_s = time.perf_counter() - began
        run.held = len(sockets)
        await asyncio.sleep(0.5)
        run.rss_held_kib = rss_kib(pid)

        async def step(ws: aiohttp.ClientWebSocketResponse, index: int, into: list[float]) -> None:
            if reset_each_step:
                await exchange(ws, {"type": "reset", "data": {"seed": index}})
            began = time.perf_counter()
            await exchange(ws, {"type": "step", "data": {"text": action, "metadata": {}}})
            into.append((time.perf_counter() - began) * 1000)

        if sockets:  # the server's first step pays lazy imports (Math-v0's verifier): untimed
            cold: list[float] = []
            await step(sockets[0], 0, cold)
            run.cold_ms = cold[0]
            if reset_each_step:
                await exchange(sockets[0], {"type": "reset", "data": {"seed": 0}})

        async def client(ws: aiohttp.ClientWebSocketResponse, index: int) -> None:
            for _ in range(steps):
                try:
                    await step(ws, index, run.load_ms)
                except Exception as exc:
                    run.errors.append(f"step: {type(exc).__name__}: {exc}")
                    return

        began = time.perf_counter()
        await asyncio.gather(*(client(ws, i) for i, ws in enumerate(sockets)))
        run.load_s = time.perf_counter() - began

        phases = random.Random(0)

        async def paced(ws: aiohttp.ClientWebSocketResponse, index: int) -> None:
            start = time.perf_counter() + phases.uniform(0, run.pace_s)
            for round_ in range(paced_rounds):
                await asyncio.sleep(max(0.0, start + round_ * run.pace_s - time.perf_counter()))
                try:
                    await step(ws, index, run.paced_ms)
                except Exception as exc:
                    run.errors.append(f"paced step: {type(exc).__name__}: {exc}")
                    return

        if run.pace_s > 0:
            await asyncio.gather(*(paced(ws, i) for i, ws in enumerate(sockets)))
        if sockets:
            for index in range(probe_steps):
                await step(sockets[0], index % run.sessions, run.probe_ms)
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)


async def in_process(
    run: Run, kwargs: dict[str, Any], seeds: list[int], action: str, reset_each_step: bool
) -> None:
    """The same steps in this process, on the same seeds as the served ones; one untimed first."""
    import gymnasium as gym

    import agentrl.envs  # noqa: F401  (registers agentrl's ids)
    from agentrl.envs import register_env

    if run.env_id == "tests/Echo-v0":
        register_env("tests/Echo-v0", "agentrl_echo:EchoEnv")
    env = gym.make(run.env_id, **kwargs).unwrapped
    await env.areset(seed=0)
    await env.astep(action)
    for index in seeds:
        if reset_each_step:
            await env.areset(seed=index)
        began = time.perf_counter()
        await env.astep(action)
        run.inproc_ms.append((time.perf_counter() - began) * 1000)
    await env.aclose()


def bench(
    env_id: str,
    kwargs: list[str],
    sessions: int,
    steps: int,
    probe_steps: int,
    action: str,
    reset_each_step: bool,
    pace_s: float = 0.0,
    paced_rounds: int = 0,
) -> Run:
    from agentrl.engine_pool.sglang_engine import free_port

    run = Run(env_id, sessions, pace_s=pace_s)
    port = free_port()
    process = start(env_id, kwargs, sessions, port)
    try:
        asyncio.run(
            served(
                run,
                f"http://127.0.0.1:{port}",
                process.pid,
                steps,
                probe_steps,
                action,
                reset_each_step,
                paced_rounds,
            )
        )
    finally:
        process.terminate()
        process.wait(60)
    parsed = {}
    for item in kwargs:
        key, _, value = item.partition("=")
        parsed[key] = int(value) if value.isdigit() else value
    seeds = [index for _ in range(steps) for index in range(sessions)] if reset_each_step else []
    seeds = seeds or [0] * max(200, probe_steps)
    asyncio.run(in_process(run, parsed, seeds, action, reset_each_step))
    return run


def report(run: Run) -> str:
    per_session = (run.rss_held_kib - run.rss_before_kib) / max(1, run.held)
    inproc50, inproc99 = pct(run.inproc_ms, 0.5), pct(run.inproc_ms, 0.99)
    lines = [
        f"{run.env_id}: {run.held}/{run.sessions} sessions held (opened in {run.open_s:.1f} s), "
        f"{len(run.errors)} errors",
        f"  server RSS {run.rss_before_kib / 1024:.0f} MiB before, {run.rss_held_kib / 1024:.0f} "
        f"MiB with the sessions held: {per_session:.0f} KiB per session",
        f"  served, first step of the server (untimed below): {run.cold_ms:.1f} ms",
        f"  in-process step:       p50 {inproc50:.3f} ms, p99 {inproc99:.3f} ms",
        f"  served, all at once:   p50 {pct(run.load_ms, 0.5):.1f} ms, p99 "
        f"{pct(run.load_ms, 0.99):.1f} ms ({len(run.load_ms)} steps, "
        f"{len(run.load_ms) / max(run.load_s, 1e-9):.0f} steps/s); added p50 "
        f"{pct(run.load_ms, 0.5) - inproc50:.1f} ms, p99 {pct(run.load_ms, 0.99) - inproc99:.1f} ms",
        *(
            [
                f"  served, paced ({run.sessions / run.pace_s:.0f} steps/s offered, each session "
                f"every {run.pace_s:g} s): p50 {pct(run.paced_ms, 0.5):.1f} ms, p99 "
                f"{pct(run.paced_ms, 0.99):.1f} ms ({len(run.paced_ms)} steps); added p99 "
                f"{pct(run.paced_ms, 0.99) - inproc99:.1f} ms"
            ]
            if run.pace_s > 0
            else []
        ),
        f"  served, one at a time: p50 {pct(run.probe_ms, 0.5):.2f} ms, p99 "
        f"{pct(run.probe_ms, 0.99):.2f} ms; added p50 {pct(run.probe_ms, 0.5) - inproc50:.2f} ms, "
        f"p99 {pct(run.probe_ms, 0.99) - inproc99:.2f} ms",
    ]
    for error in sorted(set(run.errors))[:5]:
        lines.append(f"  error: {error} (x{run.errors.count(error)})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trivial-sessions", type=int, default=1000)
    parser.add_argument("--math-sessions", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--probe-steps", type=int, default=200)
    parser.add_argument("--pace-s", type=float, default=0.5, help="Echo's paced phase; 0: none")
    parser.add_argument("--paced-rounds", type=int, default=10)
    args = parser.parse_args()
    from agentrl.models import cpu_name

    print(f"CPU: {cpu_name()}; python {sys.version.split()[0]}", flush=True)
    runs = [
        bench(
            "tests/Echo-v0",
            ["attempts=1000000000"],
            args.trivial_sessions,
            args.steps,
            args.probe_steps,
            WRONG,
            reset_each_step=False,
            pace_s=args.pace_s,
            paced_rounds=args.paced_rounds,
        ),
        bench(
            "agentrl/Math-v0",
            [],
            args.math_sessions,
            args.steps,
            args.probe_steps,
            MATH_ANSWER,
            reset_each_step=True,
        ),
    ]
    for run in runs:
        print(report(run), flush=True)
    print(f"median in-process Echo step {statistics.median(runs[0].inproc_ms):.4f} ms")
    return 0 if all(run.held == run.sessions and not run.errors for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
