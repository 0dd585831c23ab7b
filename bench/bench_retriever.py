"""Retrieval service under load: ``agentrl retriever serve`` with request batching vs without.

Two servers run as separate processes (``python -m agentrl.cli retriever serve``) on the same
index: **batched** (the default: requests that arrive while a search runs are searched together)
and **unbatched** (``--no-batching``: one index call per request, on the same single worker
thread). The benchmark process is the load: ``--clients`` concurrent clients (asyncio tasks
with keep-alive connections), each sending one request after another, one query per request, as
Search-v0's search tool does, with Search-R1's body (``{"queries": [q], "topk": 3,
"return_scores": true}``). Queries are the shipped question set's questions and sub-questions.

The servers take turns for ``--rounds`` rounds of ``--seconds`` each (so a neighbour's load hits
both alike); every request is bounded by a timeout and the whole run by rounds x seconds. A
request fails on a non-200 status, a timeout, a connection error or a body without one list of
hits. Prints, per server: requests, failures, queries per second, p50 and p99 latency, the mean
batch size (requests per index call, from ``/health``), and the ratios batched / unbatched.
Exits 1 if the batched server failed any request.

Wall-clock numbers on a small machine (2 cores here: server and clients share them) move with
whatever else runs on it.

    python -m bench.bench_retriever [--clients 64] [--seconds 10] [--rounds 2] [--index DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from agentrl.engine_pool.sglang_engine import free_port
from agentrl.envs.search.qa import SHIPPED_CORPUS, read_questions
from agentrl.models import cpu_name
from agentrl.tools.retriever import cached_index
from bench import percentile

REQUEST_TIMEOUT_S = 30.0


@dataclass
class Load:
    """One server's measured requests over all its rounds."""

    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    batches: int = 0

    @property
    def qps(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else math.nan


class Server:
    """``agentrl retriever serve`` in a child process; stopped on every exit path."""

    def __init__(self, index: Path, batching: bool, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "agentrl.cli", "retriever", "serve", str(index)]
        command += ["--port", str(self.port)] + ([] if batching else ["--no-batching"])
        self.log = open(log_dir / f"serve-{self.port}.log", "w")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}")
            try:
                await self.batches(session)
                return
            except aiohttp.ClientError:
                await asyncio.sleep(0.2)
        raise TimeoutError(f"the server at {self.url} did not start in {timeout:.0f} s")

    async def batches(self, session: aiohttp.ClientSession) -> int:
        async with session.get(f"{self.url}/health") as response:
            return int((await response.json())["batches"])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


async def run_round(
    server: Server, session: aiohttp.ClientSession, queries: list[str], clients: int, seconds: float
) -> Load:
    """``clients`` clients sending requests to ``server`` for ``seconds``."""
    load = Load()
    next_query = itertools.cycle(queries).__next__
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            body = {"queries": [next_query()], "topk": 3, "return_scores": True}
            start = time.perf_counter()
            try:
                async with session.post(f"{server.url}/retrieve", json=body) as response:
                    text = await response.text()
                    status = response.status
                result = json.loads(text)["result"] if status == 200 else None
                if not (isinstance(result, list) and len(result) == 1):
                    load.failures.append(f"status {status}: {text[:200]}")
                    continue
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                load.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            load.latencies.append(time.perf_counter() - start)

    before = await server.batches(session)
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    load.seconds = time.perf_counter() - start
    load.batches = await server.batches(session) - before
    return load


def merge(total: Load, part: Load) -> None:
    total.latencies += part.latencies
    total.failures += part.failures
    total.seconds += part.seconds
    total.batches += part.batches


async def bench(args: argparse.Namespace) -> int:
    index = Path(args.index) if args.index else cached_index(SHIPPED_CORPUS)
    questions = read_questions()
    queries = sorted(
        {q.question for q in questions}
        | {sub for q in questions for sub in q.metadata.get("subquestions") or []}
    )
    print(f"CPU: {cpu_name()}")
    print(f"index: {index}; {len(queries)} distinct queries, one per request, topk 3")
    print(
        f"{args.clients} concurrent clients, {args.rounds} rounds of {args.seconds:g} s per server"
    )
    loads = {"batched": Load(), "unbatched": Load()}
    with tempfile.TemporaryDirectory(prefix="bench-retriever-") as logs:
        servers = {
            "batched": Server(index, True, Path(logs)),
            "unbatched": Server(index, False, Path(logs)),
        }
        connector = aiohttp.TCPConnector(limit=args.clients)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                for server in servers.values():
                    await server.wait_ready(session)
                for server in servers.values():  # warm-up: a second each
                    await run_round(server, session, queries, args.clients, 1.0)
                for _ in range(args.rounds):
                    for name, server in servers.items():
                        part = await run_round(server, session, queries, args.clients, args.seconds)
                        merge(loads[name], part)
        finally:
            for server in servers.values():
                server.stop()
    print(
        f"{'server':<10} {'requests':>9} {'fail':>5} {'q/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'req/batch':>9}"
    )
    for name, load in loads.items():
        per_batch = len(load.latencies) / load.batches if load.batches else math.nan
        print(
            f"{name:<10} {len(load.latencies):>9} {len(load.failures):>5} {load.qps:>8.0f} "
            f"{percentile(load.latencies, 0.5) * 1e3:>8.2f} "
            f"{percentile(load.latencies, 0.99) * 1e3:>8.2f} {per_batch:>9.1f}"
        )
        for failure in load.failures[:10]:
            print(f"FAILURE {name}: {failure}")
    ours, base = loads["batched"], loads["unbatched"]
    print(
        f"batched / unbatched: q/s {ours.qps / base.qps:.2f}x, "
        f"p50 {percentile(ours.latencies, 0.5) / percentile(base.latencies, 0.5):.2f}x, "
        f"p99 {percentile(ours.latencies, 0.99) / percentile(base.latencies, 0.99):.2f}x"
    )
    return 1 if ours.failures or not ours.latencies else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of one round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per server, alternating")
    parser.add_argument("--index", help="an index directory (default: the shipped corpus's)")
    return asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
