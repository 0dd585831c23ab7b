"""The trainer's rollout engines, chosen in config (``engines``), and how new weights reach them.

``engines.kind``:

* ``embedded``: one :class:`~agentrl.engine_pool.LocalEngine` in the first process, on its own copy
  of the policy (``engines.dtype``).
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
import functools
import socket
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self
from urllib.parse import urlsplit

import torch
from pydantic import Field, field_validator, model_validator

from agentrl.config import Config, registered
from agentrl.engine_pool import EnginePool, LocalEngine, SGLangEngine
from agentrl.engine_pool.engine import Engine, EngineError
from agentrl.engine_pool.sglang_engine import free_port, serve_command, sglang_command
from agentrl.engine_pool.weight_group import WeightUpdateGroup, leave_group
from agentrl.fp8_weights import fp8_weight_names
from agentrl.rl.weight_sync import DEFAULT_BUCKET_BYTES, sync_weights
from agentrl.training.checkpoint import export_hf

GROUP_TIMEOUT = datetime.timedelta(minutes=10)
"""How long a broadcast group's members wait in one collective (forming it, or one tensor)."""

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from agentrl.training.actor import Actor


EMBEDDED = "embedded"
"""``engines.kind`` of the one :class:`~agentrl.engine_pool.LocalEngine` inside the trainer."""


