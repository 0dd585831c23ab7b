"""Peak memory and time of one SmolLM2 training step against sequence length: all logits at once,
in chunks, and in chunks over two sequence-parallel ranks, beside the analytic bound.

One :meth:`~agentrl.training.actor.Actor.train_step` (SFT's token-mean NLL, every token but the
first a loss token) on one random sequence of ``T`` tokens, after one warm-up step on the same
sequence (AdamW's state exists from then on; the peak covers both), each configuration a fresh
``torchrun`` job:

1. **unchunked**: one rank, ``actor.logprob_chunk_tokens=0`` (the ``(T, V)`` logits at once);
2. **chunked**: one rank, ``actor.logprob_chunk_tokens=1024``;
3. **chunked + SP 2**: two ranks, ``actor.sequence_parallel=2`` (each runs the model on ``T / 2``
   tokens, FSDP2 shards the weights and optimizer state over both).

Two more (``--variants packed-sdpa,packed``) put 16 sequences of ``T / 16`` tokens in the one
micro-batch, as an RL batch is packed, where attention needs a ``T x T`` mask: **packed-sdpa** runs
transformers' ``"sdpa"`` as the trainer did before :mod:`agentrl.training.attention` (the
:class:`Actor`'s switch to it turned off: the baseline), **packed** the trainer's attention, which
keeps one float copy of the mask for the backward instead of one per layer.

``--checkpointing`` turns ``actor.activation_checkpointing`` on for all three.

Memory is each rank's peak RSS (:func:`agentrl.training.memory.peak_rss_bytes`), the largest
over ranks, and its part above the RSS after the model was loaded and sharded (``step``). The analytic bound beside it, float32 (4
bytes a number), per rank of ``P``:

* state: weights, gradients and AdamW's two moments, ``16 N / P`` bytes (FSDP2 shards), plus one
  gathered decoder layer and the root's parameters while they compute;
* activations kept for the backward, per token and layer: the two norms' inputs and outputs
  (``4 h``), the query, key and value (``h + 2 kv``), the attention output and the output
  projection's input (``2 h``), the MLP's gate, up, activation and product (``4 i``): ``(6 h + 2 kv
  + 4 i)`` numbers, times ``L T / P``; with checkpointing each layer keeps its input only (``h``)
  and one layer's activations exist at a time;
* logits: five ``(T / P) x V`` float32 copies unchunked (logits, scaled copy, log-softmax, the
  entropy's, the gradient), three ``chunk x V`` chunked;
* the attention mask with sequence parallelism or packing, ``(T / P) x T`` booleans and one float
  copy (5 bytes an entry; transformers' sdpa keeps a float copy per layer, not counted).

The bound leaves out the allocator's slack, the Python runtime and libraries (the ``base`` RSS
column shows them) and temporaries of a single op.

    python -m bench.bench_training_memory [--tokens 1024,2048,4096,8192] [--layers 30]
        [--checkpointing] [--variants unchunked,chunked,sp2 | packed-sdpa,packed]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import agentrl.training.actor as actor_module
from agentrl.models import cpu_name, load_model
from agentrl.sft.trainer import nll_loss
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.distributed import distributed
from agentrl.training.memory import peak_rss_bytes

GB = 1024**3
CHUNK = 1024
VARIANTS = {
    "unchunked": {"ranks": 1, "chunk": 0, "sequence_parallel": 1},
    "chunked": {"ranks": 1, "chunk": CHUNK, "sequence_parallel": 1},
    "sp2": {"ranks": 2, "chunk": CHUNK, "sequence_parallel": 2},
    "packed-sdpa": {"ranks": 1, "chunk": CHUNK, "sequence_parallel": 1, "packed": True},
    "packed": {"ranks": 1, "chunk": CHUNK, "sequence_parallel": 1, "packed": True},
}
NAMES = {
    "unchunked": "unchunked",
    "chunked": "chunked",
    "sp2": "chunked + SP 2",
    "packed-sdpa": "16 packed, sdpa",
    "packed": "16 packed",
}
PACKED = 16


def analytic_gb(config, params: int, tokens: int, variant: str, checkpointing: bool) -> float:
    """The bound of the module docstring, in GB per rank."""
    spec = VARIANTS[variant]
    ranks, local = spec["ranks"], tokens // spec["ranks"]
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = h // config.num_attention_heads * config.num_key_value_heads
    per_layer = 6 * h + 2 * kv + 4 * i
    layer_params = params // max(layers, 1)
    root_params = config.vocab_size * h
    state = 16 * params / ranks + 4 * (layer_params + root_params)
    if checkpointing:
        activations = 4 * local * (layers * h + per_layer)
    else:
        activations = 4 * local * layers * per_layer
    logits = 4 * config.vocab_size * (5 * local if spec["chunk"] == 0 else 3 * CHUNK)
    mask = local * tokens * 5 if spec["sequence_parallel"] > 1 or spec.get("packed") else 0
    return (state + activations + logits + mask) / GB


def child(args: argparse.Namespace) -> None:
    """One configuration, as one rank of a torchrun job; rank 0 prints the JSON result."""
    spec = VARIANTS[args.variant]
    if args.variant == "packed-sdpa":  # the baseline: the model keeps transformers' sdpa
        actor_module.use_trainer_attention = lambda model: model
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // spec["ranks"]))
    with distributed() as info:
        model = load_model(args.model, dtype="float32")
        if args.layers < model.config.num_hidden_layers:
            model.model.layers = model.model.layers[: args.layers]
            model.config.num_hidden_layers = args.layers
        model.set_attn_implementation("sdpa")
        config = model.config
        params = sum(p.numel() for p in model.parameters())
        actor_config = ActorConfig(
            lr=1e-6,
            logprob_chunk_tokens=spec["chunk"],
            sequence_parallel=spec["sequence_parallel"],
            activation_checkpointing=args.checkpointing,
        )
        actor = Actor(model, actor_config, dist_info=info)
        generator = torch.Generator().manual_seed(0)
        count = PACKED if spec.get("packed") else 1
        rows = []
        for _ in range(count):
            ids = torch.randint(0, config.vocab_size, (args.t // count,), generator=generator)
            mask = torch.ones(args.t // count, dtype=torch.bool)
            mask[0] = False
            rows.append({"input_ids": ids, "loss_mask": mask})
        micro_batches = actor.micro_batches(rows, args.t)
        chunk = spec["chunk"]
        base = peak_rss_bytes()
        seconds = []
        for _ in range(2):  # a warm-up (AdamW's state appears), then the measured step
            start = time.perf_counter()
            actor.train_step(micro_batches, lambda m, b: nll_loss(m, b, chunk_tokens=chunk))
            seconds.append(time.perf_counter() - start)
        peaks = torch.tensor([peak_rss_bytes(), peak_rss_bytes() - base, base], dtype=torch.float64)
        if info.world_size > 1:
            dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
        if info.is_main:
            result = {
                "peak_gb": float(peaks[0]) / GB,
                "step_gb": float(peaks[1]) / GB,
                "base_gb": float(peaks[2]) / GB,
                "seconds": seconds[-1],
                "analytic_gb": analytic_gb(
                    config, params, args.t, args.variant, args.checkpointing
                ),
            }
            Path(args.out).write_text(json.dumps(result))


def measure(variant: str, tokens: int, args: argparse.Namespace) -> dict | None:
    spec = VARIANTS[variant]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={spec['ranks']}", "-m", "bench.bench_training_memory", "--child",
            "--variant", variant, "--t", str(tokens), "--layers", str(args.layers),
            "--model", args.model, "--out", str(out),
        ]  # fmt: skip
        if args.checkpointing:
            command.append("--checkpointing")
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode or not out.exists():
            print(f"  {variant} T={tokens} failed: {done.stderr.strip()[-500:]}", flush=True)
            return None
        return json.loads(out.read_text())


def main(args: argparse.Namespace) -> None:
    print(
        f"{cpu_name()}, {os.cpu_count()} cores; {args.model}, {args.layers} layers, chunk {CHUNK}, "
        f"activation checkpointing {'on' if args.checkpointing else 'off'}; memory per rank "
        "(peak RSS, the largest over ranks; step: above the RSS before the steps)"
    )
    print(
        f"{'variant':>15} {'tokens':>6} {'peak':>7} {'base':>6} {'step':>6} {'analytic':>8} "
        f"{'step s':>7}"
    )
    for tokens in args.tokens:
        for variant in args.variants:
            result = measure(variant, tokens, args)
            if result is None:
                continue
            print(
                f"{NAMES[variant]:>15} {tokens:6d} {result['peak_gb']:6.2f}G "
                f"{result['base_gb']:5.2f}G {result['step_gb']:5.2f}G "
                f"{result['analytic_gb']:7.2f}G {result['seconds']:7.1f}",
                flush=True,
            )


def words(text: str) -> list[str]:
    unknown = set(text.split(",")) - set(VARIANTS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variants {sorted(unknown)}; {list(VARIANTS)}")
    return text.split(",")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=lambda t: [int(x) for x in t.split(",")])
    parser.add_argument("--variants", type=words, default=["unchunked", "chunked", "sp2"])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--t", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.tokens is None:
        parsed.tokens = [1024, 2048, 4096, 8192]
    child(parsed) if parsed.child else main(parsed)
