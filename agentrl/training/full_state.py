"""The full (unsharded) weights of an FSDP2 model, gathered in buckets under the Hugging Face names.

:func:`iter_full_state_dict_buckets` walks the model's parameters and all-gathers each sharded
``DTensor`` into a full tensor, grouping them into buckets of about ``bucket_bytes``. Every rank
must iterate it to the end (each gather is a collective); only rank 0 keeps the tensors, the other
ranks get empty buckets, one per rank-0 bucket. Names are the unwrapped Hugging Face model's
(``model.layers.0.mlp.up_proj.weight``, see :func:`engine_parameter_name`), which is what engines
and checkpoint exports load by. It reshards every FSDP module first, so values come from the
float32 shards even when a no-grad forward left the root's bfloat16 copy gathered. Weight sync
(:mod:`agentrl.rl.weight_sync`) sends these buckets to engines.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from agentrl.training.fp8_training import plain_tensor

DEFAULT_BUCKET_BYTES = 256 * 2**20
WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
Bucket = list[tuple[str, torch.Tensor]]


def engine_parameter_name(name: str) -> str:
    """``name`` without wrapper segments (activation checkpointing, ``torch.compile``, FSDP1)."""
    for segment in WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def iter_full_state_dict_buckets(
    model: nn.Module,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    dtype: torch.dtype | None = None,
) -> Iterator[Bucket]:
    """Yield ``[(name, full_tensor), ...]`` buckets of about ``bucket_bytes`` (see the module docstring).

    A bucket closes before the parameter that would take it past ``bucket_bytes``, so a parameter
    larger than that travels alone. All ranks must consume the iterator completely.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    keep = not dist.is_initialized() or dist.get_rank() == 0
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()  # gather from the float32 shards, not from a low-precision unshard
    bucket: Bucket = []
    count = size = 0
    for name, param in model.named_parameters():
        nbytes = param.numel() * (dtype or param.dtype).itemsize
        if count and size + nbytes > bucket_bytes:
            yield bucket
            bucket, count, size = [], 0, 0
        with torch.no_grad():
            full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
            if keep:
                bucket.append(
                    (engine_parameter_name(name), plain_tensor(full, dtype or full.dtype))
                )
        count, size = count + 1, size + nbytes
    if count:
        yield bucket
