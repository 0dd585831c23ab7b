"""The embedded engine's sampling step: a ``torch.multinomial`` per row (the engine's sampler before
2026-11-28, the baseline) against :func:`agentrl.engine_pool.sampling.sample_next_tokens` (an
exponential race over the whole batch), on one decode step's logits.

Each row has its own seeded generator, as in the engine. On an H200 the per-row sampler capped the
engine at ~600 tokens/s with 128 rows (``scripts/gpu-proof``'s rollout step); on the CPU it took
175 of the 190 ms of a decode step of a one-layer model with SmolLM2's vocabulary.

    python -m bench.bench_sampling [--rows 128] [--vocab 49152] [--device cpu|cuda] [--json F]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from agentrl.engine_pool import SamplingParams
from agentrl.engine_pool.sampling import sample_next_tokens
from agentrl.models import cpu_name


def per_row_multinomial(
    logits: torch.Tensor, generators: list[torch.Generator]
) -> tuple[list[int], list[float]]:
    """The baseline: softmax of the batch, then one ``torch.multinomial`` (and sync) per row."""
    scaled = logits.float()
    probs = torch.softmax(scaled, dim=-1)
    tokens = [
        int(torch.multinomial(probs[row], 1, generator=generator))
        for row, generator in enumerate(generators)
    ]
    index = torch.tensor(tokens, device=logits.device).unsqueeze(1)
    logprobs = scaled.gather(1, index).squeeze(1) - torch.logsumexp(scaled, dim=-1)
    return tokens, logprobs.tolist()


def seconds_per_call(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()  # both return Python lists: every call ends synchronised
    return (time.perf_counter() - start) / repeats


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="write the numbers to this file")
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU: {cpu_name()}"
    print(f"{where}; {args.rows} rows x {args.vocab} logits, {torch.get_num_threads()} threads")
    logits = 3 * torch.randn(args.rows, args.vocab, generator=torch.Generator().manual_seed(0))
    logits = logits.to(device)
    params = [SamplingParams(temperature=1.0, seed=row) for row in range(args.rows)]

    def generators() -> list[torch.Generator]:
        return [torch.Generator(device).manual_seed(row) for row in range(args.rows)]

    baseline_gens, race_gens = generators(), generators()
    baseline = seconds_per_call(
        lambda: per_row_multinomial(logits, baseline_gens), device, args.repeats
    )
    race = seconds_per_call(
        lambda: sample_next_tokens(logits, params, race_gens), device, args.repeats
    )
    print(f"per-row multinomial (baseline)  {baseline * 1e3:8.2f} ms per step")
    print(f"exponential race (ours)         {race * 1e3:8.2f} ms per step")
    print(f"speed-up                        {baseline / race:8.2f}x")
    if args.json:
        record = {"device": where, "rows": args.rows, "vocab": args.vocab}
        record |= {"baseline_ms": baseline * 1e3, "race_ms": race * 1e3, "speedup": baseline / race}
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(parse_args())
