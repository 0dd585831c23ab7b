"""Chunked-scan GAE vs the plain backward loop over time, at 1k, 16k and 64k tokens per trajectory.

A batch of ``--batch`` multi-turn trajectories of ``T`` tokens each: runs of loss tokens (the
policy's turns) separated by mask-0 runs (tool results), a reward on each turn's last token, random
values. Three implementations compute the same advantages and returns:

* **python loop**: `agentrl.algorithms.gae.gae_reference` on each row, in Python floats (tensor to list
  and back included);
* **torch loop**: the backward loop over time on the ``(B, T)`` tensors, the form verl and
  OpenRLHF use (a handful of small tensor ops per token position), here also skipping mask-0
  positions;
* **agentrl**: `agentrl.algorithms.gae.gae`, the chunked parallel scan (``--chunk``).

Prints the time of each (best of ``--repeats``), the ratios of the loops to agentrl (target
>= 100x at 16k) and the largest difference from the float64 python loop.

    python -m bench.bench_gae [--batch 8] [--repeats 3] [--chunk 128] [--device cpu|cuda] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from agentrl.algorithms.gae import gae, gae_reference

GAMMA, LAM = 1.0, 0.95


def batch(b: int, t: int, device: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Rewards, values ``(B, T)`` float32 and a multi-turn mask ``(B, T)`` bool."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(b, t, dtype=torch.bool)
    rewards = torch.zeros(b, t)
    for row in range(b):
        pos = int(torch.randint(16, 64, (1,), generator=g))  # the prompt
        while pos < t:
            turn = int(torch.randint(32, 256, (1,), generator=g))
            end = min(pos + turn, t)
            mask[row, pos:end] = True
            rewards[row, end - 1] = float(torch.rand((), generator=g))
            pos = end + int(torch.randint(16, 128, (1,), generator=g))  # a tool result
    values = torch.randn(b, t, generator=g)
    return rewards.to(device), values.to(device), mask.to(device)


def python_loop(rewards, values, mask):
    out = [
        gae_reference(r, v, gamma=GAMMA, lam=LAM, mask=m)
        for r, v, m in zip(rewards.tolist(), values.tolist(), mask.int().tolist(), strict=True)
    ]
    advantages = torch.tensor([a for a, _ in out], dtype=torch.float64)
    returns = torch.tensor([r for _, r in out], dtype=torch.float64)
    return advantages, returns


def torch_loop(rewards, values, mask):
    m = mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + GAMMA * next_value - values[:, t]
        candidate = delta + GAMMA * LAM * last_gae
        last_gae = m[:, t] * candidate + (1 - m[:, t]) * last_gae
        next_value = m[:, t] * values[:, t] + (1 - m[:, t]) * next_value
        advantages[:, t] = last_gae * m[:, t]
    return advantages, (advantages + values) * m


def timed(repeats: int, fn: Callable, *args) -> tuple[float, tuple[torch.Tensor, torch.Tensor]]:
    times, result = [], None
    for _ in range(repeats):
        if args[0].is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn(*args)
        if args[0].is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 16384, 65536])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; 0 keeps torch's default (the loops are serial either way; on "
        "a shared machine, multi-threaded kernels mostly measure the neighbours' load)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    def ours(r, v, m):
        return gae(r, v, m, gamma=GAMMA, lam=LAM, chunk=args.chunk)

    print(
        f"batch {args.batch}; gamma {GAMMA}, lam {LAM}; chunk {args.chunk}; device {args.device}; "
        f"torch threads {torch.get_num_threads()}; best of {args.repeats}"
    )
    print(
        f"{'T':>6} {'python ms':>10} {'torch loop ms':>14} {'agentrl ms':>11} "
        f"{'vs python':>10} {'vs torch loop':>14} {'max |diff|':>11}"
    )
    for length in args.lengths:
        rewards, values, mask = batch(args.batch, length, args.device)
        ours(rewards, values, mask)  # warm-up: discount matrices, kernels
        ours_s, (adv, ret) = timed(args.repeats, ours, rewards, values, mask)
        loop_s, (loop_adv, _) = timed(args.repeats, torch_loop, rewards, values, mask)
        py_s, (ref_adv, ref_ret) = timed(1, python_loop, rewards.cpu(), values.cpu(), mask.cpu())
        diff = max(
            (adv.cpu().double() - ref_adv).abs().max().item(),
            (ret.cpu().double() - ref_ret).abs().max().item(),
            (loop_adv.cpu().double() - ref_adv).abs().max().item(),
        )
        print(
            f"{length:>6} {py_s * 1e3:>10.1f} {loop_s * 1e3:>14.1f} {ours_s * 1e3:>11.2f} "
            f"{py_s / ours_s:>9.0f}x {loop_s / ours_s:>13.0f}x {diff:>11.1e}"
        )


if __name__ == "__main__":
    main()
