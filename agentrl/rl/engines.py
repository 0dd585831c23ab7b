"""The trainer's rollout engines, chosen in config (``engines``), and how new weights reach them.

``engines.kind``:

* ``embedded``: one :class:`~agentrl.engine_pool.LocalEngine` in the first process, on its own copy
  of the policy (``rollout.engine_dtype``).
* ``serve``: ``count`` ``agentrl serve`` processes started by the run on free local ports, logging
  to ``output_dir/engines/serve-N.log``, stopped when the run ends.
* ``sglang``: ``count`` SGLang servers (``python -m sglang.launch_server``), one per GPU of
  ``gpu_ids``; sampling seeds are dropped unless a server runs with
  ``--enable-deterministic-inference``.
* ``serve`` and ``sglang`` start ``command`` instead when it is set: a template whose
  ``{model}``, ``{port}``, ``{host}`` and ``{gpu}`` are filled in per server (a wrapper script,
  a container, another entry point of SGLang).
* ``attach``: servers already running at ``urls`` (SGLang or ``agentrl serve``).
* ``ray``: ``count`` servers placed as Ray actors (``launch_ray_engines``).

Servers are driven through an :class:`~agentrl.engine_pool.EnginePool`: least-loaded routing with
sticky sessions, a failed request retried on another engine (never lost, never duplicated), health
probes, eviction and re-admission only at the pool's weight version. No training rank is also an
engine: every rank trains, and the first also drives the rollouts as a client.

Weight sync after each step (``engines.weight_sync``; every rank calls :func:`sync_engines`, since
gathering the full weights from the FSDP shards is collective):

* ``tensor``: :func:`~agentrl.rl.weight_sync.sync_weights` pushes buckets to the pool, which
  posts each to every engine (``/update_weights_from_tensor``).
* ``disk``: the weights are written as a Hugging Face directory under ``output_dir/weights`` and
  every engine loads it (``/update_weights_from_disk``); servers must be able to read the path.
* ``broadcast``: the first rank and the servers form one process group
  (:class:`~agentrl.engine_pool.WeightUpdateGroup`, gloo on CPU, NCCL on GPU) and each bucket is
  broadcast once to all of them. A broadcast needs every member, so the group follows the pool:
  before each sync the servers are probed, and when the serving set changed (an engine evicted,
  or one re-admitted after a restart) the group is formed again over the engines that answer,
  under a new group name (``weight_sync/group_rebuilds``). A server that dies during the
  broadcast fails it: the group is abandoned (rebuilt at the next sync), the engines still pending
  are cancelled, and this bucket and the rest go by ``tensor`` to the engines that answer
  (``weight_sync/fallback``); the buckets broadcast before the failure had reached every server.
  A server that was waiting in the abandoned group stays in that receive until the group's
  timeout (agentrl serve: 10 minutes, in a worker thread; it keeps serving HTTP meanwhile).

In every case the pool pauses the engines (``abort`` first under ``stream.partial_rollouts=abort``),
loads the weights, then resumes only engines that report the new version, evicting the others;
``pool/*`` metrics say how many engines serve, how many are out, and how many requests were
retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import torch

from agentrl.engine_pool import EnginePool, LocalEngine, SGLangEngine
from agentrl.engine_pool.engine import Engine
from agentrl.engine_pool.sglang_engine import free_port, serve_command, sglang_command
from agentrl.engine_pool.weight_group import WeightUpdateGroup, leave_group
from agentrl.fp8_weights import fp8_weight_names
from agentrl.rl.weight_sync import DEFAULT_BUCKET_BYTES, sync_weights
from agentrl.training.checkpoint import export_hf

GROUP_TIMEOUT = datetime.timedelta(minutes=10)
"""How long a broadcast group's members wait in one collective (forming it, or one tensor)."""

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from agentrl.rl.config import EnginesConfig
    from agentrl.training.actor import Actor


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
    """Syncs in which a broadcast failed and the weights went by tensor."""
    group_rebuilds: int = 0
    """Times the broadcast group was formed again because the serving engines changed."""
    groups_formed: int = 0
    ray_started: bool = False
    """This run started the local Ray instance its actors run on (stopped in :meth:`aclose`)."""

    def metrics(self) -> dict[str, float]:
        if self.pool is None:
            return {}
        members = self.pool.members
        return {
            "pool/healthy": float(sum(m.status == "healthy" for m in members)),
            "pool/out_of_rotation": float(sum(m.status != "healthy" for m in members)),
            "pool/retries": float(self.pool.retries),
            "weight_sync/fallback": float(self.fallbacks),
            "weight_sync/group_rebuilds": float(self.group_rebuilds),
        }

    async def regroup(self) -> WeightUpdateGroup | None:
        """The broadcast group over the engines that serve now: the current one when they have
        not changed, else a new one (the old one left first); ``None`` when none answers."""
        assert self.pool is not None
        servers: list[Any] = [m.engine for m in self.pool.members if m.status != "evicted"]
        answers = await asyncio.gather(*(_answers(server) for server in servers))
        alive = [server for server, ok in zip(servers, answers, strict=True) if ok]
        if self.group is not None and self.group.engines == alive:
            return self.group
        if self.group is not None:
            with contextlib.suppress(Exception):  # best effort: the servers still up leave it
                await self.group.close(alive)
            self.group = None
            self.group_rebuilds += 1
        if not alive:
            return None
        self.groups_formed += 1
        self.group = await WeightUpdateGroup.create(
            alive,
            _master_address([server.url for server in alive]),
            free_port(),
            backend="nccl" if torch.cuda.is_available() else "gloo",
            group_name=f"agentrl_weights_{self.groups_formed}",
            timeout=GROUP_TIMEOUT,
        )
        return self.group

    async def abandon_group(self) -> None:
        """Drop a group whose broadcast failed: leave it here (the servers cannot be asked while
        they wait in it); the next sync forms a new one."""
        if self.group is not None:
            with contextlib.suppress(Exception):
                leave_group(self.group.group)
            self.group = None
            self.group_rebuilds += 1

    async def aclose(self) -> None:
        if self.group is not None:
            # a server that died cannot leave the group; the run is ending anyway
            with contextlib.suppress(Exception):
                await self.group.close()
            self.group = None
        await self.engine.aclose()
        if self.actors:
            import ray

            for actor in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)  # and its server with it (PR_SET_PDEATHSIG)
            self.actors = []
            if self.ray_started:
                ray.shutdown()


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
    engine_device: torch.device | None = None,
) -> RolloutEngines:
    """Start (or connect to) the engines of ``config``; call it on the first rank only. The
    embedded engine runs on ``engine_device`` (the first rank's device: on a GPU, beside it)."""
    if config.kind == "embedded":
        assert engine_model is not None
        local = await LocalEngine(
            engine_model,
            tokenizer=tokenizer,
            max_batch_size=max_batch_size,
            prefix_cache_tokens=prefix_cache_tokens,
            fp8_weights=config.fp8_weights,
            fp8_ignored=config.fp8_ignored_layers,
            device=engine_device,
        ).start()
        return RolloutEngines(local, config)
    actors: list[Any] = []
    ray_started = False
    if config.kind == "attach":
        servers = [await SGLangEngine(url).start() for url in config.urls]
    elif config.kind == "ray":
        servers, actors, ray_started = await _launch_ray(
            config, model_path, engine_dtype, max_batch_size
        )
    else:
        servers = await _launch_local(config, model_path, engine_dtype, max_batch_size, output_dir)
    pool = EnginePool(
        servers,
        max_inflight_per_engine=config.max_inflight_per_engine,
        health_interval=config.health_interval,
    )
    engines = RolloutEngines(pool, config, pool=pool, actors=actors, ray_started=ray_started)
    try:
        await pool.__aenter__()
        if config.weight_sync == "broadcast":
            await engines.regroup()
        if config.weight_sync == "disk":
            engines.weights_dir = output_dir / "weights"
    except BaseException:
        await engines.aclose()
        raise
    return engines