class EnginesConfig(Config):
    """Where rollouts are generated, and how new weights reach the engines."""

    kind: str = EMBEDDED
    """``embedded`` or a name of :data:`SERVER_KINDS`. ``embedded``: one LocalEngine inside the trainer's first process; ``serve``: ``count``
    ``agentrl serve`` processes started and owned by the run; ``sglang``: ``count`` SGLang
    servers started with ``python -m sglang.launch_server`` (one per GPU of ``gpu_ids``);
    ``attach``: servers already running at ``urls``; ``ray``: ``count`` servers placed as Ray
    actors (``ray_server``, on the cluster at ``ray_address``). All but ``embedded`` go through
    an ``EnginePool``: routing, retries on another engine, health checks, eviction."""
    count: int = Field(2, ge=1)
    """Servers to start (``serve``, ``sglang``, ``ray``)."""
    urls: list[str] = Field(default_factory=list)
    """Servers to use (``attach``): ``http://host:port`` of SGLang or ``agentrl serve``."""
    server_args: list[str] = Field(default_factory=list)
    """Extra command-line arguments of each started server."""
    command: list[str] = Field(default_factory=list)
    """``serve``, ``sglang``: the argv that starts one server, instead of the built-in one, with
    ``{model}``, ``{port}``, ``{host}`` and ``{gpu}`` filled in (``server_args`` appended); e.g.
    ``[python, -m, sglang.launch_server, --model-path, "{model}", --port, "{port}"]``. The server
    must answer SGLang's HTTP API at ``http://{host}:{port}`` (without ``--skip-tokenizer-init``
    where stop strings are used)."""
    gpu_ids: list[int] = Field(default_factory=list)
    """``sglang``: the GPU of each server (``CUDA_VISIBLE_DEVICES``); default 0, 1, 2..."""
    ray_server: Literal["agentrl", "sglang"] = "agentrl"
    """``ray``: what each actor runs, ``agentrl serve`` or SGLang."""
    ray_gpus_per_engine: float | None = Field(None, ge=0)
    """``ray``: GPUs each actor reserves; default 1 for SGLang, 0 for ``agentrl serve``."""
    ray_address: str | None = None
    """``ray``: the cluster ``ray.init`` joins (``auto``, ``ray://host:10001``); default: the one
    ``RAY_ADDRESS`` names, else a new local instance, stopped when the run ends."""
    weight_sync: Literal["tensor", "disk", "broadcast"] = "tensor"
    """How weights reach the servers after each step: ``tensor`` (buckets posted to
    ``/update_weights_from_tensor``), ``disk`` (written under output_dir/weights, loaded with
    ``/update_weights_from_disk``; servers must read that path), or ``broadcast`` (one process
    group of the trainer and the serving engines: gloo on CPU, NCCL on GPU; formed again when
    the serving engines change, and a failed broadcast is finished by ``tensor``)."""
    startup_timeout: float = Field(600.0, gt=0)
    """Seconds a started server has to become healthy."""
    max_inflight_per_engine: int = Field(64, ge=1)
    """Requests one engine serves at once; more wait for a slot."""
    health_interval: float = Field(2.0, gt=0)
    """Seconds between health probes of every engine."""
    fp8_weights: bool = False
    """Rollouts with blockwise-FP8 weights (128x128 blocks, SGLang's FP8 checkpoint layout; see
    `agentrl.fp8_weights`): weight sync sends each linear weight but the LM head's as
    ``float8_e4m3fn`` with its ``weight_scale_inv``. The embedded engine and ``agentrl serve``
    (started with ``--fp8-weights``) compute with the dequantised weights; an SGLang server must
    have been started from a blockwise-FP8 checkpoint. The mismatch metrics then show the cost.
    Needs ``weight_sync=tensor``."""
    fp8_ignored_layers: list[str] = Field(default_factory=list)
    """With ``fp8_weights``: modules (names or name prefixes, SGLang's ``ignored_layers``) whose
    weights stay in full precision, e.g. ``[model.layers.0]``."""

    batch_size: int = Field(32, ge=1)
    """The embedded engine's batch rows (``serve`` and ``ray`` servers: ``--max-batch-size``)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The engines' weights, embedded, ``serve`` or ``ray`` with ``agentrl serve`` (the trainer
    keeps float32): bfloat16 decodes faster on CPUs with AVX512-BF16 and on GPUs (measured in
    docs/performance.md), at the price of a larger train/inference
    mismatch (logged; corrected by TIS/MIS), and slower than float32 on CPUs without it (AVX2
    only), which emulate it. ``auto``: bfloat16 on a GPU or a CPU with native bfloat16
    (AVX512-BF16, AMX), float32 elsewhere."""
    prefix_cache_tokens: int = Field(8192, ge=0)
    """The embedded engine's prefix cache budget in tokens (0 disables it)."""
    release_while_training: bool = True
    """Free the embedded engine's weights and prefix cache while a step trains with no rollout
    in flight (every step with ``stream.max_staleness=0``, the last one otherwise); the weight
    sync after the step brings them back (`LocalEngine.release_weights`). Takes the engine's copy
    (SmolLM2-135M: 0.27 GB in bfloat16) off the trainer's peak; costs allocating it again in
    each such sync (measured in docs/performance.md). Servers keep their memory."""

    @field_validator("kind")
    @classmethod
    def _registered_kind(cls, value: str) -> str:
        return registered(value, [EMBEDDED, *SERVER_KINDS], "engine kind")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.kind == "attach" and not self.urls:
            raise ValueError("engines.kind=attach needs engines.urls")
        if self.kind != "attach" and self.urls:
            raise ValueError("engines.urls is only for engines.kind=attach")
        if self.command and self.kind not in ("serve", "sglang"):
            raise ValueError("engines.command is only for engines.kind=serve or sglang")
        if self.command and not any("{port}" in part for part in self.command):
            raise ValueError("engines.command must place the server's port: '{port}'")
        for part in self.command:
            try:
                part.format(model="", port=0, host="", gpu=0)
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"engines.command: {part!r} is not a template of {{model}}, {{port}}, "
                    f"{{host}} and {{gpu}} ({type(exc).__name__}: {exc}); write '{{{{' for '{{'"
                ) from None
        if self.kind == EMBEDDED and self.weight_sync != "tensor":
            raise ValueError("the embedded engine takes weights as tensors (weight_sync=tensor)")
        if self.fp8_weights and self.weight_sync != "tensor":
            raise ValueError(
                f"engines.fp8_weights is sent by weight_sync=tensor only, not "
                f"{self.weight_sync}: FP8 checkpoints on disk and FP8 broadcasts are not built yet"
            )
        if self.fp8_ignored_layers and not self.fp8_weights:
            raise ValueError("engines.fp8_ignored_layers is set but engines.fp8_weights is off")
        return self


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

    async def release_for_training(self) -> int:
        """Free the embedded engine's weights and prefix cache until the next sync, when
        ``release_while_training`` is on and the engine is idle; return the bytes freed (0 for
        servers, or when something still runs on the engine)."""
        if not self.config.release_while_training or not isinstance(self.engine, LocalEngine):
            return 0
        try:
            return await self.engine.release_weights()
        except EngineError:  # a request is queued or running: it keeps the weights it needs
            return 0

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
    engine_device: torch.device | None = None,
) -> RolloutEngines:
    """Start (or connect to) the engines of ``config``; call it on the first rank only.
    ``engine_dtype`` is ``config.dtype`` resolved (``auto`` by the device). The embedded engine
    runs on ``engine_device`` (the first rank's device: on a GPU, beside it)."""
    if config.kind == EMBEDDED:
        assert engine_model is not None
        local = await LocalEngine(
            engine_model,
            tokenizer=tokenizer,
            max_batch_size=config.batch_size,
            prefix_cache_tokens=config.prefix_cache_tokens,
            fp8_weights=config.fp8_weights,
            fp8_ignored=config.fp8_ignored_layers,
            device=engine_device,
        ).start()
        return RolloutEngines(local, config)
    servers, actors, ray_started = await SERVER_KINDS[config.kind](
        config, model_path, engine_dtype, output_dir
    )
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


