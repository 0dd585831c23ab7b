"""The trainer's end of the process-group conformance test, in a process of its own.

Run by the project's interpreter (it imports agentrl) from ``test_sglang_conformance.py``:
``python trainer_side.py '<json spec>'``. It forms a weight-update group with
:meth:`agentrl.engine_pool.weight_group.WeightUpdateGroup.create` over test-double engines that
stand in for SGLang servers (an outside system): each double's TP ranks are ``sglang_side.py
join-group`` processes in the SGLang venv, which join with SGLang's own
``init_custom_process_group``. Then it pushes one bucket with ``WeightUpdateGroup.push`` and prints
one JSON object: what was sent, what each engine was told (``rank_offset``, ``world_size``) and what
each TP rank received, or an ``error``.

Why a process: if the two sides' rendezvous do not match, the trainer's join blocks in torch's C++
code inside a worker thread for its full timeout; only ending the process ends it. So after
printing the answer this process leaves with ``os._exit`` (the test also kills its process group,
which holds the join-group processes, on every exit path).

Spec: ``{"side_python", "harness", "tp_sizes": [...], "master_port", "timeout_s", "log_dir"}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from sglang_side import describe_tensor  # this script's directory: one checksum for both sides

import agentrl
from agentrl.engine_pool.weight_group import WeightUpdateGroup


def bucket() -> list[tuple[str, torch.Tensor]]:
    """float32 and bfloat16 tensors, a non-contiguous view and a one-element tensor."""
    generator = torch.Generator().manual_seed(1234)
    base = torch.randn(6, 4, generator=generator)
    return [
        ("model.layers.0.mlp.up_proj.weight", torch.randn(8, 4, generator=generator)),
        ("model.norm.weight", torch.randn(16, generator=generator).to(torch.bfloat16)),
        ("lm_head.weight", base.t()[:, 1:5]),  # strides (1, 4): push sends it contiguous
        ("model.layers.0.scale", torch.tensor([0.125])),
    ]


class SGLangServerDouble:
    """Stands in for one SGLang server with ``tp_size`` TP ranks (an outside system).

    ``init_weights_update_group`` starts one ``sglang_side.py join-group`` process per TP rank, at
    rank ``rank_offset + tp_rank``, and returns once each reports that it joined (SGLang answers
    the HTTP call then, too); ``update_weights_from_distributed`` tells each rank to receive and
    waits for the checksums of what arrived.
    """

    def __init__(self, index: int, tp_size: int, spec: dict[str, Any]) -> None:
        self.index = index
        self.tp_size = tp_size
        self.spec = spec
        self.processes: list[asyncio.subprocess.Process] = []
        self.logs: list[Path] = []
        self.told: dict[str, Any] = {}
        self.received: list[list[dict[str, Any]]] = []

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        *,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> None:
        self.told = {
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        for tp_rank in range(self.tp_size):
            log = Path(self.spec["log_dir"]) / f"engine{self.index}-tp{tp_rank}.log"
            self.logs.append(log)
            with open(log, "wb") as stderr:
                process = await asyncio.create_subprocess_exec(
                    self.spec["side_python"],
                    self.spec["harness"],
                    "join-group",
                    "--master-address", master_address,
                    "--master-port", str(master_port),
                    "--world-size", str(world_size),
                    "--rank", str(rank_offset + tp_rank),
                    "--group-name", group_name,
                    "--backend", backend,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=stderr,
                )  # fmt: skip
            self.processes.append(process)
        events = await asyncio.gather(*(self._event(r) for r in range(self.tp_size)))
        for tp_rank, event in enumerate(events):
            if event.get("event") != "joined":
                raise RuntimeError(
                    f"engine {self.index} TP rank {tp_rank} (group rank {rank_offset + tp_rank} "
                    f"of {world_size}) did not join: {event}"
                )

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        version: int,
        *,
        group_name: str = "weight_update_group",
    ) -> None:
        line = json.dumps({"names": names, "dtypes": dtypes, "shapes": shapes}) + "\n"
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(line.encode())
            await process.stdin.drain()
        events = await asyncio.gather(*(self._event(r) for r in range(self.tp_size)))
        for tp_rank, event in enumerate(events):
            if event.get("event") != "received":
                raise RuntimeError(
                    f"engine {self.index} TP rank {tp_rank} received nothing: {event}"
                )
        self.received = [event["tensors"] for event in events]

    async def _event(self, tp_rank: int) -> dict[str, Any]:
        process = self.processes[tp_rank]
        assert process.stdout is not None
        line = await process.stdout.readline()
        if line:
            return json.loads(line)
        await process.wait()
        tail = self.logs[tp_rank].read_text(errors="replace")[-3000:]
        return {"event": "exited", "returncode": process.returncode, "stderr_tail": tail}

    def kill(self) -> None:
        for process in self.processes:
            if process.returncode is None:
                process.kill()


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    engines = [SGLangServerDouble(i, tp, spec) for i, tp in enumerate(spec["tp_sizes"])]
    timeout = float(spec["timeout_s"])
    tensors = bucket()
    result: dict[str, Any] = {
        "agentrl": str(Path(agentrl.__file__).parent),
        "sent": [describe_tensor(n, t) for n, t in tensors],
    }
    try:
        try:
            group = await asyncio.wait_for(
                WeightUpdateGroup.create(
                    engines, "127.0.0.1", int(spec["master_port"]), backend="gloo"
                ),
                timeout,
            )
        except TimeoutError:
            result["error"] = (
                f"the weight-update group did not form within {timeout:g} s: the trainer's "
                "WeightUpdateGroup.create and SGLang's init_custom_process_group (in the "
                "join-group processes) did not meet at the rendezvous (store keys, ranks or "
                "world size differ)"
            )
            return result
        try:
            await asyncio.wait_for(group.push(tensors, version=1), timeout)
        except TimeoutError:
            result["error"] = f"the broadcast did not complete within {timeout:g} s"
            return result
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    finally:
        result["engines"] = [
            {"tp_size": e.tp_size, "told": e.told, "received": e.received} for e in engines
        ]
        for engine in engines:
            engine.kill()
    return result


def main() -> None:
    spec = json.loads(sys.argv[1])
    # not asyncio.run: its shutdown waits for the default executor's threads, and a join that
    # never met its peers blocks one of them for its full timeout
    loop = asyncio.new_event_loop()
    result = loop.run_until_complete(run(spec))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
