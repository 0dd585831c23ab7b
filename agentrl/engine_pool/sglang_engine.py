"""``SGLangEngine``: the :class:`~agentrl.engine_pool.engine.Engine` protocol over SGLang's HTTP API.

It talks to a real SGLang server (``python -m sglang.launch_server ... --skip-tokenizer-init``) or
to ``agentrl serve``, which speaks the same subset (:mod:`agentrl.engine_pool.sglang_api`). It can
attach to a URL or launch the server as a subprocess and wait until ``/health_generate`` answers.

Errors: a request the server refuses (HTTP 400) raises ``ValueError`` with the server's message,
as :class:`LocalEngine` does for bad input. A server that cannot be reached, answers 5xx, times
out, or sends a response of the wrong shape raises :class:`EngineError` naming the URL, so a pool
can retry the request elsewhere.

Each request's SGLang ``rid`` is ``<quoted session id>:<uuid>``; ``abort(session_id)`` aborts by
the prefix ``<quoted session id>:`` (SGLang matches rids by prefix), which reaches exactly that
session's requests. Weight updates go by tensor (``update_weights``), by disk
(:meth:`update_weights_from_disk`, a directory both sides can read) or by broadcast
(:meth:`update_weights_from_distributed`). The tensor payload has two formats
(``tensor_format``): ``"agentrl"`` (what ``agentrl serve`` reads: base64 of ``torch.save``, any
process) and ``"sglang"`` (what an SGLang server reads: base64 of a ``ForkingPickler`` dump, as
SGLang's ``MultiprocessingSerializer.serialize(..., output_str=True)``, one entry per TP rank; CUDA
tensors travel as IPC handles, so the sender must be on the same machine and keep them alive until
the call returns: colocated engines).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import torch

from agentrl.engine_pool.engine import EngineError, GenerateResult, SamplingParams
from agentrl.engine_pool.sglang_api import (
    ProtocolError,
    encode_named_tensors,
    error_message,
    generate_request,
    parse_generate_response,
    parse_version,
    sglang_tensor_payload,
)


class SGLangEngine:
    """One SGLang-API server as an :class:`Engine`. Use ``async with SGLangEngine(url) as e``."""

    def __init__(
        self,
        url: str,
        *,
        request_timeout: float = 600.0,
        connect_timeout: float = 10.0,
        process: subprocess.Popen[bytes] | None = None,
        tensor_format: Literal["agentrl", "sglang"] = "agentrl",
        tp_size: int = 1,
    ) -> None:
        if tensor_format not in ("agentrl", "sglang"):
            raise ValueError(f"tensor_format must be 'agentrl' or 'sglang', got {tensor_format!r}")
        self.tensor_format = tensor_format
        self.tp_size = tp_size
        self.url = url.rstrip("/")
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.process = process
        self._session: aiohttp.ClientSession | None = None
        self._weight_version = 0

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    async def launch(
        cls,
        command: Sequence[str],
        url: str,
        *,
        startup_timeout: float = 600.0,
        log_path: str | Path | None = None,
        **options: Any,
    ) -> SGLangEngine:
        """Start ``command`` (e.g. :func:`serve_command` or :func:`sglang_command`), wait until
        ``url`` answers ``/health_generate``, and return the started engine that owns the process.

        Raises :class:`EngineError` with the log's tail when the process exits or does not
        become healthy within ``startup_timeout`` seconds.
        """
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT)
        engine = cls(url, process=process, **options)
        try:
            await engine._wait_healthy(startup_timeout, log_path)
            return await engine.start()
        except BaseException:
            await engine.aclose()
            raise
        finally:
            if log is not subprocess.DEVNULL:
                log.close()

    async def start(self) -> SGLangEngine:
        """Open the HTTP session and read the server's weight version; idempotent."""
        self._open_session()
        info = await self.model_info()
        self._weight_version = parse_version(info.get("weight_version"))
        return self

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(
                total=self.request_timeout, sock_connect=self.connect_timeout
            )
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def __aenter__(self) -> SGLangEngine:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP session and stop the server process if this engine launched it."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                await asyncio.to_thread(self.process.wait, 10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                await asyncio.to_thread(self.process.wait)

    # -- the Engine protocol -----------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._weight_version

    async def generate(
        self, input_ids: Sequence[int], sampling: SamplingParams, session_id: str | None = None
    ) -> GenerateResult:
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        ids = [int(token) for token in input_ids]
        rid = f"{_rid_prefix(session_id)}{uuid.uuid4().hex}"
        body = await self._post("/generate", generate_request(ids, sampling, rid))
        try:
            result = parse_generate_response(body, len(ids))
        except ProtocolError as exc:
            raise EngineError(f"{self.url}/generate: {exc}") from None
        self._weight_version = max(self._weight_version, result.weight_version)
        return result

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Send the tensors in one ``/update_weights_from_tensor`` call and set ``version``."""
        tensors = list(named_tensors)
        encode = sglang_tensor_payload if self.tensor_format == "sglang" else encode_named_tensors
        payload = await asyncio.to_thread(encode, tensors)
        body = {
            "serialized_named_tensors": [payload] * self.tp_size,
            "weight_version": str(version),
        }
        await self._update("/update_weights_from_tensor", body, version)

    async def update_weights_from_disk(self, model_path: str | Path, version: int) -> None:
        """Have the server load the safetensors weights at ``model_path`` and set ``version``."""
        body = {"model_path": str(model_path), "weight_version": str(version)}
        await self._update("/update_weights_from_disk", body, version)

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
        """Have the server join a weight-update process group (it blocks until all ranks join);
        the trainer's side is :class:`~agentrl.engine_pool.weight_group.WeightUpdateGroup`."""
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        answer = await self._post("/init_weights_update_group", body)
        if not isinstance(answer, dict) or not answer.get("success"):
            raise EngineError(f"{self.url}/init_weights_update_group: {error_message(answer)}")

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        version: int,
        *,
        group_name: str = "weight_update_group",
    ) -> None:
        """Have the server receive one broadcast per name from rank 0 of the group, then set
        ``version``; rank 0 must broadcast the tensors while this call is in flight."""
        body = {
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "group_name": group_name,
            "weight_version": str(version),
        }
        await self._update("/update_weights_from_distributed", body, version)

    async def pause(self) -> None:
        """Hold running requests in place (``mode: in_place``) until :meth:`resume`."""
        await self._post("/pause_generation", {"mode": "in_place"})

    async def resume(self) -> None:
        await self._post("/continue_generation", {})

    async def abort(self, session_id: str | None = None) -> None:
        if session_id is None:
            await self._post("/abort_request", {"abort_all": True}, expect_json=False)
        else:
            await self._post("/abort_request", {"rid": _rid_prefix(session_id)}, expect_json=False)

    # -- the rest of the API -----------------------------------------------------------------

    async def flush_cache(self) -> None:
        await self._post("/flush_cache", {}, expect_json=False)

    async def model_info(self) -> dict[str, Any]:
        # /get_model_info: present in every SGLang release (an alias of /model_info since 0.5.x)
        return await self._get("/get_model_info")

    async def server_info(self) -> dict[str, Any]:
        return await self._get("/server_info")

    async def healthy(self, timeout: float = 5.0) -> bool:
        """Whether ``/health_generate`` answers 200 within ``timeout`` seconds."""
        limit = aiohttp.ClientTimeout(total=timeout)
        try:  # on the engine's own session: a probe every few seconds reuses its connections
            async with self._open_session().get(
                f"{self.url}/health_generate", timeout=limit
            ) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    # -- HTTP ---------------------------------------------------------------------------------

    async def _update(self, route: str, body: dict[str, Any], version: int) -> None:
        answer = await self._post(route, body)
        if not isinstance(answer, dict) or not answer.get("success"):
            raise EngineError(f"{self.url}{route} failed: {error_message(answer)}")
        self._weight_version = version

    async def _get(self, route: str) -> Any:
        return await self._request("GET", route, None, expect_json=True)

    async def _post(self, route: str, body: Any, *, expect_json: bool = True) -> Any:
        return await self._request("POST", route, body, expect_json=expect_json)

    async def _request(self, method: str, route: str, body: Any, *, expect_json: bool) -> Any:
        if self._session is None:
            raise EngineError(f"SGLangEngine({self.url}) is not started: use `async with`")
        where = f"{self.url}{route}"
        try:
            async with self._session.request(method, where, json=body) as response:
                text = await response.text()
                status = response.status
        except TimeoutError:
            raise EngineError(f"{where}: no answer within {self.request_timeout:g} s") from None
        except aiohttp.ClientError as exc:
            raise EngineError(f"{where}: {type(exc).__name__}: {exc}") from None
        parsed: Any = text
        if text and (expect_json or status >= 400):
            try:
                parsed = json.loads(text)
            except ValueError:
                if expect_json or status == 400:
                    raise EngineError(f"{where}: HTTP {status}, not JSON: {text[:200]!r}") from None
        if status == 400 and route == "/generate":
            raise ValueError(f"{where} refused the request: {error_message(parsed)}")
        if status >= 400 and not (
            status == 400 and isinstance(parsed, dict) and "success" in parsed
        ):
            raise EngineError(f"{where}: HTTP {status}: {error_message(parsed)}")
        return parsed

    async def _wait_healthy(self, timeout: float, log_path: str | Path | None) -> None:
        deadline = time.monotonic() + timeout
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineError(
                    f"the server for {self.url} exited with code {self.process.returncode}"
                    f"{_log_tail(log_path)}"
                )
            if await self.healthy():
                return
            await asyncio.sleep(0.5)
        raise EngineError(f"{self.url} was not healthy after {timeout:g} s{_log_tail(log_path)}")


def serve_command(
    model: str, port: int, *, host: str = "127.0.0.1", max_batch_size: int = 32
) -> list[str]:
    """The argv that runs ``agentrl serve`` with this interpreter."""
    return [
        sys.executable, "-m", "agentrl.cli", "serve", model,
        "--host", host, "--port", str(port), "--max-batch-size", str(max_batch_size),
    ]  # fmt: skip


def sglang_command(
    model_path: str,
    port: int,
    *,
    host: str = "127.0.0.1",
    tp_size: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv of ``python -m sglang.launch_server`` for token-id requests (no tokenizer)."""
    return [
        sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
        "--host", host, "--port", str(port), "--tp-size", str(tp_size),
        "--skip-tokenizer-init", *extra,
    ]  # fmt: skip


def _rid_prefix(session_id: str | None) -> str:
    # quote() leaves no ":" in the session part, so one session's prefix never matches another's
    return f"{quote(session_id or '', safe='')}:"


def _log_tail(log_path: str | Path | None) -> str:
    if not log_path:
        return ""
    with contextlib.suppress(OSError):
        tail = Path(log_path).read_bytes()[-2000:].decode(errors="replace")
        return f"; log tail:\n{tail}"
    return ""
