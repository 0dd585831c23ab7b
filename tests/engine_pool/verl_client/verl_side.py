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
"get", "endpoint"}``. stdout: one JSON result per call, ``{"ok": true, "response"}`` or ``{"ok":
false, "status", "logged"}`` (the error body as verl logs it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
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
