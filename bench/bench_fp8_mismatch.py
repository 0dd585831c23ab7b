"""Train/inference mismatch with and without FP8 rollout weights (engines.fp8_weights).

The same prompts are generated (sampled at T = 1, fixed seeds) by two embedded engines over SmolLM2:
one with the weights as loaded, one with blockwise-FP8 weights (`agentrl.fp8_weights`, SGLang's
128x128 layout, what ``engines.fp8_weights=true`` serves). For each, the trainer's float32 model
recomputes the log-probs of the generated tokens, and the script prints what the trainer logs as
``mismatch/mean_abs`` and ``mismatch/max_abs`` (mean and max |trainer - engine| log-prob over all
generated tokens). On a GPU (``--device cuda --dtype bfloat16``) the
first engine differs from the trainer by bf16 kernels, the second by those and the FP8 rounding.

    python -m bench.bench_fp8_mismatch [--prompts 16] [--max-new-tokens 64]
    python -m bench.bench_fp8_mismatch --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import asyncio
import copy

import torch

from agentrl.engine_pool import LocalEngine, SamplingParams
from agentrl.models import load_model, load_tokenizer
from agentrl.training.logprobs import logprob_mismatch

QUESTIONS = [
    "What is {a} + {b}? Answer with the number.",
    "Write a haiku about the number {a}.",
    "Explain in two sentences why {a} is {parity}.",
    "List {b} fruits, one per line.",
]


def prompts(tokenizer: object, count: int) -> list[list[int]]:
    out = []
    for i in range(count):
        a, b = 17 + 7 * i, 3 + i % 5
        text = QUESTIONS[i % len(QUESTIONS)].format(a=a, b=b, parity="odd" if a % 2 else "even")
        messages = [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        out.append(list(ids))
    return out


async def measure(trainer: torch.nn.Module, engine: LocalEngine, inputs, args) -> dict[str, float]:
    results = await asyncio.gather(
        *(
            engine.generate(ids, SamplingParams(max_new_tokens=args.max_new_tokens, seed=i))
            for i, ids in enumerate(inputs)
        )
    )
    total = {"abs": 0.0, "max_abs": 0.0, "tokens": 0}
    for ids, result in zip(inputs, results, strict=True):
        report = logprob_mismatch(
            trainer,
            ids + result.token_ids,
            [0.0] * len(ids) + result.logprobs,
            [0] * len(ids) + [1] * len(result.token_ids),
            1.0,
        )
        n = report["n_tokens"]
        total["abs"] += report["mean_abs"] * n
        total["max_abs"] = max(total["max_abs"], report["max_abs"])
        total["tokens"] += n
    n = max(total["tokens"], 1)
    return {
        "mean_abs": total["abs"] / n,
        "max_abs": total["max_abs"],
        "tokens": n,
    }


async def main(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer("smollm2")
    trainer = load_model("smollm2", dtype="float32").eval()
    inputs = prompts(tokenizer, args.prompts)
    where = f"SmolLM2 engines in {args.dtype} on {args.device}, trainer in float32 on the CPU"
    print(f"{where}; {args.prompts} prompts x {args.max_new_tokens} tokens at T = 1")
    rows = {}
    for name, fp8 in (("engine weights as trained", False), ("FP8 rollout weights", True)):
        model = copy.deepcopy(trainer).to(getattr(torch, args.dtype))
        async with LocalEngine(
            model, tokenizer=tokenizer, fp8_weights=fp8, device=args.device
        ) as engine:
            rows[name] = await measure(trainer, engine, inputs, args)
        row = rows[name]
        print(
            f"{name:26s} mismatch/mean_abs {row['mean_abs']:.2e}  mismatch/max_abs "
            f"{row['max_abs']:.2e}  ({row['tokens']} tokens)",
            flush=True,
        )
    base, fp8_row = rows["engine weights as trained"], rows["FP8 rollout weights"]
    print(f"FP8 / as trained, mean |Δ log p| = {fp8_row['mean_abs'] / base['mean_abs']:.0f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    asyncio.run(main(parser.parse_args()))
