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
    python -m bench.bench_fp8_mismatch --model DIR --weights as-trained --json out.json

``--model`` takes a model directory instead of SmolLM2 (``scripts/gpu-proof`` passes one with random
weights, since a lent GPU cannot reach SmolLM2's); ``--weights`` runs one engine only; ``--json``
writes the numbers to a file.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
from pathlib import Path

import torch

from agentrl.engine_pool import LocalEngine, SamplingParams
from agentrl.models import load_model, load_tokenizer
from agentrl.training.logprobs import logprob_mismatch

AS_TRAINED, FP8 = "engine weights as trained", "FP8 rollout weights"
WEIGHTS = {AS_TRAINED: "as-trained", FP8: "fp8"}
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
    tokenizer = load_tokenizer(args.model)
    trainer = load_model(args.model, dtype="float32").eval()
    inputs = prompts(tokenizer, args.prompts)
    where = f"{args.model} engines in {args.dtype} on {args.device}, trainer in float32 on the CPU"
    print(f"{where}; {args.prompts} prompts x {args.max_new_tokens} tokens at T = 1")
    rows = {}
    for name, fp8 in WEIGHTS.items():
        if fp8 not in args.weights:
            continue
        model = copy.deepcopy(trainer).to(getattr(torch, args.dtype))
        async with LocalEngine(
            model, tokenizer=tokenizer, fp8_weights=fp8 == "fp8", device=args.device
        ) as engine:
            rows[name] = await measure(trainer, engine, inputs, args)
        row = rows[name]
        print(
            f"{name:26s} mismatch/mean_abs {row['mean_abs']:.2e}  mismatch/max_abs "
            f"{row['max_abs']:.2e}  ({row['tokens']} tokens)",
            flush=True,
        )
    if len(rows) == 2:
        base, fp8_row = rows[AS_TRAINED], rows[FP8]
        print(f"FP8 / as trained, mean |Δ log p| = {fp8_row['mean_abs'] / base['mean_abs']:.0f}x")
    if args.json:
        device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
        record = {"model": str(args.model), "device": device, "dtype": args.dtype, "rows": rows}
        Path(args.json).write_text(json.dumps(record, indent=1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--model", default="smollm2", help="smollm2 or a model directory")
    parser.add_argument(
        "--weights", nargs="+", choices=list(WEIGHTS.values()), default=list(WEIGHTS.values())
    )
    parser.add_argument("--json", type=Path, help="write the numbers to this file")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