async def _launch_ray(
    config: EnginesConfig, model_path: str, dtype: str, max_batch_size: int
) -> tuple[list[SGLangEngine], list[Any], bool]:
    """Place ``count`` servers as Ray actors; returns (clients, actor handles, whether this run
    started Ray)."""
    import ray

    from agentrl.engine_pool.ray_engines import launch_ray_engines

    started = not ray.is_initialized()
    if started:
        ray.init(address=config.ray_address, include_dashboard=False, log_to_driver=False)
    sglang = config.ray_server == "sglang"
    extra = list(config.server_args)
    if not sglang:
        extra = ["--dtype", dtype, "--max-batch-size", str(max_batch_size), *extra]
    gpus = config.ray_gpus_per_engine
    try:
        servers, actors = await launch_ray_engines(
            config.count,
            model=model_path,
            server=config.ray_server,
            num_gpus=(1 if sglang else 0) if gpus is None else gpus,
            extra_args=tuple(extra),
            startup_timeout=config.startup_timeout,
            ignore_seeds=sglang,
        )
    except BaseException:
        if started:
            ray.shutdown()
        raise
    return servers, actors, started


def _master_address(urls: list[str]) -> str:
    """The address of this machine that the servers at ``urls`` reach it by (loopback when they
    all run here): where the broadcast group's store listens."""
    hosts = {urlsplit(url).hostname or "127.0.0.1" for url in urls}
    remote = sorted(h for h in hosts if h not in ("127.0.0.1", "localhost", "::1"))
    if not remote:
        return "127.0.0.1"
    with socket.socket(
        socket.AF_INET6 if ":" in remote[0] else socket.AF_INET, socket.SOCK_DGRAM
    ) as probe:
        probe.connect((remote[0], 9))  # picks the route; a UDP connect sends nothing
        return str(probe.getsockname()[0])


