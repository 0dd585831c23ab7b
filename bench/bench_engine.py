"""LocalEngine throughput: concurrent requests vs one at a time vs transformers' own batched generate,
and multi-turn sessions with the prefix cache on vs off.

Same model (SmolLM2-135M-Instruct, float32, CPU), same prompts, every run generating exactly
``--max-new-tokens`` per request (eos ignored):

1. **sequential**: LocalEngine (prefix cache off), one request at a time (the baseline);
2. **concurrent**: LocalEngine, all requests submitted at once (continuous batching);
3. **HF generate**: ``model.generate`` on the same left-padded batch, sampling at T=1 with no
   log-probs, as a reference for what plain transformers does with the same batch.

Then ``--sessions`` conversations run concurrently for ``--turns`` turns of ``--turn-tokens``
tokens each; every turn's prompt is the previous prompt + its completion + a tool-result delta (as
in a rollout), so without prefix caching each turn re-prefills the whole conversation:

4. **multi-turn, cache off**: LocalEngine with ``prefix_cache_tokens=0`` (the baseline);
5. **multi-turn, cache on**: the default LocalEngine, same seeds.

Prints tokens/s of each, the ratios concurrent/sequential, concurrent/HF generate and cache
on/off, the prefix hit rate, and how many completions were identical with and without the cache.

    python -m bench.bench_engine [--requests 16] [--max-new-tokens 64]
                                 [--sessions 16] [--turns 4] [--turn-tokens 4]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from agentrl.engine_pool import GenerateResult, LocalEngine, SamplingParams
from agentrl.models import load_model, load_tokenizer


def prompts(tokenizer, n: int) -> list[list[int]]:
    questions = [f"Count from {i + 1} upwards, one number per line." for i in range(n)]
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False
            )
        )
        for q in questions
    ]


def hf_generate(model, batch: list[list[int]], max_new_tokens: int, pad_id: int) -> int:
    width = max(len(p) for p in batch)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=True,
            top_k=0,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            pad_token_id=pad_id,
        )
    return (out.shape[1] - width) * len(batch)


def tool_delta(tokenizer) -> list[int]:
    """The tokens a chat template appends after an assistant turn for a short tool result."""
    text = (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
        '{"status": "ok", "lines": 3, "next": "continue counting"}\n'
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    return tokenizer.encode(text, add_special_tokens=False)


async def multi_turn(
    engine: LocalEngine, prompts: list[list[int]], delta: list[int], args: argparse.Namespace
) -> list[GenerateResult]:
    """Run every session's turns (sessions concurrently); return all results in a fixed order."""

    async def session(index: int, prompt: list[int]) -> list[GenerateResult]:
        ids, results = list(prompt), []
        for turn in range(args.turns):
            sampling = SamplingParams(
                max_new_tokens=args.turn_tokens, ignore_eos=True, seed=index * args.turns + turn
            )
            result = await engine.generate(ids, sampling, session_id=f"session-{index}")
            results.append(result)
            ids = ids + result.token_ids + delta
        return results

    sessions = await asyncio.gather(*(session(i, p) for i, p in enumerate(prompts)))
    return [result for results in sessions for result in results]


async def main(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer("smollm2")
    model = load_model("smollm2")
    batch = prompts(tokenizer, args.requests)
    rates: dict[str, float] = {}

    def report(name: str, tokens: int, seconds: float) -> None:
        rates[name] = tokens / seconds
        print(f"{name:12s} {tokens:6d} tokens in {seconds:6.1f} s = {rates[name]:6.1f} tokens/s")

    # batching alone: with a prefix cache the runs would reuse each other's prompts (measured below)
    async with LocalEngine(
        model, tokenizer=tokenizer, max_batch_size=args.requests, prefix_cache_tokens=0
    ) as engine:
        await engine.generate(batch[0], SamplingParams(max_new_tokens=4))  # warm up

        def sampling(i: int) -> SamplingParams:
            return SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True, seed=i)

        start = time.perf_counter()
        tokens = 0
        for i, prompt in enumerate(batch):
            tokens += len((await engine.generate(prompt, sampling(i))).token_ids)
        report("sequential", tokens, time.perf_counter() - start)

        start = time.perf_counter()
        results = await asyncio.gather(
            *(engine.generate(p, sampling(i)) for i, p in enumerate(batch))
        )
        report("concurrent", sum(len(r.token_ids) for r in results), time.perf_counter() - start)
        print(f"engine stats: {engine.stats}")

    start = time.perf_counter()
    tokens = hf_generate(model, batch, args.max_new_tokens, tokenizer.eos_token_id)
    report("HF generate", tokens, time.perf_counter() - start)

    sessions, delta = prompts(tokenizer, args.sessions), tool_delta(tokenizer)
    outputs: dict[str, list[GenerateResult]] = {}
    for name, cache_tokens in (("cache off", 0), ("cache on", 65536)):
        async with LocalEngine(
            model,
            tokenizer=tokenizer,
            max_batch_size=args.sessions,
            prefix_cache_tokens=cache_tokens,
        ) as engine:
            warm_up = tokenizer.encode("Hello", add_special_tokens=False)  # shares no prefix
            await engine.generate(warm_up, SamplingParams(max_new_tokens=4))
            before = engine.stats.prefill_tokens, engine.stats.prefix_hit_tokens
            start = time.perf_counter()
            outputs[name] = await multi_turn(engine, sessions, delta, args)
            report(name, sum(len(r.token_ids) for r in outputs[name]), time.perf_counter() - start)
            computed = engine.stats.prefill_tokens - before[0]
            hits = engine.stats.prefix_hit_tokens - before[1]
            print(
                f"{'':12s} prefilled {computed} tokens, reused {hits} "
                f"(hit rate {hits / (hits + computed):.1%})"
            )
    pairs = zip(outputs["cache off"], outputs["cache on"], strict=True)
    same = sum(off.token_ids == on.token_ids for off, on in pairs)

    print(f"concurrent / sequential  = {rates['concurrent'] / rates['sequential']:.2f}x")
    print(f"concurrent / HF generate = {rates['concurrent'] / rates['HF generate']:.2f}x")
    print(
        f"multi-turn cache on / off = {rates['cache on'] / rates['cache off']:.2f}x "
        f"({args.sessions} sessions x {args.turns} turns x {args.turn_tokens} tokens, "
        f"{len(delta)}-token deltas; {same}/{len(outputs['cache on'])} "
        "completions identical)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=4)
    asyncio.run(main(parser.parse_args()))
