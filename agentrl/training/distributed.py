"""The trainer's process group: one call that works under ``torchrun`` and in a plain process.

Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``
in the environment) :func:`init_distributed` joins the launcher's group through ``env://``.
Without those variables it makes a one-process group over an in-memory store, which needs no port
and no files, so a notebook, a test or a single-machine run goes through the same FSDP2 code as a
multi-process job. The backend is ``nccl`` with one CUDA device per local rank when CUDA is
available, else ``gloo`` on the CPU.

Guarantees: :func:`init_distributed` is idempotent (a second call returns the group that exists,
whoever created it); :func:`distributed` destroys the group on every exit path, but only a group it
created itself. Not covered: several process groups in one process, or re-initialising after a
launcher has torn its store down; timeouts are torch's defaults (a rank that never joins a
collective makes the others wait).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

Backend = Literal["gloo", "nccl"]
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    """Global rank, ``0 <= rank < world_size``; rank 0 talks to the engines and writes files."""
    world_size: int
    """Number of processes in the group."""
    local_rank: int
    """Rank on this machine; it selects the CUDA device."""
    device: torch.device
    """The device this rank computes on (``cuda:<local_rank>`` with nccl, ``cpu`` with gloo)."""
    backend: Backend
    """The process group's backend."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def default_backend() -> Backend:
    """``nccl`` when CUDA is available, else ``gloo``."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(backend: Backend | None = None, *, cpu_collectives: bool = False) -> DistInfo:
    """Join (or create) the default process group and return this process's :class:`DistInfo`.

    ``backend`` defaults to :func:`default_backend`; it is ignored when a group already exists.
    A CUDA rank's current device is set to ``cuda:<local_rank>``. ``cpu_collectives`` makes an
    nccl group ``cuda:nccl,cpu:gloo`` (torchtitan's choice for CPU offload): collectives of CPU
    tensors then run over gloo, which `ActorConfig.offload` needs (sharded parameters, gradients
    and their norm live in CPU memory); a gloo group has them already.
    """
    if not dist.is_initialized():
        backend = backend or default_backend()
        if backend == "nccl" and not torch.cuda.is_available():
            raise ValueError("backend 'nccl' needs CUDA, which is not available; use 'gloo'")
        name = "cuda:nccl,cpu:gloo" if backend == "nccl" and cpu_collectives else backend
        if all(var in os.environ for var in TORCHRUN_VARS):
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            dist.init_process_group(name, init_method="env://")
        else:
            if backend == "nccl":
                torch.cuda.set_device(0)
            # One process: an in-memory store is the whole rendezvous.
            dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1)
    return current_dist_info()


def group_backends() -> dict[str, str]:
    """``{device type: backend}`` of the default group (:func:`parse_backends`)."""
    return parse_backends(str(dist.get_backend()))


def parse_backends(name: str) -> dict[str, str]:
    """``{device type: backend}`` of a process-group backend name: ``{"cpu": "gloo"}`` for
    ``"gloo"``, ``{"cuda": "nccl"}`` for ``"nccl"``, ``{"cuda": "nccl", "cpu": "gloo"}`` for
    ``"cuda:nccl,cpu:gloo"`` (a group made with ``cpu_collectives``)."""
    if ":" not in name:  # a plain backend serves the device it is made for
        return {"cpu": name} if name == "gloo" else {"cuda": name}
    return dict(part.split(":", 1) for part in name.split(","))


def current_dist_info() -> DistInfo:
    """:class:`DistInfo` of the existing default group; raises ``RuntimeError`` if there is none."""
    if not dist.is_initialized():
        raise RuntimeError("no process group: call init_distributed() first")
    backends = group_backends()
    backend = backends.get("cuda", backends.get("cpu", ""))
    if backend not in ("gloo", "nccl") or set(backends.values()) - {"gloo", "nccl"}:
        raise RuntimeError(f"unsupported process-group backend {dist.get_backend()!r}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    return DistInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=device,
        backend=backend,  # type: ignore[arg-type]  # checked above
    )


def data_parallel_mesh(info: DistInfo) -> DeviceMesh:
    """A 1-D mesh over every rank, named ``"dp"``: FSDP2 shards parameters along it."""
    return init_device_mesh(info.device.type, (info.world_size,), mesh_dim_names=("dp",))


def destroy() -> None:
    """Destroy the default process group if there is one (safe to call twice)."""
    if dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def distributed(
    backend: Backend | None = None, *, cpu_collectives: bool = False
) -> Iterator[DistInfo]:
    """``with distributed() as info:`` init the group; on exit destroy it if this call made it."""
    created = not dist.is_initialized()
    info = init_distributed(backend, cpu_collectives=cpu_collectives)
    try:
        yield info
    finally:
        if created:
            destroy()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over every rank (float64 on the ranks' device); every rank gets the sum."""
    info = current_dist_info()
    total = values.detach().to(device=info.device, dtype=torch.float64).clone()
    if info.world_size > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total
