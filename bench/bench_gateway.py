"""The OpenAI-compatible endpoint vs raw ``/generate`` on the same ``agentrl serve`` engine.

1. **Under load.** ``--sessions`` (64) concurrent sessions of ``--turns`` chat calls each, through
   ``/sessions/{id}/v1/chat/completions`` (recorded, as in training; each turn appends the reply
   and a user message), at most ``--max-tokens`` tokens a call. Then the same work through
   ``/generate``: every session replays its calls' ``prompt_token_ids`` in order, each with
   ``max_new_tokens`` = the tokens its chat call got and ``ignore_eos``, so both paths prefill and
   decode the same ids. The prefix cache is flushed before every pass; passes alternate
   (``--repeats`` of each). Reported: per-call latency p50/p99 of each path and the difference,
   and throughput (completion tokens/s) with its ratio endpoint/raw.
2. **One call at a time.** ``--latency-calls`` one-token calls, endpoint and raw alternating, on
   the same prompt: the added latency per call without batching.
3. **Trajectory assembly per call**, in this process: a :class:`Gateway` over a
   :class:`LocalEngine`; ``Gateway.chat`` time minus the engine's ``generate`` time (templating,
   the session's fork and delta, the reply's parsing, the verdict, the commit), per call of
   ``--assembly-sessions`` sessions of ``--assembly-turns`` turns; and closing a session.

    python -m bench.bench_gateway [--sessions 64] [--turns 3] [--max-tokens 16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from agentrl.engine_pool import LocalEngine, SGLangEngine
from agentrl.engine_pool.gateway import Gateway
from agentrl.engine_pool.gateway.protocol import parse_chat_request
from agentrl.engine_pool.sglang_engine import free_port, serve_command
from agentrl.models import cpu_name, load_model, load_tokenizer

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}


def question(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"What is {i} plus {2 * i + 1}? Explain in one sentence."}


def follow_up(turn: int) -> dict[str, str]:
    return {"role": "user", "content": f"Thanks. Now check step {turn} once more."}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, json=body) as response:
        data: dict[str, Any] = await response.json()
        if response.status != 200:
            raise RuntimeError(f"{url}: {response.status} {data}")
        return data


async def endpoint_pass(http, url, args, tag) -> tuple[list[float], int, float, list[list]]:
    """The sessions through the endpoint: (latencies ms, tokens, wall s, per session its calls'
    (prompt ids, completion length))."""
    latencies: list[float] = []
    calls: list[list[tuple[list[int], int]]] = [[] for _ in range(args.sessions)]

    async def session(i: int) -> None:
        messages = [SYSTEM, question(i)]
        base = f"{url}/sessions/{tag}-{i}/v1/chat/completions"
        for turn in range(args.turns):
            body = {"model": "smollm2", "messages": messages, "max_tokens": args.max_tokens}
            body["seed"] = 1000 * i + turn
            start = time.perf_counter()
            reply = await post(http, base, body)
            latencies.append((time.perf_counter() - start) * 1000)
            choice = reply["choices"][0]
            calls[i].append((reply["prompt_token_ids"], len(choice["token_ids"])))
            messages = [*messages, choice["message"], follow_up(turn)]
        async with http.get(f"{url}/sessions/{tag}-{i}/trajectories") as response:
            await response.read()  # closes it

    start = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(args.sessions)))
    wall = time.perf_counter() - start
    return latencies, sum(n for c in calls for _, n in c), wall, calls


async def raw_pass(http, url, calls) -> tuple[list[float], int, float]:
    """The same calls through ``/generate``: (latencies ms, tokens, wall s)."""
    latencies: list[float] = []

    async def session(i: int) -> None:
        for turn, (ids, tokens) in enumerate(calls[i]):
            body = {
                "input_ids": ids,
                "sampling_params": {
                    "max_new_tokens": tokens,
                    "ignore_eos": True,
                    "temperature": 1.0,
                    "sampling_seed": 1000 * i + turn,
                },
                "return_logprob": True,
            }
            start = time.perf_counter()
            await post(http, f"{url}/generate", body)
            latencies.append((time.perf_counter() - start) * 1000)

    start = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(len(calls))))
    return latencies, sum(n for c in calls for _, n in c), time.perf_counter() - start


async def one_at_a_time(http, url, count: int) -> tuple[list[float], list[float]]:
    messages = [SYSTEM, question(7)]
    body = {"model": "smollm2", "messages": messages, "max_tokens": 1, "temperature": 0}
    first = await post(http, f"{url}/v1/chat/completions", body)
    ids = first["prompt_token_ids"]
    raw_body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_logprob": True,
    }
    endpoint, raw = [], []
    for i in range(count):
        start = time.perf_counter()
        await post(http, f"{url}/sessions/one-{i}/v1/chat/completions", body)
        endpoint.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        await post(http, f"{url}/generate", raw_body)
        raw.append((time.perf_counter() - start) * 1000)
        async with http.get(f"{url}/sessions/one-{i}/trajectories") as response:
            await response.read()
    return endpoint, raw


@dataclass
class Totals:
    """One path's calls over the passes: latencies (ms), completion tokens, wall seconds."""

    lat: list[float] = field(default_factory=list)
    tokens: int = 0
    wall: float = 0.0
    last: str = ""

    def add(self, lat: list[float], tokens: int, wall: float) -> None:
        self.lat += lat
        self.tokens += tokens
        self.wall += wall
        self.last = f"{tokens / wall:.1f} tok/s, p50 {percentile(lat, 0.5):.0f} ms"

    @property
    def tps(self) -> float:
        return self.tokens / self.wall


