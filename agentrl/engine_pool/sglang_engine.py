"""``SGLangEngine``: the :class:`~agentrl.engine_pool.engine.Engine` protocol over SGLang's HTTP API.

It talks to a real SGLang server (``python -m sglang.launch_server ...``, token ids in and out) or
to ``agentrl serve``, which behaves the same where this client depends on it
(:mod:`agentrl.engine_pool.server`). It can attach to a URL or launch the server as a subprocess
and wait until ``/health_generate`` answers. ``start()`` reads ``/model_info`` and
``/server_info`` to learn the server's weight version, TP size and the flags below.

What SGLang does and how this client meets it (SGLang 0.5.23's source; ``docs/sglang_http_api.md``
lists the supported versions and what differs between them):

* **Aborts.** SGLang's HTTP layer looks an ``rid`` up exactly and drops an unknown one, so a
  session cannot be aborted by prefix. Each request's ``rid`` is ``<quoted session id>:<uuid>``,
  the client keeps the rids it has in flight per session, and ``abort(session_id)`` aborts each
  one, then once more for those still running a moment later (an abort that overtakes its request
  finds no rid). A request whose POST reaches the server after that may finish normally.
* **Weight-update sessions.** Tensor and broadcast updates must run between
  ``/begin_weight_update`` and ``/end_weight_update`` (SGLang 0.5.21+). The client opens the
  session at the first update after ``pause()`` and closes it in ``resume()`` (around the one call
  when not paused). Servers without the routes (404) are updated without one.
* **Pause and cache flush.** After new weights, SGLang's KV cache (its prefix cache included) holds
  entries computed by the old ones, and a flush is refused while requests run. A refused flush
  inside an update call fails it (0.5.22+) or kills the scheduler by an assertion (0.5.21 and
  older), so updates send ``flush_cache: false`` and the client flushes once with ``/flush_cache``
  in ``resume()`` (right after the update when not paused), where a refusal is harmless.
  ``pause_mode="retract"`` (the default) moves running requests back to the queue; while paused,
  SGLang 0.5.21+ (and 0.5.6-0.5.9) ignores the queue for the flush, so it succeeds, and the
  requests' KV is recomputed with the new weights on resume; their tokens are kept.
  ``pause_mode="in_place"`` keeps running requests and their KV: cheaper, but the flush is refused
  and KV computed by the old weights is reused. Each refused flush is counted in
  ``unflushed_updates`` and, in retract mode, warned about.
* **Sessions.** ``end_session`` sends nothing: SGLang's radix cache evicts by LRU on its own and
  has no route to free one session's prefix.
* **Health.** ``/health_generate`` generates a token, and so does ``/health`` by default
  (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``), so both wait while the server is paused and
  answer 503 after 20 s. While this client has the server paused, :meth:`healthy` asks
  ``/model_info`` (answered without generating) instead, so a pool never evicts an engine for
  being paused.
* **Generation.** ``ignore_eos`` also turns off ``stop_token_ids`` in SGLang, so a request with
  both is refused (``ValueError``). Stop strings are sent with ``no_stop_trim`` (the ids are never
  trimmed; the text keeps the match); a server started with ``--skip-tokenizer-init`` cannot match
  them, so such a request to one is refused (``ValueError``). ``sampling_seed`` is ignored unless the server runs with
  ``--enable-deterministic-inference``: a seeded request to such a server is refused, or sent
  without its seed when ``ignore_seeds=True``. The context length is ``/server_info``'s
  ``context_length`` when set, else ``max_req_input_len + 1``; a prompt that fills it is refused
  and ``max_new_tokens`` is cut to the room left, as the embedded engine does (SGLang answers 400
  otherwise, or with ``--allow-auto-truncate`` cuts the prompt, which would break token
  exactness).
* **Versions.** SGLang 0.5.6 and newer (``/model_info``, ``/server_info``, pause modes); older
  servers are refused at ``start()``. What differs between releases is in
  ``docs/sglang_http_api.md``.
* **Tensor payloads.** ``tensor_format="sglang"`` (the default for SGLang servers) sends one
  ``ForkingPickler`` dump per TP rank with SGLang's device naming
  (:func:`~agentrl.engine_pool.sglang_api.sglang_tensor_payloads`): tensors travel by reference,
  so the server must be on the same machine (colocated engines; ``agentrl serve`` reads them
  too). ``"agentrl"`` (the default for ``agentrl serve``) sends a portable copy (base64 of
  ``torch.save``), which SGLang's restricted unpickler refuses. Remote SGLang servers are updated from disk or by broadcast.

Errors: a request the server refuses (HTTP 400) raises ``ValueError`` with the server's message,
as :class:`LocalEngine` does for bad input. A server that cannot be reached, answers 5xx, times
out, or sends a response of the wrong shape raises :class:`EngineError` naming the URL, so a pool
can retry the request elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    sglang_tensor_payloads,
)

TensorFormat = Literal["auto", "agentrl", "sglang"]
OLDEST_SGLANG = (0, 5, 6)
PauseMode = Literal["retract", "in_place"]
_ABORT_AGAIN_AFTER_S = 0.2


@dataclasses.dataclass(frozen=True)
class ServerFacts:
    """What ``/server_info`` says about the server that this client depends on."""

    kind: Literal["sglang", "agentrl"]
    version: str | None = None
    """SGLang's release (``None`` for ``agentrl serve`` or when not reported)."""
    tp_size: int = 1
    deterministic: bool = False
    """``--enable-deterministic-inference``: whether ``sampling_seed`` takes effect."""
    context_length: int | None = None
    skip_tokenizer_init: bool = False
    """``--skip-tokenizer-init``: the server has no tokenizer, so it refuses stop strings."""

    @classmethod
    def from_server_info(cls, info: dict[str, Any]) -> ServerFacts:
        context = info.get("context_length")
        if not context and info.get("max_req_input_len"):  # the limit when none was set
            context = int(info["max_req_input_len"]) + 1
        return cls(
            kind="agentrl" if str(info.get("engine", "")).startswith("agentrl") else "sglang",
            version=info.get("version"),
            tp_size=int(info.get("tp_size") or 1),
            deterministic=bool(info.get("enable_deterministic_inference", False)),
            context_length=int(context) if context else None,
            skip_tokenizer_init=bool(info.get("skip_tokenizer_init", False)),
        )


