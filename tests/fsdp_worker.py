"""One FSDP2 training run on a fixed global batch, for comparing 1 process with 2 (and test helpers).

Run under torchrun: ``python -m torch.distributed.run --standalone --nproc_per_node N
tests/fsdp_worker.py --out DIR``. Each of the N ranks takes every N-th sequence of the same
global batch (one sequence per micro-batch) and trains ``--steps`` steps. Then every rank takes
part in `sync_weights` into a `LocalEngine` that rank 0 holds (built from the untrained weights),
and in a step where rank 1 has one micro-batch fewer (which must raise on every rank). Rank 0
writes to DIR: ``result.json`` (each step's metrics, the sync report, every rank's error from the
unequal step), ``params.pt`` (the full weights from `iter_full_state_dict_buckets`) and
``logprobs.pt`` (log-probs of a probe under the trained FSDP model, and under the engine's model)
and, with ``--export``, `export_hf`'s directories of the trained weights (``hf/`` and ``hf-fp8/``), and
a checkpoint round trip: save, one more step, load, the same step again (``result.json``'s
``resumed``: both steps' metrics; ``restored.pt``: the weights loaded back at the end).
Sequences score different numbers of tokens, so the ranks' token counts differ: only a loss
normalised by the global token count gives the same update for every N.

The tests import the model, batch, loss and config from here, so the in-process reference and
this script train the same model on the same data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypedDict

import torch
import torch.distributed as dist
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from agentrl.engine_pool.local_engine import LocalEngine
from agentrl.models import load_model
from agentrl.rl.weight_sync import sync_weights
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.checkpoint import CheckpointManager, export_hf
from agentrl.training.distributed import DistInfo, distributed
from agentrl.training.fp8_training import FP8Recipe
from agentrl.training.full_state import iter_full_state_dict_buckets
from agentrl.training.logprobs import token_logprobs

SEQ_LEN = 12


class MicroBatch(TypedDict):
    input_ids: torch.Tensor  # (1, T) int64
    mask: torch.Tensor  # (1, T - 1) float32: 1 where the next token is scored
    weight: float  # per-sequence weight (an advantage, in RL terms)


def tiny_llama() -> LlamaForCausalLM:
    """A 2-layer Llama with tied embeddings, identical in every process (seeded init)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def global_batch(vocab_size: int, sequences: int = 4) -> list[MicroBatch]:
    """``sequences`` fixed random sequences; sequence i scores ``SEQ_LEN - 1 - 2 * i`` tokens."""
    generator = torch.Generator().manual_seed(1234)
    batch = []
    for i in range(sequences):
        ids = torch.randint(0, vocab_size, (1, SEQ_LEN), generator=generator)
        mask = torch.zeros(1, SEQ_LEN - 1)
        mask[0, 2 * i :] = 1.0
        batch.append(MicroBatch(input_ids=ids, mask=mask, weight=1.0 + 0.25 * i))
    return batch


