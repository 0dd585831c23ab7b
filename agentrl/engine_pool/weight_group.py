"""Weight sync by broadcast: a process group joining the trainer (rank 0) and engine servers.

SGLang's ``/init_weights_update_group`` and ``/update_weights_from_distributed`` (see
``docs/sglang_http_api.md`` section 7): each server joins a new process group at
``master_address:master_port`` as rank ``rank_offset + tp_rank``; then, for every update, the trainer
posts the names, dtypes and shapes to every server and broadcasts the tensors from rank 0 in that
order, while the servers receive them. One broadcast reaches every engine in the group.

Both sides build the group directly (``TCPStore`` + ``ProcessGroupGloo`` or ``ProcessGroupNCCL``),
apart from any default process group, so the trainer's FSDP group is untouched. ``gloo`` moves CPU
tensors (tested here between processes on loopback); ``nccl`` moves CUDA tensors between GPU
processes (the same calls; not run on these machines, which have no GPU).

:class:`WeightUpdateGroup` is the trainer's side; :func:`join_group` and :func:`receive` are the
server's (``agentrl serve`` uses them).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

DEFAULT_GROUP = "weight_update_group"
_TIMEOUT = datetime.timedelta(minutes=10)


def join_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    *,
    group_name: str = DEFAULT_GROUP,
    backend: str = "gloo",
    is_master: bool = False,
) -> dist.ProcessGroup:
    """Join (blocking until all ``world_size`` ranks have) a group used only for weight updates."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs a CUDA device; use 'gloo' on CPU engines")
    store = dist.TCPStore(master_address, master_port, world_size, is_master, timeout=_TIMEOUT)
    prefixed = dist.PrefixStore(group_name, store)
    if backend == "gloo":
        return dist.ProcessGroupGloo(prefixed, rank, world_size, _TIMEOUT)
    return dist.ProcessGroupNCCL(prefixed, rank, world_size)


def receive(
    group: dist.ProcessGroup,
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    device: str = "cpu",
) -> list[tuple[str, torch.Tensor]]:
    """Receive one broadcast per name from rank 0, in order (the server's side of an update)."""
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError("names, dtypes and shapes must have the same length")
    received = []
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        kind = getattr(torch, dtype, None)
        if not isinstance(kind, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r} for {name!r}")
        tensor = torch.empty(tuple(shape), dtype=kind, device=device)
        _broadcast(group, tensor)
        received.append((name, tensor))
    return received


class WeightUpdateGroup:
    """The trainer's end of a weight-update group over ``engines`` (SGLang-API clients)."""

    def __init__(self, engines: Sequence[Any], group: dist.ProcessGroup, group_name: str) -> None:
        self.engines = list(engines)
        self.group = group
        self.group_name = group_name

    @classmethod
    async def create(
        cls,
        engines: Sequence[Any],
        master_address: str,
        master_port: int,
        *,
        backend: str = "gloo",
        group_name: str = DEFAULT_GROUP,
    ) -> WeightUpdateGroup:
        """Form the group: rank 0 here, engine ``i`` as rank ``1 + i`` (one rank per engine)."""
        world_size = 1 + len(engines)
        master = asyncio.to_thread(
            join_group,
            master_address,
            master_port,
            0,
            world_size,
            group_name=group_name,
            backend=backend,
            is_master=True,
        )
        joins = [
            engine.init_weights_update_group(
                master_address,
                master_port,
                1 + i,
                world_size,
                group_name=group_name,
                backend=backend,
            )
            for i, engine in enumerate(engines)
        ]
        group, *_ = await asyncio.gather(master, *joins)
        return cls(engines, group, group_name)

    async def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Send the tensors to every engine (one broadcast each) and set ``version`` on them."""
        tensors = [(name, tensor.detach().contiguous()) for name, tensor in named_tensors]
        names = [name for name, _ in tensors]
        dtypes = [str(tensor.dtype).removeprefix("torch.") for _, tensor in tensors]
        shapes = [list(tensor.shape) for _, tensor in tensors]
        posts = [
            engine.update_weights_from_distributed(
                names, dtypes, shapes, version, group_name=self.group_name
            )
            for engine in self.engines
        ]
        sends = asyncio.to_thread(self._send, [tensor for _, tensor in tensors])
        await asyncio.gather(sends, *posts)

    def _send(self, tensors: list[torch.Tensor]) -> None:
        for tensor in tensors:
            _broadcast(self.group, tensor)


def _broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()
