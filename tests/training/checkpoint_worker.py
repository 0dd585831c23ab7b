"""Checkpoints across world sizes: save with N processes, load a checkpoint another world size saved.

Run under torchrun: ``python -m torch.distributed.run --standalone --nproc_per_node N
tests/training/checkpoint_worker.py --out DIR [--load CHECKPOINT]``. The N ranks train the tiny
Llama of `fsdp_worker` for ``STEPS`` steps on their shares of its global batch, save a checkpoint
to ``DIR/ckpts`` and export the model to ``DIR/hf`` (no tokenizer). Rank 0 writes
``DIR/saved.pt``: the full state right after the save (see `full_state`) and its RNG draws. With
``--load``, a fresh actor from another initialisation loads CHECKPOINT and rank 0 writes
``DIR/loaded.pt``: the full state, the returned ``extra``, RNG draws, and each rank's warnings.
"""

from __future__ import annotations

import argparse
import copy
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from fsdp_worker import actor_config, global_batch, nll_loss, tiny_llama
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from transformers import LlamaForCausalLM

from agentrl.training.actor import Actor
from agentrl.training.checkpoint import CheckpointManager, export_hf
from agentrl.training.distributed import distributed

STEPS = 2


def other_llama(seed: int = 1) -> LlamaForCausalLM:
    """The tiny Llama's architecture with different initial weights."""
    config = tiny_llama().config
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def full_state(actor: Actor) -> dict[str, Any]:
    """Collective: full weights, full optimizer state, step and lr on rank 0 (``{}`` elsewhere).

    Copies: in a one-process job the gathered tensors may share storage with the model.
    """
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    params, optim = get_state_dict(actor.model, actor.optimizer, options=options)
    if dist.get_rank() != 0:
        return {}
    return copy.deepcopy({"params": params, "optim": optim, "step": actor.step, "lr": actor.lr})


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_draws() -> list[float]:
    """One draw from each generator a checkpoint restores (advances them)."""
    return [random.random(), float(np.random.rand()), *torch.rand(2).tolist()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--load", type=Path)
    args = parser.parse_args()

    with distributed() as info:
        actor = Actor(tiny_llama(), actor_config("tiny"), dist_info=info)
        seed_everything(100 + info.rank)  # the ranks' RNG states differ, as in a real job
        mine = global_batch(actor.model.config.vocab_size)[info.rank :: info.world_size]
        for _ in range(STEPS):
            actor.train_step(mine, nll_loss)
        CheckpointManager(args.out / "ckpts").save(actor, {"world_size": info.world_size})
        saved = {**full_state(actor), "rng": rng_draws()}
        export_hf(actor, None, args.out / "hf")
        if info.is_main:
            torch.save(saved, args.out / "saved.pt")

        if args.load:
            fresh = Actor(other_llama(), actor_config("tiny"), dist_info=info)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                extra = CheckpointManager(args.load.parent).load(args.load, fresh)
            loaded = {**full_state(fresh), "extra": extra, "rng": rng_draws()}
            messages: list[list[str]] = [[] for _ in range(info.world_size)]
            dist.all_gather_object(messages, [str(w.message) for w in caught])
            if info.is_main:
                torch.save({**loaded, "warnings": messages}, args.out / "loaded.pt")


if __name__ == "__main__":
    main()