def nll_loss(
    model: nn.Module, micro_batch: MicroBatch
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted negative log-likelihood summed over scored tokens; the denominator is their count."""
    logprobs = token_logprobs(model, micro_batch["input_ids"], 1.0)  # (1, T - 1)
    mask = micro_batch["mask"]
    loss_sum = -(logprobs * mask).sum() * micro_batch["weight"]
    return loss_sum, mask.sum(), {"logprob": (logprobs.detach() * mask).sum()}


def probe_logprobs(model: nn.Module, vocab_size: int) -> torch.Tensor:
    """Log-probs ``(1, 15)`` of a fixed probe sequence (every rank must call it: FSDP forward)."""
    probe = torch.arange(16).remainder(vocab_size).unsqueeze(0)
    with torch.no_grad():
        return token_logprobs(model, probe, 1.0)


@contextmanager
def one_process_group() -> Iterator[DistInfo]:
    """The in-process reference: a one-process group, one intra-op thread as under torchrun.

    One thread also because OpenMP synchronisation dominates the tiny model's matmuls, badly so
    on a busy machine; the previous thread count is restored afterwards.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with distributed() as info:
            yield info
    finally:
        torch.set_num_threads(threads)


def load(model: str) -> PreTrainedModel:
    """``"tiny"`` (see `tiny_llama`) or a model reference such as ``"smollm2"``, in float32."""
    return tiny_llama() if model == "tiny" else load_model(model)


def actor_config(
    model: str, activation_checkpointing: bool = False, fp8: FP8Recipe = "off"
) -> ActorConfig:
    """The run's config; ``fp8`` other than off emulates FP8 on every linear layer but the head."""
    fp8_options = {"fp8": fp8, "fp8_emulate": True, "fp8_min_features": 16} if fp8 != "off" else {}
    return ActorConfig(
        lr=1e-2 if model == "tiny" else 1e-4,
        warmup_steps=2,
        max_grad_norm=1.0,
        activation_checkpointing=activation_checkpointing,
        **fp8_options,
    )


def unequal_step_error(actor: Actor, info: DistInfo) -> list[str]:
    """Every rank's error from a step where rank 1 has one micro-batch fewer (all-gathered)."""
    batch = global_batch(actor.model.config.vocab_size)[: 2 - min(info.rank, 1)]
    try:
        actor.train_step(batch, nll_loss)
        error = ""
    except ValueError as exc:
        error = str(exc)
    errors: list[str] = [""] * info.world_size
    dist.all_gather_object(errors, error)
    return errors


async def sync_into_engine(actor: Actor, args: argparse.Namespace, info: DistInfo) -> dict:
    """`sync_weights` on every rank into rank 0's engine; rank 0 returns the engine's log-probs."""
    engines = [LocalEngine(load(args.model), eos_token_ids=[0])] if info.is_main else []
    for engine in engines:
        await engine.start()
    try:
        report = await sync_weights(actor.model, engines, version=7, bucket_bytes=4096)
        if not engines:
            return {}
        logprobs = probe_logprobs(engines[0].model, actor.model.config.vocab_size)
        return {"report": report.__dict__, "version": engines[0].weight_version, "lp": logprobs}
    finally:
        for engine in engines:
            await engine.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="tiny", help="'tiny' or a model reference (smollm2)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--fp8", default="off", choices=["off", "tensorwise", "rowwise"])
    parser.add_argument("--export", action="store_true", help="export_hf to DIR/hf and DIR/hf-fp8")
    args = parser.parse_args()

    with distributed() as info:
        model = load(args.model)
        vocab = model.config.vocab_size
        actor = Actor(model, actor_config(args.model, fp8=args.fp8), dist_info=info)
        mine = global_batch(vocab)[info.rank :: info.world_size]
        metrics = [actor.train_step(mine, nll_loss) for _ in range(args.steps)]
        params = {n: t.clone() for b in iter_full_state_dict_buckets(actor.model) for n, t in b}
        if args.export:
            export_hf(actor, None, args.out / "hf")
            export_hf(actor, None, args.out / "hf-fp8", fp8=True)
            checkpoints = CheckpointManager(args.out / "checkpoints")
            saved = checkpoints.save(actor, {})
            moved = actor.train_step(mine, nll_loss)  # the weights move on, then come back
            checkpoints.load(saved, actor)
            again = actor.train_step(mine, nll_loss)  # the same step from the loaded state
            checkpoints.load(saved, actor)
            buckets = iter_full_state_dict_buckets(actor.model)
            restored = {n: t.clone() for bucket in buckets for n, t in bucket}
        logprobs = probe_logprobs(actor.model, vocab)
        synced = asyncio.run(sync_into_engine(actor, args, info))
        errors = unequal_step_error(actor, info)
        odd = [{"input_ids": [1] * n, "loss_mask": [0] + [1] * (n - 1)} for n in (5, 13, 30)]
        tokens = [batch.n_tokens for batch in actor.micro_batches(odd, 32)]
        if info.is_main:
            args.out.mkdir(parents=True, exist_ok=True)
            result = {"metrics": metrics, "sync": synced["report"], "errors": errors}
            result["engine_version"] = synced["version"]
            result["micro_batch_tokens"] = tokens
            result["fp8_layers"] = [
                n for n, m in actor.model.named_modules() if type(m).__name__ == "Float8Linear"
            ]
            if args.export:
                result["resumed"] = {"moved": moved, "again": again}
                torch.save(restored, args.out / "restored.pt")
            (args.out / "result.json").write_text(json.dumps(result, indent=1))
            torch.save(params, args.out / "params.pt")
            torch.save({"actor": logprobs, "engine": synced["lp"]}, args.out / "logprobs.pt")


if __name__ == "__main__":
    main()
