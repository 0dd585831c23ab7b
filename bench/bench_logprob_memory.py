"""Peak memory and time of the log-prob + entropy computation: all logits at once vs in chunks.

One forward + backward of what the trainer computes from the final hidden states of ``T`` scored
tokens: the LM head ``(V, H)``, ``log_softmax(logits / T)`` at the targets (differentiable; the
loss is their sum) and the entropy of ``softmax(logits / T)`` (logged, no gradient), against
sequence length and vocabulary size:

1. **unchunked** (``actor.logprob_chunk_tokens=0``): ``temperature_logprobs(head(h), y, T)`` and
   ``entropy_from_logits`` on the ``(T, V)`` logits, as the trainer computed them before;
2. **chunked** (``actor.logprob_chunk_tokens=C``): :func:`chunked_token_scores`, ``C`` tokens at
   a time, the logits recomputed in the backward.

Each (side, T, V) runs in a fresh subprocess on the CPU, whose peak RSS
(:func:`agentrl.training.memory.peak_rss_bytes`) minus its RSS after building the inputs (hidden states, head, targets) is the computation's peak; the
head's weight gradient ``(V, H)`` float32 is part of it on both sides. With CUDA the same runs in
this process with ``torch.cuda.max_memory_allocated``. Printed beside them: the analytic size of
one ``(T x V)`` float32 copy, the ratio of the two peaks and of the two times (one warm-up, then
the fastest of ``--repeats``). Unchunked runs whose logits alone (4 float32 copies) would exceed
``--max-gb`` are skipped and say so.

    python -m bench.bench_logprob_memory [--tokens 1024,2048,4096,8192,16384]
        [--vocab 49152,151936] [--hidden 576] [--chunk 1024] [--repeats 2] [--max-gb 16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
from torch import nn

from agentrl.algorithms.losses import entropy_from_logits
from agentrl.engine_pool.sampling import temperature_logprobs
from agentrl.models import cpu_name
from agentrl.training.chunked_logprobs import chunked_token_scores
from agentrl.training.memory import peak_rss_bytes

TEMPERATURE = 0.7
GB = 1024**3


def inputs(tokens: int, vocab: int, hidden: int) -> tuple[torch.Tensor, nn.Linear, torch.Tensor]:
    torch.manual_seed(0)
    head = nn.Linear(hidden, vocab, bias=False)
    states = torch.randn(tokens, hidden, requires_grad=True)  # (T, H)
    return states, head, torch.randint(0, vocab, (tokens,))


def step(
    side: str, states: torch.Tensor, head: nn.Linear, targets: torch.Tensor, chunk: int
) -> None:
    """One forward + backward of the side's log-probs (and logged entropy)."""
    states.grad = head.weight.grad = None
    if side == "chunked":
        scores = chunked_token_scores(states, head, targets, TEMPERATURE, chunk, entropy=True)
        logprobs = scores.logprobs
    else:
        logits = head(states)  # (T, V)
        logprobs = temperature_logprobs(logits, targets, TEMPERATURE)
        with torch.no_grad():
            entropy_from_logits(logits.detach()[None], temperature=TEMPERATURE)
    logprobs.sum().backward()


def child(args: argparse.Namespace) -> None:
    """One configuration in this fresh process: peak RSS above the inputs, best time."""
    torch.set_num_threads(args.threads or torch.get_num_threads())
    states, head, targets = inputs(args.t, args.v, args.hidden)
    base = peak_rss_bytes()
    times = []
    for _ in range(args.repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        step(args.side, states, head, targets, args.chunk)
        times.append(time.perf_counter() - start)
    peak = peak_rss_bytes() - base
    print(json.dumps({"peak": peak, "seconds": min(times[1:])}))


def measure(side: str, tokens: int, vocab: int, args: argparse.Namespace) -> dict | None:
    if torch.cuda.is_available():
        return measure_cuda(side, tokens, vocab, args)
    command = [
        sys.executable, "-m", "bench.bench_logprob_memory", "--child", "--side", side,
        "--t", str(tokens), "--v", str(vocab), "--hidden", str(args.hidden),
        "--chunk", str(args.chunk), "--repeats", str(args.repeats),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        print(f"  {side} T={tokens} V={vocab} failed: {done.stderr.strip()[-300:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_cuda(side: str, tokens: int, vocab: int, args: argparse.Namespace) -> dict:
    states, head, targets = inputs(tokens, vocab, args.hidden)
    states, head, targets = states.detach().cuda().requires_grad_(), head.cuda(), targets.cuda()
    times = []
    for _ in range(args.repeats + 1):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        step(side, states, head, targets, args.chunk)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {"peak": torch.cuda.max_memory_allocated() - base, "seconds": min(times[1:])}


def main(args: argparse.Namespace) -> None:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name()
    where = "CUDA max_memory_allocated" if torch.cuda.is_available() else "peak RSS, CPU"
    print(
        f"{device}, {torch.get_num_threads()} threads; hidden {args.hidden}, chunk {args.chunk}, "
        f"T = {TEMPERATURE}; memory: {where} above the inputs"
    )
    print(
        f"{'V':>7} {'tokens':>6} {'T x V f32':>10} {'unchunked':>10} {'chunked':>9} "
        f"{'mem ratio':>9} {'t unch. s':>9} {'t chunk s':>9} {'t ratio':>7}"
    )
    for vocab in args.vocab:
        for tokens in args.tokens:
            copy_gb = tokens * vocab * 4 / GB
            plain = None
            if 4 * copy_gb <= args.max_gb:
                plain = measure("unchunked", tokens, vocab, args)
            chunked = measure("chunked", tokens, vocab, args)
            if chunked is None:
                continue
            if plain is None:
                cells = f"{'skipped':>10} {chunked['peak'] / GB:8.2f}G {'':>9} {'':>9} "
                cells += f"{chunked['seconds']:9.2f} {'':>7}"
            else:
                cells = (
                    f"{plain['peak'] / GB:9.2f}G {chunked['peak'] / GB:8.2f}G "
                    f"{plain['peak'] / max(chunked['peak'], 1):8.1f}x "
                    f"{plain['seconds']:9.2f} {chunked['seconds']:9.2f} "
                    f"{chunked['seconds'] / plain['seconds']:7.2f}"
                )
            print(f"{vocab:7d} {tokens:6d} {copy_gb:9.2f}G {cells}", flush=True)


def integers(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=integers, default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--vocab", type=integers, default=[49152, 151936])
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-gb", type=float, default=16.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--t", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--v", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    child(parsed) if parsed.child else main(parsed)
