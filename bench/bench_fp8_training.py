"""Trainer throughput and model FLOPs utilisation, bf16 against FP8 (actor.fp8), in one process.

A randomly initialised Llama (``--config 1b``: hidden 2048, 22 layers, 32 heads, 4 KV heads, MLP
5632, vocabulary 32000, about 1.1B parameters, the TinyLlama shape; ``--config 8b-layers``: 8
layers of Llama-3-8B's shapes, 2.8B parameters, the shapes of torchao's published speed-ups) is
trained with the project's `Actor` (FSDP2 over one rank, bf16 mixed precision, AdamW) on random
tokens, once per mode: ``bf16``, then ``tensorwise`` and ``rowwise`` FP8. Each mode gets fresh
weights, ``--warmup`` untimed steps (compilation, allocator), then ``--steps`` timed ones of
``--batch`` sequences of ``--seq-len`` tokens. ``--compile`` compiles each decoder layer with
torch.compile, which torchao needs to fuse the float8 casts (without it FP8 is slower than bf16).

Reported per mode: tokens/s, and MFU = tokens/s x FLOPs per token / peak, with FLOPs per token
= 6 x (non-embedding parameters + LM head) + 12 x layers x hidden x seq-len (attention scores and
values, causal masking not discounted; the PaLM appendix B formula) and the peak of
``--peak-tflops`` (default: 989, the H100/H200 SXM dense bf16 peak). Ratios FP8/bf16 are printed at
the end. Targets (issue 18): MFU >= 40% in bf16, FP8 >= 1.3x bf16.

    python -m bench.bench_fp8_training --config 1b --compile          # on an H100 / H200
    python -m bench.bench_fp8_training --config tiny --emulate --steps 2 --warmup 1   # a CPU check

Needs torchao (``pip install 'agentrl[gpu]'``; on the CPU, run it with ``.venv-torchao/bin/python``).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.training.actor import Actor, ActorConfig, decoder_layers
from agentrl.training.distributed import distributed

CONFIGS = {
    "1b": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
    # Llama-3-8B's layer shapes (the matmuls FP8 speeds up), 8 of its 32 layers: 2.8B parameters,
    # about 45 GB of float32 weights, gradients and AdamW state (not yet run on a GPU)
    "8b-layers": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=8,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    ),
}


def build_model(name: str, seq_len: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        **CONFIGS[name], max_position_embeddings=seq_len, tie_word_embeddings=False
    )
    return LlamaForCausalLM(config)


def flops_per_token(model: LlamaForCausalLM, seq_len: int) -> float:
    config = model.config
    embedding = model.get_input_embeddings().weight.numel()
    dense = sum(p.numel() for p in model.parameters()) - embedding
    attention = 12 * config.num_hidden_layers * config.hidden_size * seq_len
    return 6.0 * dense + attention


def loss_fn(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, float, dict]:
    # no KV cache: a training forward needs none, and its per-layer state makes torch.compile
    # recompile each layer until its limit (8), leaving the rest eager (seen on an H200)
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()  # (B, T - 1, V)
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"
    )
    return loss, float(ids[:, 1:].numel()), {}


def run_mode(mode: str, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    if device.type == "cuda":  # each mode's own peak, not the largest of the modes so far
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model = build_model(args.config, args.seq_len)
    per_token = flops_per_token(model, args.seq_len)
    fp8 = {} if mode == "bf16" else {"fp8": mode, "fp8_emulate": args.emulate}
    if mode != "bf16" and args.config == "tiny":
        fp8["fp8_min_features"] = 16
    config = ActorConfig(lr=1e-5, mixed_precision="bf16", **fp8)
    actor = Actor(model, config)
    if args.compile:
        for layer in decoder_layers(actor.model):
            layer.compile()
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    batch = torch.randint(0, vocab, (args.batch, args.seq_len), generator=generator).to(device)
    for _ in range(args.warmup):
        actor.train_step([batch], loss_fn)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    losses = [actor.train_step([batch], loss_fn)["loss"] for _ in range(args.steps)]
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens_per_s = args.batch * args.seq_len * args.steps / seconds
    mfu = tokens_per_s * per_token / (args.peak_tflops * 1e12)
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    print(
        f"{mode:10s} {tokens_per_s:10.0f} tokens/s  MFU {100 * mfu:5.1f}%  "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f}  peak memory {memory:.1f} GiB",
        flush=True,
    )
    return {
        "tokens_per_s": tokens_per_s,
        "mfu": mfu,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "peak_memory_gib": memory,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="1b")
    parser.add_argument("--modes", nargs="+", default=["bf16", "tensorwise", "rowwise"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--emulate", action="store_true", help="torchao's FP8 emulation (CPU)")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--json", type=Path, help="write the numbers to this file")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    with distributed() as info:
        device = info.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"{args.config} Llama on {name}: batch {args.batch} x {args.seq_len} tokens")
        results = {}
        for mode in args.modes:
            results[mode] = run_mode(mode, args, device)
            if args.json:  # after every mode: a later one may not finish in time
                record = {"device": name, "config": args.config, "batch": args.batch}
                record |= {"seq_len": args.seq_len, "compile": args.compile, "modes": results}
                Path(args.json).write_text(json.dumps(record, indent=1))
    if "bf16" in results:
        base = results["bf16"]["tokens_per_s"]
        for mode, result in results.items():
            if mode != "bf16":
                print(f"{mode} / bf16 = {result['tokens_per_s'] / base:.2f}x  (target >= 1.3x)")


if __name__ == "__main__":
    main()
