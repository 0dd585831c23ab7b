"""Trainer tokens/s with sequence packing vs padding to the longest sequence, same run, same model.

SmolLM2-135M-Instruct (float32, CPU), one forward + backward of a token-mean policy-gradient-like
loss (``-mean log-prob`` over loss tokens) per micro batch, gradients accumulated, no optimizer
step, over one batch with a realistic RL length mix: prompts of 100-300 tokens, completions
log-normal (median about 200) with a long tail cut at 1500. Both sides score the same sequences:

1. **padded + mask** (baseline): fixed micro batches of ``--micro-batch-size`` sequences in
   arrival order, each right-padded to its longest sequence, scored with an attention mask by
   :func:`agentrl.training.logprobs.token_logprobs`, as a trainer without packing calls it;
2. **padded, causal only** (stronger baseline): the same micro batches without the mask. With
   right padding the causal mask alone keeps pads out of every real token's context, and sdpa can
   take its fast ``is_causal`` path;
3. **packed**: :func:`agentrl.training.packing.pack` into micro batches of at most
   ``--max-tokens`` tokens, scored by :func:`agentrl.training.packing.packed_logprobs`.

Only real tokens count toward tokens/s. Also printed: the tokens each side computes (padding
included) and the attention score entries (sum of ``T^2``): on the CPU, sdpa evaluates a packed
micro batch's whole ``T x T`` block-diagonal mask (varlen GPU kernels would not), and with any
mask it keeps the attention weights of every layer for the backward, which bounds memory (the
defaults peaked at about 10 GB). ``--repeats`` interleaves the sides and keeps each one's fastest
run, which matters on a shared machine.

    python -m bench.bench_packing [--sequences 16] [--max-tokens 2048] [--micro-batch-size 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import torch

from agentrl.models import load_model
from agentrl.training.logprobs import token_logprobs
from agentrl.training.packing import pack, packed_logprobs

Work = tuple[int, int]
"""(tokens computed, padding included; attention score entries per head, the sum of T^2)."""


def length_mix(n: int, seed: int) -> list[tuple[int, int]]:
    """``n`` (prompt, completion) lengths: prompts uniform 100-300, completions long-tailed."""
    rng = random.Random(seed)
    return [
        (rng.randint(100, 300), min(1500, max(8, round(rng.lognormvariate(5.3, 0.9)))))
        for _ in range(n)
    ]


def make_sequences(lengths: list[tuple[int, int]], vocab: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "input_ids": [rng.randrange(vocab) for _ in range(prompt + completion)],
            "loss_mask": [0] * prompt + [1] * completion,
            "real": [1] * (prompt + completion),  # the padded baseline's attention mask
        }
        for prompt, completion in lengths
    ]


def right_padded(group: list[dict], key: str) -> torch.Tensor:
    """Column ``key`` of ``group`` as ``(B, W)`` int64, zero-padded to the longest."""
    width = max(len(s[key]) for s in group)
    return torch.tensor([s[key] + [0] * (width - len(s[key])) for s in group])


def padded_step(model, sequences: list[dict], micro_batch_size: int, masked: bool) -> Work:
    """Forward + backward of every fixed-size right-padded micro batch."""
    n_loss = sum(sum(s["loss_mask"]) for s in sequences)
    computed = scores = 0
    for start in range(0, len(sequences), micro_batch_size):
        group = sequences[start : start + micro_batch_size]
        ids, loss_mask = right_padded(group, "input_ids"), right_padded(group, "loss_mask")
        real = right_padded(group, "real") if masked else None
        logprobs = token_logprobs(model, ids, 1.0, attention_mask=real)  # (B, W - 1)
        (-(logprobs * loss_mask[:, 1:]).sum() / n_loss).backward()
        computed += ids.numel()
        scores += ids.shape[0] * ids.shape[1] ** 2
    return computed, scores


def packed_step(model, sequences: list[dict], max_tokens: int) -> Work:
    """Forward + backward of every packed micro batch."""
    batches = pack(sequences, max_tokens)
    n_loss = sum(batch.n_loss_tokens for batch in batches)
    for batch in batches:
        logprobs = packed_logprobs(model, batch, 1.0)  # (1, T)
        (-(logprobs * batch.loss_mask).sum() / n_loss).backward()
    return sum(b.n_tokens for b in batches), sum(b.n_tokens**2 for b in batches)


def main(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    model = load_model("smollm2")
    model.train()
    lengths = length_mix(args.sequences, args.seed)
    sequences = make_sequences(lengths, model.config.vocab_size, args.seed)
    real = sum(p + c for p, c in lengths)
    longest = max(p + c for p, c in lengths)
    print(
        f"{len(sequences)} sequences, {real} real tokens, longest {longest}, "
        f"whole batch padded to the longest would be {real / (longest * len(lengths)):.0%} real",
        flush=True,
    )
    size = args.micro_batch_size
    sides: dict[str, Callable[[list[dict]], Work]] = {
        "padded + mask": lambda seqs: padded_step(model, seqs, size, masked=True),
        "padded, causal only": lambda seqs: padded_step(model, seqs, size, masked=False),
        "packed": lambda seqs: packed_step(model, seqs, args.max_tokens),
    }
    for step in sides.values():  # warm up every code path
        step(make_sequences([(16, 16)] * 2, 100, 0))
    best: dict[str, float] = {}
    for repeat in range(args.repeats):
        for name, step in sides.items():
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            computed, scores = step(sequences)
            seconds = time.perf_counter() - start
            best[name] = min(seconds, best.get(name, seconds))
            print(
                f"[{repeat}] {name:20s} {seconds:6.1f} s {real / seconds:6.1f} real tokens/s, "
                f"computed {computed} tokens ({real / computed:.0%} real), "
                f"attention entries {scores / 1e6:.1f} M per head",
                flush=True,
            )
    packed = real / best["packed"]
    print(
        f"\nbest of {args.repeats}: micro batches of {size} padded vs packed to {args.max_tokens}"
    )
    for name in sides:
        print(f"{name:20s} {real / best[name]:6.1f} real tokens/s")
    for name in ("padded + mask", "padded, causal only"):
        print(f"packed / {name}: {packed / (real / best[name]):.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    main(parser.parse_args())