async def _launch_local(
    config: EnginesConfig, model_path: str, dtype: str, max_batch_size: int, output_dir: Path
) -> list[SGLangEngine]:
    logs = output_dir / "engines"
    logs.mkdir(parents=True, exist_ok=True)
    servers: list[SGLangEngine] = []
    try:
        for i in range(config.count):
            port = free_port()
            gpu = config.gpu_ids[i] if i < len(config.gpu_ids) else i
            if config.command:
                fields = {"model": model_path, "port": port, "host": "127.0.0.1", "gpu": gpu}
                command = [part.format(**fields) for part in config.command]
                command += config.server_args
            elif config.kind == "serve":
                command = serve_command(model_path, port, max_batch_size=max_batch_size)
                command += ["--dtype", dtype, *config.server_args]
                if config.fp8_weights:
                    command.append("--fp8-weights")
            else:
                command = sglang_command(model_path, port, extra=config.server_args)
            options: dict[str, Any] = {}
            if config.kind == "sglang":
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
    :class:`~agentrl.rl.weight_sync.WeightSyncError` when no engine took them."""
    if engines is not None and abort:
        await engines.engine.abort()  # the runner continues each aborted turn from its tokens
    if weight_sync == "disk":
        path = engines.weights_dir if engines is not None else None
        await _sync_from_disk(engines, actor, path or Path("."), version)
        return
    targets: list[Any] = []
    if engines is not None:
        targets = [engines.engine]
        if weight_sync == "broadcast" and engines.pool is not None:
            group = await engines.regroup()
            if group is not None:
                targets = [_Broadcast(engines, group)]
    fp8_names = (
        fp8_weight_names(actor.model, engines.config.fp8_ignored_layers)
        if engines is not None and engines.config.fp8_weights
        else None
    )
    await sync_weights(
        actor.model, targets, version, bucket_bytes=bucket_bytes, fp8_names=fp8_names
    )


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


async def _answers(server: Any, timeout: float = 10.0) -> bool:
    """Whether a server answers ``/model_info`` (which generates nothing, unlike a health check
    that would queue behind running rollouts)."""
    try:
        await asyncio.wait_for(server.model_info(), timeout)
    except Exception:
        return False
    return True


class _Broadcast:
    """The pool as :func:`sync_weights` sees it, with buckets broadcast to the whole group; after
    a failed broadcast, the rest of this sync goes by tensor (see the module docstring)."""

    def __init__(self, engines: RolloutEngines, group: WeightUpdateGroup) -> None:
        assert engines.pool is not None
        self.engines = engines
        self.pool = engines.pool
        self.group = group
        self.failed = False

    @property
    def weight_version(self) -> int:
        return self.pool.weight_version

    async def pause(self) -> None:
        await self.pool.pause()

    async def update_weights(self, bucket: list[tuple[str, torch.Tensor]], version: int) -> None:
        if not self.failed:
            try:
                await self.group.push(bucket, version)
                self.pool.delivered(version)
                return
            except Exception as exc:
                self.failed = True
                self.engines.fallbacks += 1
                warnings.warn(
                    f"weight broadcast of version {version} failed ({exc}); sending it by tensor",
                    RuntimeWarning,
                    stacklevel=2,
                )
                await self.engines.abandon_group()
        await self.pool.update_weights(bucket, version)

    async def resume(self) -> None:
        await self.pool.resume()
