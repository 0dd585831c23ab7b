"""Weight sync: gather the FSDP2 actor's full weights in buckets and load them into engines.

Two layers, so that every transport shares the gathering:

* :func:`~agentrl.training.full_state.iter_full_state_dict_buckets` (training base) gathers the
  full weights in buckets of about ``bucket_bytes`` under the Hugging Face names engines load by;
  every rank takes part in each gather, only rank 0 keeps the tensors.
* :func:`sync_weights` pauses the engines, pushes each bucket with ``Engine.update_weights(bucket,
  version)``, checks that every engine reports ``version``, and resumes them. This is the tensor
  path, and the call pattern an engine pool uses for every engine: an SGLang client can implement
  ``update_weights`` with ``/update_weights_from_tensor`` per bucket; a disk transport writes the
  same buckets to files for ``/update_weights_from_disk``; a distributed transport broadcasts each
  bucket from rank 0 for ``/update_weights_from_distributed`` (names, dtypes and shapes per bucket).

What is sent: every parameter once, in its master dtype unless ``dtype`` is given (engines convert
on load anyway; casting first halves the bytes for bfloat16 engines). With ``fp8_names`` the
parameters named there go as blockwise-FP8 ``weight`` plus ``weight_scale_inv`` pairs in one
bucket (`agentrl.fp8_weights`, SGLang's FP8 checkpoint layout), quantised on rank 0 after the
gather, from the float32 master weights. Tied parameters go under the
first name ``named_parameters`` yields (``model.embed_tokens.weight`` for SmolLM2; engines that tie
weights accept either name). Buffers are not sent: training does not change them. Tensors may
share storage with the model in a one-process job; consumers copy them before the model changes.

Failure handling: an engine whose pause or update raises is left paused (it may hold half-updated
weights) and no longer receives buckets, while rank 0 keeps taking part in the gathers so that
the other ranks do not hang; the healthy engines are updated and resumed, then
:class:`WeightSyncError` names the failed ones. If a gather itself fails (a broken process group),
the error propagates and every engine stays paused. No other collective may run while a sync is in
progress (the training loop awaits it), and a sync must not be cancelled midway: rank 0's share of
the gathers would be missing and the other ranks would wait. Gathers run in a worker thread, so
the event loop stays free meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from agentrl.engine_pool.engine import Engine
from agentrl.fp8_weights import quantize_named_tensors
from agentrl.training.full_state import (
    DEFAULT_BUCKET_BYTES,
    Bucket,
    engine_parameter_name,
    iter_full_state_dict_buckets,
)


class WeightSyncError(RuntimeError):
    """Some engines did not receive the new weights; they are left paused."""


@dataclass(frozen=True)
class SyncReport:
    """What one :func:`sync_weights` call did; ranks other than 0 report 0 tensors, bytes, engines."""

    version: int
    """The weight version every engine now reports."""
    tensors: int
    """Tensors sent to each engine."""
    bytes: int
    """Bytes sent to each engine."""
    buckets: int
    """``update_weights`` calls per engine."""
    engines: int
    """Engines updated."""
    seconds: float
    """Wall time from pausing the engines to resuming them."""


async def sync_weights(
    model: nn.Module,
    engines: Sequence[Engine],
    version: int,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    dtype: torch.dtype | None = None,
    fp8_names: frozenset[str] | None = None,
) -> SyncReport:
    """Load ``model``'s current weights into ``engines`` as ``version``; call it on every rank.

    Rank 0 pauses the engines, pushes every bucket of :func:`iter_full_state_dict_buckets`,
    checks ``engine.weight_version == version`` and resumes them; other ranks only take part in
    the gathers (their ``engines`` are ignored, pass ``[]``). Raises :class:`WeightSyncError`
    after the last gather if any engine failed (see the module docstring).
    """
    start = time.perf_counter()
    is_main = not dist.is_initialized() or dist.get_rank() == 0
    healthy = list(engines) if is_main else []
    failures: dict[int, BaseException] = {}

    async def on_all(call: str, *args: object) -> None:
        results = await asyncio.gather(
            *(getattr(e, call)(*args) for e in healthy), return_exceptions=True
        )
        for engine, result in zip(list(healthy), results, strict=True):
            if isinstance(result, BaseException):
                failures[engines.index(engine)] = result
                healthy.remove(engine)

    await on_all("pause")
    buckets = iter_full_state_dict_buckets(model, bucket_bytes=bucket_bytes, dtype=dtype)
    if fp8_names is not None:
        fp8_names = frozenset(engine_parameter_name(name) for name in fp8_names)
    device = next(model.parameters()).device
    tensors = nbytes = sent = 0
    while (bucket := await asyncio.to_thread(_next_bucket, buckets, device, fp8_names)) is not None:
        await on_all("update_weights", bucket, version)
        tensors += len(bucket)
        nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
        sent += 1
    for engine in list(healthy):
        if engine.weight_version != version:
            failures[engines.index(engine)] = RuntimeError(
                f"engine reports weight version {engine.weight_version}, expected {version}"
            )
            healthy.remove(engine)
    await on_all("resume")
    if failures:
        first = next(iter(failures.values()))
        detail = "; ".join(f"engine {i}: {exc!r}" for i, exc in sorted(failures.items()))
        raise WeightSyncError(
            f"weight version {version} reached {len(healthy)} of {len(engines)} engines; "
            f"the others stay paused: {detail}"
        ) from first
    return SyncReport(
        version=version,
        tensors=tensors,
        bytes=nbytes,
        buckets=sent,
        engines=len(healthy),
        seconds=time.perf_counter() - start,
    )


def _next_bucket(
    buckets: Iterator[Bucket], device: torch.device, fp8_names: frozenset[str] | None
) -> Bucket | None:
    """Advance the gather in a worker thread (which must use the model's CUDA device), and
    quantise the bucket's FP8 weights."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    bucket = next(buckets, None)
    if bucket is None or not fp8_names:
        return bucket
    return list(quantize_named_tensors(bucket, fp8_names))
