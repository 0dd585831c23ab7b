"""Weight sync by broadcast: a process group joining the trainer (rank 0) and engine servers.

SGLang's ``/init_weights_update_group`` and ``/update_weights_from_distributed`` (see
``docs/sglang_http_api.md`` section 7): each server's TP rank ``r`` joins a new process group at
``master_address:master_port`` as rank ``rank_offset + r``; then, for every update, the trainer
posts the names, dtypes and shapes to every server and broadcasts the tensors from rank 0 in that
order, while the servers receive them. One broadcast reaches every engine in the group.

Both sides build the group as SGLang's ``init_custom_process_group`` (``python/sglang/srt/utils/
common.py``) does, because the store keys must match: a TCP rendezvous at
``tcp://master_address:master_port`` (rank 0 hosts the store; here the ``TCPStore`` is made
directly, as that rendezvous makes it outside torchrun, so that a trainer under torchrun hosts it
too), a ``PrefixStore(group_name)`` over it, and torch's own group constructor under
``group_name`` (which prefixes the keys again). This
is apart from any default process group, so the trainer's FSDP group is untouched; a group name
can be used again in a process once :func:`leave_group` has destroyed the old group. ``gloo``
moves CPU tensors (tested here between processes on loopback, also against SGLang's own function
in ``tests/engine_pool/test_sglang_conformance.py``); ``nccl`` moves CUDA tensors between GPU
processes (the same calls; not run on these machines, which have no GPU).

:class:`WeightUpdateGroup` is the trainer's side; :func:`join_group`, :func:`receive` and
:func:`leave_group` are the server's (``agentrl serve`` uses them).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    Backend,
    GroupName,
    PrefixStore,
    _new_process_group_helper,
    _world,
)

DEFAULT_GROUP = "weight_update_group"
DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)


def join_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    *,
    group_name: str = DEFAULT_GROUP,
    backend: str = "gloo",
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> dist.ProcessGroup:
    """Join (blocking until all ``world_size`` ranks have) a group used only for weight updates.

    Rank 0 hosts the TCP store. The keys are SGLang's (see the module docstring).
    """
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs a CUDA device; use 'gloo' on CPU engines")
    if not group_name:
        raise ValueError("group_name must not be empty")
    # the TCP store that rendezvous("tcp://...") makes, made here: under torchrun, rendezvous()
    # would make every rank a client of the torchrun agent's store (TORCHELASTIC_USE_AGENT_STORE)
    store = dist.TCPStore(
        master_address,
        master_port,
        world_size,
        is_master=rank == 0,
        timeout=timeout,
        multi_tenant=True,
    )
    group, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        PrefixStore(group_name, store),
        group_name=GroupName(group_name),
        backend_options=None,
        timeout=timeout,
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}  # group rank = global rank
    return group


def leave_group(group: dist.ProcessGroup) -> None:
    """Destroy a group made by :func:`join_group` (its name may then be used again)."""
    dist.destroy_process_group(group)


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
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    ) -> WeightUpdateGroup:
        """Form the group: rank 0 here, then each engine's TP ranks in order.

        Engine ``i`` joins with ``rank_offset = 1 + (TP sizes of engines 0..i-1)`` and its server
        puts TP rank ``r`` at ``rank_offset + r``, as SGLang does; an engine's ``tp_size``
        attribute (1 when absent) says how many ranks it takes.
        """
        sizes = [int(getattr(engine, "tp_size", 1)) for engine in engines]
        world_size = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(engines))]
        master = asyncio.to_thread(
            join_group,
            master_address,
            master_port,
            0,
            world_size,
            group_name=group_name,
            backend=backend,
            timeout=timeout,
        )
        joins = [
            engine.init_weights_update_group(
                master_address,
                master_port,
                offset,
                world_size,
                group_name=group_name,
                backend=backend,
            )
            for engine, offset in zip(engines, offsets, strict=True)
        ]
        group, *_ = await asyncio.gather(master, *joins)
        return cls(engines, group, group_name)

    async def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Send the tensors to every engine (one broadcast each) and set ``version`` on them.

        Raises when a send or a server fails (a member died, or refused the update); the group is
        then unusable: leave it (:func:`leave_group` on ``self.group``) and form a new one."""
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
        sending = asyncio.to_thread(self._send, [tensor for _, tensor in tensors])
        sends, *pending = [asyncio.ensure_future(call) for call in (sending, *posts)]
        try:
            await asyncio.gather(sends, *pending)
        except BaseException:
            # a send cannot be interrupted: it ends when its peers fail or the group times out
            await asyncio.wait([sends])
            for post in pending:
                post.cancel()  # servers waiting for the rest stay in their receive until timeout
            await asyncio.gather(sends, *pending, return_exceptions=True)
            raise

    async def close(self, engines: Sequence[Any] | None = None) -> None:
        """Have every engine (or those of ``engines`` in the group: the ones still up) leave the
        group, then leave it here (the name is free again). Raises the first error of a server's
        leave, once every leave has ended and this side has left."""
        leaves = [
            engine.destroy_weights_update_group(self.group_name)
            for engine in self.engines
            if hasattr(engine, "destroy_weights_update_group")
            and (engines is None or engine in engines)
        ]
        try:
            results = await asyncio.gather(*leaves, return_exceptions=True)
        finally:
            leave_group(self.group)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _send(self, tensors: list[torch.Tensor]) -> None:
        for tensor in tensors:
            _broadcast(self.group, tensor)


def _broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> None:
    dist.broadcast(tensor, src=0, group=group)  # as SGLang's receive_weights_from_distributed
