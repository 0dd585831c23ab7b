"""verl 0.9.1's own SGLang HTTP client (``AsyncHttpServerAdapter``) driving an already running server.

Run by the SGLang venv's interpreter (``.venv-sglang/bin/python``): verl's
``verl/workers/rollout/sglang_rollout/http_server_engine.py`` imports SGLang at module level
(``EngineBase``, ``launch_server``, ``ServerArgs``, ``UpdateWeightsFromTensorReqInput``), and only
``.venv-sglang`` has SGLang 0.5.23; verl itself and its ``ray``/``tensordict`` come from
``.venv-verl``'s site-packages, appended to ``sys.path`` after SGLang's own (so SGLang's
dependencies win where both venvs have a package). SGLang's two torchvision users are loaded with
the conformance harness's placeholder (``sglang_conformance/sglang_side.py``; nothing here reaches
them). The project's tests spawn this script and never import it.

How verl is pointed at a running server: ``launch_server=False`` with ``host``/``port`` (its
``__init__`` then starts nothing; ``ServerArgs(**kwargs)`` only records them). verl 0.9.1's adapter
is abstract against SGLang 0.5.23's ``EngineBase`` (``begin_weight_update``/``end_weight_update``
were added there), so it cannot be instantiated as shipped: :class:`Adapter` adds those two, each
one ``_make_async_request`` to the route of the same name, nothing else.

stdin: ``{"url", "model_path", "input_ids", "calls": [...]}``; each call is
``{"op": "generate", "sampling_params", "return_logprob"}`` or ``{"op": "flush_cache" |
"abort_all" | "available_models" | "begin_weight_update" | "end_weight_update"}`` or ``{"op":
"get", "endpoint"}`` or ``{"op": "post", "endpoint", "payload"}`` or ``{"op": "update_weights",
"names", "scale", "load_format"?}`` (:func:`update_weights`). stdout: one JSON result per call, ``{"ok": true, "response"}`` or ``{"ok":
false, "status", "logged"}`` (the error body as verl logs it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parent / "sglang_conformance"))
import sglang_side  # noqa: E402  (the torchvision placeholder, installed before SGLang is imported)

sglang_side._install_placeholder()
sys.path.append(str(next((ROOT / ".venv-verl" / "lib").glob("python3.*")) / "site-packages"))

import aiohttp  # noqa: E402
from verl.workers.rollout.sglang_rollout.http_server_engine import (  # noqa: E402
    AsyncHttpServerAdapter,
)


class Adapter(AsyncHttpServerAdapter):
    """verl's adapter plus the two methods SGLang 0.5.23's ``EngineBase`` added."""

    async def begin_weight_update(self, selector: str = "all") -> dict[str, Any]:
        return await self._make_async_request("begin_weight_update", {})

    async def end_weight_update(self) -> dict[str, Any]:
        return await self._make_async_request("end_weight_update", {})


class _Bodies(logging.Handler):
    """The error bodies verl logs (``_log_error_body``): its exception carries only the status."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _start_shm_manager_detached() -> None:
    """Start torch's shared-memory manager (the daemon that ``file_system`` sharing spawns on
    first use, which outlives this process while the server holds its memory) with /dev/null
    for stdout and stderr, so that it does not hold the test's pipes open."""
    import torch

    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        torch.zeros(1).share_memory_()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


async def update_weights(adapter: Adapter, model_path: Path, call: dict[str, Any]) -> Any:
    """The saved weights ``call["names"]`` times ``call["scale"]``, sent by reference as verl
    sends them (``sglang.srt.weight_sync.utils.update_weights`` over a one-rank ``infer_tp``
    mesh: one dump per tensor inside ``LocalSerializedTensor``) or, with ``load_format:
    "flattened_bucket"``, as slime does (SGLang's ``FlattenedTensorBucket``). CPU tensors go by
    file name (``file_system``): a descriptor reaches only the sender's children."""
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file
    from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
    from sglang.srt.weight_sync.utils import update_weights as sgl_update_weights
    from torch.distributed.device_mesh import init_device_mesh

    torch.multiprocessing.set_sharing_strategy("file_system")
    _start_shm_manager_detached()
    saved = {k: v for file in model_path.glob("*.safetensors") for k, v in load_file(file).items()}
    named = [(name, saved[name] * call["scale"]) for name in call["names"]]
    if call.get("load_format") == "flattened_bucket":
        bucket = FlattenedTensorBucket(named_tensors=named)
        data = {
            "flattened_tensor": bucket.get_flattened_tensor(),
            "metadata": bucket.get_metadata(),
        }
        request = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=[MultiprocessingSerializer.serialize(data)],
            load_format="flattened_bucket",
        )
        return await adapter.update_weights_from_tensor(request)
    # SGLang's helper first patches torch's reducer to name CUDA devices by UUID, and the patch
    # indexes an argument only CUDA tensors have (IndexError on CPU ones; verl moves tensors to
    # its GPU first). Marking the patch as applied keeps torch's own reducer for CPU tensors and
    # runs the helper's code unchanged.
    from torch.multiprocessing import reductions

    if not hasattr(reductions, "_reduce_tensor_original"):
        reductions._reduce_tensor_original = reductions.reduce_tensor
    if not dist.is_initialized():
        store = tempfile.mktemp(prefix="verl-side-store-")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("infer_tp",))
    return await sgl_update_weights(adapter, named, "infer_tp", mesh)


async def run(spec: dict[str, Any]) -> list[dict[str, Any]]:
    bodies = _Bodies()
    logging.getLogger(AsyncHttpServerAdapter.__module__).addHandler(bodies)
    url = urlparse(spec["url"])
    adapter = Adapter(
        launch_server=False,
        host=url.hostname,
        port=url.port,
        model_path=spec["model_path"],
        max_attempts=1,
        timeout=120,
    )
    results = []
    for call in spec["calls"]:
        op = call["op"]
        bodies.messages.clear()
        try:
            if op == "generate":
                response = await adapter.generate(
                    input_ids=spec["input_ids"],
                    sampling_params=call["sampling_params"],
                    return_logprob=call.get("return_logprob", True),
                )
            elif op == "abort_all":
                response = await adapter.abort_request(abort_all=True)
            elif op == "get":
                response = await adapter._make_async_request(call["endpoint"], method="GET")
            elif op == "post":
                response = await adapter._make_async_request(call["endpoint"], call["payload"])
            elif op == "update_weights":
                response = await update_weights(adapter, Path(spec["model_path"]), call)
            else:
                response = await getattr(adapter, op)()
            results.append({"op": op, "ok": True, "response": response})
        except aiohttp.ClientResponseError as exc:
            logged = "\n".join(bodies.messages)
            results.append({"op": op, "ok": False, "status": exc.status, "logged": logged})
    return results


def main() -> int:
    spec = json.load(sys.stdin)
    results = asyncio.run(run(spec))
    import verl

    print(json.dumps({"verl": verl.__version__, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
