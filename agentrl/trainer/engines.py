"""The trainer's rollout engines, chosen in config (``engines``), and how new weights reach them.

``engines.kind``:

* ``embedded``: one :class:`~agentrl.engine_pool.LocalEngine` in the first process, on its own copy
  of the policy (``rollout.engine_dtype``).
* ``serve``: ``count`` ``agentrl serve`` processes started by the run on free local ports, logging
  to ``output_dir/engines/serve-N.log``, stopped when the run ends.
* ``sglang``: ``count`` SGLang servers (``python -m sglang.launch_server``), one per GPU of
  ``gpu_ids``; sampling seeds are dropped unless a server runs with
  ``--enable-deterministic-inference``.
* ``attach``: servers already running at ``urls`` (SGLang or ``agentrl serve``).
* ``ray``: ``count`` servers placed as Ray actors (``launch_ray_engines``).

Servers are driven through an :class:`~agentrl.engine_pool.EnginePool`: least-loaded routing with
sticky sessions, a failed request retried on another engine (never lost, never duplicated), health
probes, eviction and re-admission only at the pool's weight version. No training rank is also an
engine: every rank trains, and the first also drives the rollouts as a client.

Weight sync after each step (``engines.weight_sync``; every rank calls :func:`sync_engines`, since
gathering the full weights from the FSDP shards is collective):

* ``tensor``: :func:`~agentrl.trainer.weight_sync.sync_weights` pushes buckets to the pool, which
  posts each to every engine (``/update_weights_from_tensor``).
* ``disk``: the weights are written as a Hugging Face directory under ``output_dir/weights`` and
  every engine loads it (``/update_weights_from_disk``); servers must be able to read the path.
* ``broadcast``: the first rank and every server form one process group at start
  (:class:`~agentrl.engine_pool.WeightUpdateGroup`, gloo on CPU, NCCL on GPU) and each bucket is
  broadcast once to all of them. A broadcast needs every member, so while an engine is out of
  rotation the step falls back to ``tensor`` (``weight_sync/fallback`` in the metrics).

In every case the pool pauses the engines (``abort`` first under ``stream.partial_rollouts=abort``),
loads the weights, then resumes only engines that report the new version, evicting the others;
``pool/*`` metrics say how many engines serve, how many are out, and how many requests were
retried.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentrl.engine_pool import EnginePool, LocalEngine, SGLangEngine
from agentrl.engine_pool.engine import Engine
from agentrl.engine_pool.sglang_engine import free_port, serve_command, sglang_command
from agentrl.engine_pool.weight_group import WeightUpdateGroup
from agentrl.trainer.checkpoint import export_hf
from agentrl.trainer.weight_sync import DEFAULT_BUCKET_BYTES, sync_weights

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from agentrl.trainer.actor import Actor
    from agentrl.trainer.train_config import EnginesConfig


@dataclass
class RolloutEngines:
    """The engine rollouts go to (a LocalEngine or an EnginePool) and what the run owns."""

    engine: Engine
    config: EnginesConfig
    pool: EnginePool | None = None
    group: WeightUpdateGroup | None = None
    weights_dir: Path | None = None
    actors: list[Any] = field(default_factory=list)  # Ray actor handles keep their servers alive
    fallbacks: int = 0

    def metrics(self) -> dict[str, float]:
        if self.pool is None:
            return {}
        members = self.pool.members
        return {
            "pool/healthy": float(sum(m.status == "healthy" for m in members)),
            "pool/out_of_rotation": float(sum(m.status != "healthy" for m in members)),
            "pool/retries": float(self.pool.retries),
            "weight_sync/fallback": float(self.fallbacks),
        }

    async def aclose(self) -> None:
        if self.group is not None:
            # a server that died cannot leave the group; the run is ending anyway
            with contextlib.suppress(Exception):
                await self.group.close()
            self.group = None
        await self.engine.aclose()


async def start_engines(
    config: EnginesConfig,
    *,
    model_path: str,
    engine_model: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase,
    engine_dtype: str,
    output_dir: Path,
    max_batch_size: int,
    prefix_cache_tokens: int,
) -> RolloutEngines:
    """Start (or connect to) the engines of ``config``; call it on the first rank only."""
    if config.kind == "embedded":
        assert engine_model is not None
        local = await LocalEngine(
            engine_model,
            tokenizer=tokenizer,
            max_batch_size=max_batch_size,
            prefix_cache_tokens=prefix_cache_tokens,
        ).start()
        return RolloutEngines(local, config)
    actors: list[Any] = []
    if config.kind == "attach":
        servers = [await SGLangEngine(url).start() for url in config.urls]
    elif config.kind == "ray":
        from agentrl.engine_pool.ray_engines import launch_ray_engines

        servers, actors = await launch_ray_engines(
            config.count, model=model_path, extra_args=tuple(config.server_args)
        )
    else:
        servers = await _launch_local(config, model_path, engine_dtype, max_batch_size, output_dir)
    pool = EnginePool(
        servers,
        max_inflight_per_engine=config.max_inflight_per_engine,
        health_interval=config.health_interval,
    )
    engines = RolloutEngines(pool, config, pool=pool, actors=actors)
    try:
        await pool.__aenter__()
        if config.weight_sync == "broadcast":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            engines.group = await WeightUpdateGroup.create(
                servers, "127.0.0.1", free_port(), backend=backend
            )
        if config.weight_sync == "disk":
            engines.weights_dir = output_dir / "weights"
    except BaseException:
        await engines.aclose()
        raise
    return engines


async def _launch_local(
    config: EnginesConfig, model_path: str, dtype: str, max_batch_size: int, output_dir: Path
) -> list[SGLangEngine]:
    logs = output_dir / "engines"
    logs.mkdir(parents=True, exist_ok=True)
    servers: list[SGLangEngine] = []
    try:
        for i in range(config.count):
            port = free_port()
            if config.kind == "serve":
                command = serve_command(model_path, port, max_batch_size=max_batch_size)
                command += ["--dtype", dtype, *config.server_args]
                options: dict[str, Any] = {}
            else:
                command = sglang_command(model_path, port, extra=config.server_args)
                gpu = config.gpu_ids[i] if i < len(config.gpu_ids) else i
                options = {"ignore_seeds": True, "env": {"CUDA_VISIBLE_DEVICES": str(gpu)}}
            servers.append(
                await SGLangEngine.launch(
                    command,
                    f"http://127.0.0.1:{port}",
                    startup_timeout=config.startup_timeout,
                    log_path=logs / f"{config.kind}-{i}.log",
                    **options,
                )
            )
    except BaseException:
        for server in servers:
            await server.aclose()
        raise
    return servers


async def sync_engines(
    engines: RolloutEngines | None,
    weight_sync: str,
    actor: Actor,
    version: int,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    abort: bool = False,
) -> None:
    """Load ``actor``'s weights into the engines as ``version``; every rank calls it (with
    ``engines=None`` except on the first). Raises
    :class:`~agentrl.trainer.weight_sync.WeightSyncError` when no engine took them."""
    if engines is not None and abort:
        await engines.engine.abort()  # the runner continues each aborted turn from its tokens
    if weight_sync == "disk":
        path = engines.weights_dir if engines is not None else None
        await _sync_from_disk(engines, actor, path or Path("."), version)
        return
    targets: list[Any] = []
    if engines is not None:
        targets = [engines.engine]
        if weight_sync == "broadcast" and engines.group is not None and engines.pool is not None:
            if all(m.status == "healthy" for m in engines.pool.members):
                targets = [_Broadcast(engines.pool, engines.group)]
            else:
                engines.fallbacks += 1
    await sync_weights(actor.model, targets, version, bucket_bytes=bucket_bytes)


async def _sync_from_disk(
    engines: RolloutEngines | None, actor: Actor, path: Path, version: int
) -> None:
    await asyncio.to_thread(export_hf, actor, None, path)  # collective: every rank gathers
    if engines is None or engines.pool is None:
        return
    pool = engines.pool
    await pool.pause()
    try:
        await pool.update_weights_from_disk(str(path.resolve()), version)
    finally:
        await pool.resume()


class _Broadcast:
    """The pool as :func:`sync_weights` sees it, with buckets broadcast to the whole group."""

    def __init__(self, pool: EnginePool, group: WeightUpdateGroup) -> None:
        self.pool = pool
        self.group = group

    @property
    def weight_version(self) -> int:
        return self.pool.weight_version

    async def pause(self) -> None:
        await self.pool.pause()

    async def update_weights(self, bucket: list[tuple[str, torch.Tensor]], version: int) -> None:
        await self.group.push(bucket, version)
        self.pool.delivered(version)

    async def resume(self) -> None:
        await self.pool.resume()
