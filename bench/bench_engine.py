"""LocalEngine throughput: concurrent requests vs one at a time vs transformers' own batched generate.

Same model (SmolLM2-135M-Instruct, float32, CPU), same prompts, every run generating exactly
``--max-new-tokens`` per request (eos ignored):

1. **sequential**: LocalEngine, one request at a time (the baseline);
2. **concurrent**: LocalEngine, all requests submitted at once (continuous batching);
3. **HF generate**: ``model.generate`` on the same left-padded batch, sampling at T=1 with no
   log-probs, as a reference for what plain transformers does with the same batch.

Prints tokens/s of each and the ratios concurrent/sequential and concurrent/HF generate.

    python -m bench.bench_engine [--requests 16] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from agentrl.engine_pool import LocalEngine, SamplingParams
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


async def main(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer("smollm2")
    model = load_model("smollm2")
    batch = prompts(tokenizer, args.requests)
    rates: dict[str, float] = {}

    def report(name: str, tokens: int, seconds: float) -> None:
        rates[name] = tokens / seconds
        print(f"{name:12s} {tokens:6d} tokens in {seconds:6.1f} s = {rates[name]:6.1f} tokens/s")

    async with LocalEngine(model, tokenizer=tokenizer, max_batch_size=args.requests) as engine:
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
    print(f"concurrent / sequential  = {rates['concurrent'] / rates['sequential']:.2f}x")
    print(f"concurrent / HF generate = {rates['concurrent'] / rates['HF generate']:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    asyncio.run(main(parser.parse_args()))