class TimedEngine:
    """Delegates to a real engine and adds up the time its ``generate`` calls take."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine
        self.seconds = 0.0

    async def generate(self, input_ids, sampling, session_id=None):
        start = time.perf_counter()
        try:
            return await self.engine.generate(input_ids, sampling, session_id=session_id)
        finally:
            self.seconds += time.perf_counter() - start

    async def end_session(self, session_id):
        await self.engine.end_session(session_id)


async def assembly(args) -> tuple[list[float], list[float], dict[int, float]]:
    """Per call: ms of ``Gateway.chat`` outside the engine; per session: ms to close it; the
    median per-call ms by turn."""
    tokenizer = load_tokenizer("smollm2")
    async with LocalEngine(load_model("smollm2"), tokenizer=tokenizer) as local:
        timed = TimedEngine(local)
        gateway = Gateway(timed, tokenizer, model_name="smollm2")  # type: ignore[arg-type]
        per_call: list[float] = []
        by_turn: dict[int, list[float]] = {}
        closing: list[float] = []
        for i in range(args.assembly_sessions):
            messages: list[dict[str, Any]] = [SYSTEM, question(i)]
            for turn in range(args.assembly_turns):
                body = {"model": "smollm2", "messages": messages, "max_tokens": 8, "seed": i}
                request = parse_chat_request(body)
                timed.seconds = 0.0
                start = time.perf_counter()
                done = await gateway.chat(request, f"assembly-{i}")
                outside = (time.perf_counter() - start - timed.seconds) * 1000
                if i > 0:  # the first session warms up
                    per_call.append(outside)
                    by_turn.setdefault(turn, []).append(outside)
                reply = {"role": "assistant", "content": done.choices[0].text}
                messages = [*messages, reply, follow_up(turn)]
            start = time.perf_counter()
            gateway.sessions.close(f"assembly-{i}").to_dict()
            closing.append((time.perf_counter() - start) * 1000)
    return per_call, closing, {t: statistics.median(v) for t, v in sorted(by_turn.items())}


async def main(args: argparse.Namespace) -> None:
    print(f"CPU: {cpu_name()}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = await SGLangEngine.launch(
        serve_command("smollm2", port, max_batch_size=args.sessions), url
    )
    try:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            small = argparse.Namespace(**{**vars(args), "sessions": 4, "turns": 1})
            _, _, _, warm = await endpoint_pass(http, url, small, "warm")
            await raw_pass(http, url, warm)
            endpoint, raw = Totals(), Totals()
            for repeat in range(args.repeats):
                await post_flush(http, url)
                lat, tokens, wall, calls = await endpoint_pass(http, url, args, f"load{repeat}")
                endpoint.add(lat, tokens, wall)
                await post_flush(http, url)
                raw.add(*await raw_pass(http, url, calls))
                print(f"pass {repeat + 1}: endpoint {endpoint.last}; raw {raw.last}", flush=True)
            one_endpoint, one_raw = await one_at_a_time(http, url, args.latency_calls)
    finally:
        await server.aclose()
    per_call, closing, by_turn = await assembly(args)

    calls = args.sessions * args.turns
    print(
        f"\n1. {args.sessions} concurrent sessions x {args.turns} calls, <= {args.max_tokens} tokens "
        f"a call, {args.repeats} passes each ({calls} calls a pass), one agentrl serve smollm2"
    )
    print(f"{'path':34} {'p50 ms':>9} {'p99 ms':>9} {'tokens/s':>9}")
    for name, row in (("raw /generate", raw), ("endpoint /sessions/{id}/v1/chat", endpoint)):
        p50, p99 = percentile(row.lat, 0.5), percentile(row.lat, 0.99)
        print(f"{name:34} {p50:9.1f} {p99:9.1f} {row.tps:9.1f}")
    p50 = percentile(endpoint.lat, 0.5) - percentile(raw.lat, 0.5)
    p99 = percentile(endpoint.lat, 0.99) - percentile(raw.lat, 0.99)
    ratio = endpoint.tps / raw.tps
    print(
        f"added per call: p50 {p50:+.1f} ms, p99 {p99:+.1f} ms; throughput endpoint/raw {ratio:.2f}x"
    )

    added = [e - r for e, r in zip(one_endpoint, one_raw, strict=True)]
    print(f"\n2. one call at a time, 1 token, {args.latency_calls} calls each (alternating)")
    print(
        f"raw p50 {statistics.median(one_raw):.1f} ms, endpoint p50 "
        f"{statistics.median(one_endpoint):.1f} ms; added p50 {statistics.median(added):.1f} ms, "
        f"p99 {percentile(added, 0.99):.1f} ms"
    )

    print(
        f"\n3. trajectory assembly in Gateway.chat, outside the engine ({args.assembly_sessions - 1} "
        f"sessions x {args.assembly_turns} calls, in process)"
    )
    print(
        f"per call: p50 {percentile(per_call, 0.5):.2f} ms, p99 {percentile(per_call, 0.99):.2f} ms; "
        f"closing a session (SessionRecord.to_dict): p50 {statistics.median(closing):.2f} ms"
    )
    print("median by call: " + ", ".join(f"#{t + 1} {ms:.2f} ms" for t, ms in by_turn.items()))


async def post_flush(http: aiohttp.ClientSession, url: str) -> None:
    async with http.post(f"{url}/flush_cache") as response:
        await response.read()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--latency-calls", type=int, default=40)
    parser.add_argument("--assembly-sessions", type=int, default=9)
    parser.add_argument("--assembly-turns", type=int, default=8)
    asyncio.run(main(parser.parse_args()))