class SGLangEngine:
    """One SGLang-API server as an :class:`Engine`. Use ``async with SGLangEngine(url) as e``.

    ``tensor_format`` and ``tp_size`` default to what the server reports (``"auto"``, ``None``);
    ``pause_mode``, ``ignore_seeds``: see the module docstring.
    """

    def __init__(
        self,
        url: str,
        *,
        request_timeout: float = 600.0,
        connect_timeout: float = 10.0,
        process: subprocess.Popen[bytes] | None = None,
        tensor_format: TensorFormat = "auto",
        tp_size: int | None = None,
        pause_mode: PauseMode = "retract",
        ignore_seeds: bool = False,
    ) -> None:
        if tensor_format not in ("auto", "agentrl", "sglang"):
            raise ValueError(
                f"tensor_format must be 'auto', 'agentrl' or 'sglang', got {tensor_format!r}"
            )
        if pause_mode not in ("retract", "in_place"):
            raise ValueError(f"pause_mode must be 'retract' or 'in_place', got {pause_mode!r}")
        if tp_size is not None and tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {tp_size}")
        self.url = url.rstrip("/")
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.process = process
        self.tensor_format = tensor_format
        self.tp_size = tp_size or 1
        self.pause_mode = pause_mode
        self.ignore_seeds = ignore_seeds
        self.server: ServerFacts | None = None
        self._given_tp_size = tp_size
        self._session: aiohttp.ClientSession | None = None
        self._weight_version = 0
        self._inflight: dict[str, set[str]] = {}  # session id -> rids of requests in flight
        self._paused = False
        self._update_session = False  # between /begin_weight_update and /end_weight_update
        self._no_update_sessions = False  # the server predates them (SGLang < 0.5.21)
        self._model_info_route = "/model_info"
        self._flush_due = False  # weights were loaded since the last flush
        self.unflushed_updates = 0
        """Weight updates after which the server refused to flush its KV cache."""

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    async def launch(
        cls,
        command: Sequence[str],
        url: str,
        *,
        startup_timeout: float = 600.0,
        log_path: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        **options: Any,
    ) -> SGLangEngine:
        """Start ``command`` (e.g. :func:`serve_command` or :func:`sglang_command`; with ``env``
        added to this process's environment), wait until ``url`` answers ``/health_generate``, and
        return the started engine that owns the process. On Linux the server is killed when the
        thread that launched it dies, even by ``SIGKILL`` (:func:`die_with_parent`), so a killed
        run leaves no server behind. The server does not inherit a torchrun rank's identity
        (:func:`server_environment`).

        Raises :class:`EngineError` with the log's tail when the process exits or does not
        become healthy within ``startup_timeout`` seconds.
        """
        with open(log_path or os.devnull, "ab") as log:  # the child keeps its own descriptor
            process = subprocess.Popen(
                list(command),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_environment(env),
                preexec_fn=die_with_parent(),
            )
        engine = cls(url, process=process, **options)
        try:
            await engine._wait_healthy(startup_timeout, log_path)
            return await engine.start()
        except BaseException:
            await engine.aclose()
            raise

    async def start(self) -> SGLangEngine:
        """Open the HTTP session and read the server's weight version and facts; idempotent.
        The session is closed again when that fails."""
        self._open_session()
        try:
            await self._read_server()
        except BaseException:
            if self._session is not None:
                await self._session.close()
                self._session = None
            raise
        return self

    async def _read_server(self) -> None:
        info = await self.model_info()
        self._weight_version = parse_version(info.get("weight_version"))
        facts = await self._request("GET", "/server_info", None, expect_json=True, missing_ok=True)
        if facts is None:  # SGLang before 0.5.6 has only /get_server_info
            facts = await self._request(
                "GET", "/get_server_info", None, expect_json=True, missing_ok=True
            )
        self.server = ServerFacts.from_server_info(facts if isinstance(facts, dict) else {})
        if self.server.kind == "sglang" and _older_than(self.server.version, OLDEST_SGLANG):
            raise EngineError(
                f"{self.url} runs SGLang {self.server.version}; this client needs "
                f"{'.'.join(map(str, OLDEST_SGLANG))} or newer"
            )
        if self.server.context_length is None and info.get("context_length"):
            self.server = dataclasses.replace(
                self.server, context_length=int(info["context_length"])
            )
        self.tp_size = self._given_tp_size or self.server.tp_size
        if self.tensor_format == "auto":
            self.tensor_format = "agentrl" if self.server.kind == "agentrl" else "sglang"

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
        sampling = self._as_served(sampling, len(ids))
        rid = f"{_rid_prefix(session_id)}{uuid.uuid4().hex}"
        key = session_id or ""
        self._inflight.setdefault(key, set()).add(rid)
        try:
            body = await self._post("/generate", generate_request(ids, sampling, rid))
        finally:
            rids = self._inflight[key]
            rids.discard(rid)
            if not rids:
                del self._inflight[key]
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
        if self.tensor_format == "sglang":
            payloads = await asyncio.to_thread(sglang_tensor_payloads, tensors, self.tp_size)
        else:
            payloads = [await asyncio.to_thread(encode_named_tensors, tensors)] * self.tp_size
        body = {"serialized_named_tensors": payloads, **self._update_fields(version)}
        await self._in_update_session("/update_weights_from_tensor", body, version)
        await self._flush_unless_paused()

    async def update_weights_from_disk(self, model_path: str | Path, version: int) -> None:
        """Have the server load the safetensors weights at ``model_path`` and set ``version``
        (no weight-update session needed)."""
        body = {"model_path": str(model_path), **self._update_fields(version)}
        await self._update("/update_weights_from_disk", body, version)
        await self._flush_unless_paused()

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
        its TP ranks take ``rank_offset .. rank_offset + tp_size - 1``. The trainer's side is
        :class:`~agentrl.engine_pool.weight_group.WeightUpdateGroup`."""
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

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        """Have the server leave the group (``/destroy_weights_update_group``)."""
        answer = await self._post("/destroy_weights_update_group", {"group_name": group_name})
        if not isinstance(answer, dict) or not answer.get("success"):
            raise EngineError(f"{self.url}/destroy_weights_update_group: {error_message(answer)}")

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
        ``version``; rank 0 must broadcast the tensors while this call is in flight. The
        weight-update session is opened first: without one the server receives nothing and the
        broadcast would wait."""
        body = {
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "group_name": group_name,
            **self._update_fields(version),
        }
        await self._in_update_session("/update_weights_from_distributed", body, version)
        await self._flush_unless_paused()

    async def pause(self) -> None:
        """Stop generating (``pause_mode``) until :meth:`resume`; requests keep their tokens."""
        await self._post("/pause_generation", {"mode": self.pause_mode})
        self._paused = True

    async def resume(self) -> None:
        """Close an open weight-update session, flush the KV cache after new weights, then
        continue generating."""
        if self._update_session:
            await self._end_update_session()
        await self._flush_after_update()
        await self._post("/continue_generation", {})
        self._paused = False

    async def abort(self, session_id: str | None = None) -> None:
        """Abort every request (``None``) or this client's in-flight requests of one session."""
        if session_id is None:
            await self._post("/abort_request", {"abort_all": True}, expect_json=False)
            return
        rids = set(self._inflight.get(session_id, ()))
        if not rids:
            return
        await self._abort_rids(rids)
        await asyncio.sleep(_ABORT_AGAIN_AFTER_S)  # for a request that its abort overtook
        await self._abort_rids(rids & self._inflight.get(session_id, set()))

    async def end_session(self, session_id: str) -> None:
        """Nothing to tell the server: SGLang's radix cache (and ``agentrl serve``'s prefix
        cache) evict least-recently-used entries on their own, and SGLang's HTTP API has no
        route that frees one request's prefix."""

    # -- the rest of the API -----------------------------------------------------------------

    async def flush_cache(self) -> None:
        """Empty the server's KV cache; ``ValueError`` when it refuses (requests running)."""
        await self._post("/flush_cache", {}, expect_json=False)

    async def model_info(self) -> dict[str, Any]:
        """``/model_info``, or ``/get_model_info`` on servers that predate it."""
        info = await self._request(
            "GET", self._model_info_route, None, expect_json=True, missing_ok=True
        )
        if info is None and self._model_info_route == "/model_info":
            self._model_info_route = "/get_model_info"
            return await self.model_info()
        if not isinstance(info, dict):
            raise EngineError(f"{self.url}{self._model_info_route}: not a JSON object: {info!r}")
        return info

    async def get_weights_by_name(self, name: str, truncate_size: int = 100) -> torch.Tensor:
        """The first ``truncate_size`` rows of the server's weight ``name`` as float32
        (``/get_weights_by_name``): to check what a weight sync delivered."""
        rows = await self._post(
            "/get_weights_by_name", {"name": name, "truncate_size": truncate_size}
        )
        return torch.tensor(rows, dtype=torch.float32)

    async def server_info(self) -> dict[str, Any]:
        return await self._get("/server_info")

    async def healthy(self, timeout: float = 5.0) -> bool:
        """Whether the server answers its health check (200) within ``timeout`` seconds:
        ``/health_generate`` (one generated token), or ``/model_info`` while paused by this
        client (a generation would wait for ``resume``)."""
        route = self._model_info_route if self._paused else "/health_generate"
        limit = aiohttp.ClientTimeout(total=timeout)
        try:  # on the engine's own session: a probe every few seconds reuses its connections
            async with self._open_session().get(f"{self.url}{route}", timeout=limit) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    # -- generation contract -----------------------------------------------------------------

    def _as_served(self, sampling: SamplingParams, prompt_tokens: int) -> SamplingParams:
        """``sampling`` as this server can honour it, or ``ValueError`` (module docstring)."""
        facts = self.server or ServerFacts(kind="sglang")
        if sampling.ignore_eos and sampling.stop_token_ids:
            raise ValueError(
                "SGLang's ignore_eos also turns off stop_token_ids: send one of them, not both"
            )
        if sampling.stop and facts.skip_tokenizer_init:
            raise ValueError(
                f"{self.url} runs with --skip-tokenizer-init and so cannot match stop strings "
                f"{list(sampling.stop)}: start it without that flag (agentrl's launchers do)"
            )
        if sampling.seed is not None and not facts.deterministic:
            if not self.ignore_seeds:
                raise ValueError(
                    f"{self.url} ignores sampling seeds: start it with "
                    "--enable-deterministic-inference, or use SGLangEngine(ignore_seeds=True) "
                    "to sample without them"
                )
            sampling = dataclasses.replace(sampling, seed=None)
        context = facts.context_length
        if context is not None:
            room = context - prompt_tokens
            if room < 1:
                raise ValueError(
                    f"the prompt has {prompt_tokens} tokens; the model's context holds {context}"
                )
            if sampling.max_new_tokens > room:
                sampling = dataclasses.replace(sampling, max_new_tokens=room)
        return sampling

    # -- weight updates ----------------------------------------------------------------------

    @staticmethod
    def _update_fields(version: int) -> dict[str, Any]:
        # never flush inside the update: a refusal there fails it or kills the scheduler
        return {"weight_version": str(version), "flush_cache": False}

    async def _flush_unless_paused(self) -> None:
        if not self._paused:  # otherwise resume() flushes, once for every bucket of a sync
            await self._flush_after_update()

    async def _flush_after_update(self) -> None:
        if not self._flush_due:
            return
        self._flush_due = False
        try:
            await self.flush_cache()
        except ValueError as exc:
            self.unflushed_updates += 1
            if self.pause_mode == "retract":
                warnings.warn(
                    f"{self.url} kept KV computed by the previous weights: {exc}", stacklevel=3
                )

    async def _in_update_session(self, route: str, body: dict[str, Any], version: int) -> None:
        """The update in a weight-update session, closed after it unless paused (``resume``
        closes it then, so one session spans every bucket of a sync)."""
        try:
            await self._begin_update_session()
            await self._update(route, body, version)
        finally:
            if not self._paused and self._update_session:
                await self._end_update_session()

    async def _begin_update_session(self) -> None:
        if self._update_session or self._no_update_sessions:
            return
        answer = await self._session_call("/begin_weight_update")
        if answer is None:  # 404: the server predates sessions and updates without them
            self._no_update_sessions = True
            return
        if not answer.get("success") and "already open" in str(answer.get("message")):
            # left open by a client that died mid-update: this client owns the server's updates
            await self._session_call("/end_weight_update")
            answer = await self._session_call("/begin_weight_update") or {}
        if not answer.get("success"):
            raise EngineError(f"{self.url}/begin_weight_update: {error_message(answer)}")
        self._update_session = True

    async def _end_update_session(self) -> None:
        self._update_session = False
        answer = await self._session_call("/end_weight_update") or {"success": True}
        if not answer.get("success"):
            raise EngineError(f"{self.url}/end_weight_update: {error_message(answer)}")

    async def _session_call(self, route: str) -> dict[str, Any] | None:
        answer = await self._request("POST", route, {}, expect_json=True, missing_ok=True)
        if answer is not None and not isinstance(answer, dict):
            raise EngineError(f"{self.url}{route}: not a JSON object: {answer!r}")
        return answer

    async def _update(self, route: str, body: dict[str, Any], version: int) -> None:
        answer = await self._post(route, body)
        if not isinstance(answer, dict) or not answer.get("success"):
            raise EngineError(f"{self.url}{route} failed: {error_message(answer)}")
        self._weight_version = version
        self._flush_due = True

    async def _abort_rids(self, rids: Iterable[str]) -> None:
        aborts = [
            self._post("/abort_request", {"rid": rid}, expect_json=False) for rid in sorted(rids)
        ]
        await asyncio.gather(*aborts)

    # -- HTTP ---------------------------------------------------------------------------------

    async def _get(self, route: str) -> Any:
        return await self._request("GET", route, None, expect_json=True)

    async def _post(self, route: str, body: Any, *, expect_json: bool = True) -> Any:
        return await self._request("POST", route, body, expect_json=expect_json)

    async def _request(
        self, method: str, route: str, body: Any, *, expect_json: bool, missing_ok: bool = False
    ) -> Any:
        """The parsed answer; ``None`` for a 404 when ``missing_ok`` (a route the server lacks)."""
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
        if status == 404 and missing_ok:
            return None
        parsed: Any = text
        if text and (expect_json or status >= 400):
            try:
                parsed = json.loads(text)
            except ValueError:
                if expect_json:
                    raise EngineError(f"{where}: HTTP {status}, not JSON: {text[:200]!r}") from None
        if status == 400 and route in ("/generate", "/flush_cache"):
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


