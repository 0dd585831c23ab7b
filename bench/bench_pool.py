"""EnginePool over two `agentrl serve` processes vs one in-process LocalEngine; sticky vs random routing.

1. **Throughput and added latency.** ``--requests`` concurrent requests of ``--tokens`` tokens each
   (seeded sampling, ``ignore_eos``) through (a) one in-process ``LocalEngine`` and (b) an
   ``EnginePool`` of two ``SGLangEngine`` clients of two ``agentrl serve`` processes. Then one
   request at a time (``--latency-requests`` of 1 token): the pool's added latency per request is
   the HTTP + routing cost. On a 2-core machine the two servers share the same cores, so (b) cannot
   be faster than (a); the ratio shows what the HTTP path costs, not what more machines would give.
2. **Prefix-cache reuse.** ``--sessions`` multi-turn sessions of ``--turns`` turns each, every turn's
   prompt being the previous prompt + its output + a few new tokens, through the pool with sticky
   sessions vs a random router (same pool class, ``_choose`` picks a random healthy engine). The
   hit rate is ``prefix_hit_tokens / (prefix_hit_tokens + prefill_tokens)`` summed over both
   servers' ``/server_info``, with caches flushed before each run.

    python -m bench.bench_pool [--model smollm2] [--requests 32] [--tokens 32] [--sessions 16] [--turns 4]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from agentrl.engine_pool import EnginePool, LocalEngine, SamplingParams, SGLangEngine
from agentrl.engine_pool.sglang_engine import free_port, serve_command
from agentrl.models import load_model, load_tokenizer
from agentrl.training.checkpoint import export_hf


class RandomRoutingPool(EnginePool):
    """The baseline router: every request to a random healthy engine, sessions ignored."""

    def _choose(self, session_id):
        return random.choice(self.healthy)


async def throughput(engine, requests: int, tokens: int) -> float:
    sampling = [
        SamplingParams(max_new_tokens=tokens, ignore_eos=True, seed=i) for i in range(requests)
    ]
    start = time.perf_counter()
    await asyncio.gather(*(engine.generate([1, 2, 3, 4 + i], s) for i, s in enumerate(sampling)))
    return requests * tokens / (time.perf_counter() - start)


async def latency_ms(engine, count: int) -> float:
    one = SamplingParams(max_new_tokens=1, temperature=0)
    times = []
    for i in range(count):
        start = time.perf_counter()
        await engine.generate([1, 2, 3, 10 + i], one)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def hit_rate(pool: EnginePool, engines, sessions: int, turns: int, seed: int) -> float:
    for engine in engines:
        await engine.flush_cache()
    before = [(await e.server_info())["stats"] for e in engines]
    rng = random.Random(seed)
    prompts = {f"s{i}": [1, *rng.sample(range(100, 40000), 24)] for i in range(sessions)}
    sampling = SamplingParams(max_new_tokens=8, ignore_eos=True, seed=seed)
    for _ in range(turns):
        results = await asyncio.gather(
            *(pool.generate(ids, sampling, session_id=sid) for sid, ids in prompts.items())
        )
        for (sid, ids), result in zip(list(prompts.items()), results, strict=True):
            prompts[sid] = [*ids, *result.token_ids, *rng.sample(range(100, 40000), 6)]
    after = [(await e.server_info())["stats"] for e in engines]
    hits = sum(
        a["prefix_hit_tokens"] - b["prefix_hit_tokens"] for a, b in zip(after, before, strict=True)
    )
    computed = sum(
        a["prefill_tokens"] - b["prefill_tokens"] for a, b in zip(after, before, strict=True)
    )
    return hits / (hits + computed)


async def main(args: argparse.Namespace) -> None:
    model_dir = Path(tempfile.mkdtemp(prefix="bench-pool-"))
    if Path(args.model).is_dir():
        model_dir = Path(args.model)
    else:  # a Hugging Face directory loads in seconds in each server process
        export_hf(load_model(args.model), load_tokenizer(args.model), model_dir)
    ports = [free_port(), free_port()]
    servers = await asyncio.gather(
        *(
            SGLangEngine.launch(
                serve_command(str(model_dir), port, max_batch_size=args.requests),
                f"http://127.0.0.1:{port}",
            )
            for port in ports
        )
    )
    async with LocalEngine(model_dir, max_batch_size=args.requests) as local:
        await throughput(local, 4, 4)  # warm-up
        local_tps = await throughput(local, args.requests, args.tokens)
        local_ms = await latency_ms(local, args.latency_requests)
    async with EnginePool(servers, max_inflight_per_engine=args.requests) as pool:
        await throughput(pool, 4, 4)
        pool_tps = await throughput(pool, args.requests, args.tokens)
        pool_ms = await latency_ms(pool, args.latency_requests)
        sticky = await hit_rate(pool, servers, args.sessions, args.turns, seed=1)
        randomized = RandomRoutingPool(servers)
        scattered = await hit_rate(randomized, servers, args.sessions, args.turns, seed=1)
    print(f"{args.requests} requests x {args.tokens} tokens, 2 CPU cores shared by everything")
    print(f"{'path':52} {'tok/s':>8} {'median 1-token latency':>24}")
    print(f"{'in-process LocalEngine':52} {local_tps:8.1f} {local_ms:21.1f} ms")
    print(
        f"{'EnginePool over 2 agentrl serve processes (HTTP)':52} {pool_tps:8.1f} {pool_ms:21.1f} ms"
    )
    print(
        f"throughput ratio pool/local: {pool_tps / local_tps:.2f}x; added latency per request: {pool_ms - local_ms:.1f} ms"
    )
    print(f"\nprefix-cache hit rate, {args.sessions} sessions x {args.turns} turns over 2 servers:")
    print(f"  sticky sessions (EnginePool): {sticky:.1%}")
    print(f"  random routing (baseline):    {scattered:.1%}")
    print(f"  ratio sticky/random: {sticky / max(scattered, 1e-9):.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--latency-requests", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    asyncio.run(main(parser.parse_args()))