async def _attach(config: EnginesConfig, model_path: str, dtype: str, output_dir: Path) -> Servers:
    """The servers already running at ``config.urls``."""
    return [await SGLangEngine(url).start() for url in config.urls], [], False


async def _launch_ray(
    config: EnginesConfig, model_path: str, dtype: str, output_dir: Path
) -> Servers:
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
        extra = ["--dtype", dtype, "--max-batch-size", str(config.batch_size), *extra]
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


LocalServer = Callable[[EnginesConfig, str, str, int, int], tuple[list[str], dict[str, Any]]]
"""``(config, model_path, engine_dtype, port, gpu) -> (argv, SGLangEngine.launch options)``: how
one server of a kind :func:`_launch_local` starts is launched (``engines.command`` aside)."""


def _agentrl_serve(
    config: EnginesConfig, model_path: str, dtype: str, port: int, gpu: int
) -> tuple[list[str], dict[str, Any]]:
    command = serve_command(model_path, port, max_batch_size=config.batch_size)
    command += ["--dtype", dtype, *config.server_args]
    if config.fp8_weights:
        command.append("--fp8-weights")
    return command, {}


def _sglang_server(
    config: EnginesConfig, model_path: str, dtype: str, port: int, gpu: int
) -> tuple[list[str], dict[str, Any]]:
    command = sglang_command(model_path, port, extra=config.server_args)
    return command, {"ignore_seeds": True, "env": {"CUDA_VISIBLE_DEVICES": str(gpu)}}


async def _launch_local(
    config: EnginesConfig, model_path: str, dtype: str, output_dir: Path, *, server: LocalServer
) -> Servers:
    """``config.count`` servers started here as ``server`` says, logs under output_dir."""
    logs = output_dir / "engines"
    logs.mkdir(parents=True, exist_ok=True)
    servers: list[SGLangEngine] = []
    try:
        for i in range(config.count):
            port = free_port()
            gpu = config.gpu_ids[i] if i < len(config.gpu_ids) else i
            command, options = server(config, model_path, dtype, port, gpu)
            if config.command:
                fields = {"model": model_path, "port": port, "host": "127.0.0.1", "gpu": gpu}
                command = [part.format(**fields) for part in config.command]
                command += config.server_args
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
        for started in servers:
            await started.aclose()
        raise
    return servers, [], False


Servers = tuple[list[SGLangEngine], list[Any], bool]
"""The servers started or attached, the Ray actors holding them, whether this run started Ray."""
ServerLauncher = Callable[[EnginesConfig, str, str, Path], Awaitable[Servers]]
"""``(config, model_path, engine_dtype, output_dir) -> Servers``: one ``engines.kind``."""

SERVER_KINDS: dict[str, ServerLauncher] = {
    "serve": functools.partial(_launch_local, server=_agentrl_serve),
    "sglang": functools.partial(_launch_local, server=_sglang_server),
    "attach": _attach,
    "ray": _launch_ray,
}
"""The ``engines.kind`` values served through an :class:`~agentrl.engine_pool.EnginePool`, by
name; ``embedded`` (:data:`EMBEDDED`) is the one other kind. A new backend is a launcher, one
entry here (``engines.kind`` takes the names) and its test in tests/rl/test_pool_training.py."""


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