_PR_SET_PDEATHSIG = 1
_LAUNCHER_VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip


def server_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a server it starts, with ``extra`` added and without what
    torchrun sets for its ranks (``RANK``, ``MASTER_PORT``, ``TORCHELASTIC_*``, ...): a server
    started by a training rank is not that rank, and torch would otherwise, for one, make its
    process groups clients of the torchrun agent's store."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in _LAUNCHER_VARIABLES and not name.startswith("TORCHELASTIC_")
    }
    return {**environment, **(extra or {})}


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that has the child receive ``SIGKILL`` when
    its parent dies (Linux's ``PR_SET_PDEATHSIG``; ``None`` elsewhere).

    The kernel sends the signal when the *thread* that forked the child exits, so call ``Popen``
    from a thread that lives as long as the child should (the event loop's). ``prctl`` is looked up
    here, before the fork: the child must not load libraries between fork and exec.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl: nothing will signal us
            os._exit(1)

    return set_death_signal


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (for a server or a process group to bind)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
    """The argv of ``python -m sglang.launch_server``. The server keeps its tokenizer (no
    ``--skip-tokenizer-init``) because stop strings need it; requests still send token ids and
    read the output ids, so nothing is re-tokenized."""
    return [
        sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
        "--host", host, "--port", str(port), "--tp-size", str(tp_size), *extra,
    ]  # fmt: skip


def _rid_prefix(session_id: str | None) -> str:
    # quote() leaves no ":" in the session part, so one session's prefix never matches another's
    return f"{quote(session_id or '', safe='')}:"


def _older_than(version: str | None, oldest: tuple[int, ...]) -> bool:
    numbers = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    return numbers is not None and tuple(map(int, numbers.groups())) < oldest


def _log_tail(log_path: str | Path | None) -> str:
    if not log_path:
        return ""
    with contextlib.suppress(OSError):
        tail = Path(log_path).read_bytes()[-2000:].decode(errors="replace")
        return f"; log tail:\n{tail}"
    return ""
