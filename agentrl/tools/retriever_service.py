"""``agentrl retriever serve``: an index behind aiohttp, speaking Search-R1's retrieval API.

Routes:

- ``POST /retrieve``: ``{"queries": [str, ...], "topk": int, "return_scores": bool}`` in;
  ``{"result": [[{"document": doc, "score": float}, ...], ...]}`` out, one list per query, best
  first, or ``{"result": [[doc, ...], ...]}`` when ``return_scores`` is false. ``doc`` is
  ``{"id", "title", "text", "contents"}``. ``topk`` missing, null or 0 means the server's
  default, as in Search-R1's server (``search_r1/search/retrieval_server.py``), whose client
  (``search_r1/llm_agent/generation.py``) reads only ``doc["document"]["contents"]``.
- ``GET /health``: ``{"status": "ok", "kind", "documents", "batching", "batches"}`` (index
  calls made so far).

Unlike Search-R1's server, ``return_scores: false`` works for any number of queries (theirs
unpacks a result list into two names, which only works for exactly two queries).

**Batching.** Requests that arrive while a search runs are answered together: the next search
takes every query queued by then (up to ``max_batch_queries``), in one call of the index on one
worker thread. There is no waiting window, so a lone request is never delayed, and the event loop
only parses and writes JSON. ``batching=False`` searches each request on its own (on the same
worker thread): the baseline of ``bench/bench_retriever.py``.

**Bad input** gets ``400 {"detail": message}`` (FastAPI's error shape) naming what is wrong: a body
that is not UTF-8 or not JSON, ``queries`` that is not a list of strings, an empty, over-long or
non-Unicode query (by its position: ``queries[3]: the query is empty``), too many queries, a bad
``topk``. A body over ``max_body_bytes`` gets 413. A failure inside the index answers 500 for the
requests of that batch; the service keeps serving.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from agentrl.http_app import serve_app
from agentrl.tools.retriever import (
    MAX_QUERY_CHARS,
    Hit,
    Index,
    QueryError,
    RetrieverUnavailable,
    check_query,
    load_index,
)

DEFAULT_PORT = 8000
"""Search-R1's retriever listens on 8000 (``search_url: http://127.0.0.1:8000/retrieve``)."""


class RequestError(ValueError):
    """A /retrieve request that cannot be answered; the message goes back to the client."""


@dataclass(frozen=True)
class RetrieveRequest:
    queries: list[str]
    topk: int
    return_scores: bool


def parse_retrieve_request(
    payload: Any,
    *,
    default_topk: int,
    max_topk: int,
    max_queries: int,
    max_query_chars: int = MAX_QUERY_CHARS,
) -> RetrieveRequest:
    """Check a decoded /retrieve body; :class:`RequestError` says what is wrong with it."""
    if not isinstance(payload, dict):
        raise RequestError(f"the body must be a JSON object, not {type(payload).__name__}")
    queries = payload.get("queries")
    if not isinstance(queries, list):
        raise RequestError('"queries" must be a list of strings')
    if len(queries) > max_queries:
        raise RequestError(f"{len(queries)} queries in one request; the limit is {max_queries}")
    for position, query in enumerate(queries):
        try:
            check_query(query, max_query_chars)
        except QueryError as exc:
            raise RequestError(f"queries[{position}]: {exc}") from None
    topk = payload.get("topk") or default_topk  # Search-R1: `if not request.topk: default`
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= max_topk:
        raise RequestError(f'"topk" must be an integer from 1 to {max_topk}, got {topk!r}')
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(f'"return_scores" must be true or false, got {return_scores!r}')
    return RetrieveRequest(queries, topk, return_scores)


def retrieve_response(results: Sequence[Sequence[Hit]], return_scores: bool) -> dict[str, Any]:
    """Search-R1's response body for ``results`` (one list of hits per query)."""
    if return_scores:
        return {
            "result": [
                [{"document": hit.document, "score": hit.score} for hit in hits] for hits in results
            ]
        }
    return {"result": [[hit.document for hit in hits] for hits in results]}


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future[list[list[Hit]]] = field(repr=False)


class RetrieverService:
    """The routes above around one loaded :class:`Index`; ``app`` is the aiohttp application."""

    def __init__(
        self,
        index: Index,
        *,
        topk: int = 3,
        max_topk: int = 100,
        max_queries: int = 1024,
        max_query_chars: int = MAX_QUERY_CHARS,
        max_batch_queries: int = 512,
        max_body_bytes: int = 8 << 20,
        batching: bool = True,
    ) -> None:
        self.index = index
        self.topk = topk
        self.max_topk = max_topk
        self.max_queries = max_queries
        self.max_query_chars = max_query_chars
        self.max_batch_queries = max_batch_queries
        self.batching = batching
        self.batches = 0
        """Index calls made (one per batch); with ``batching=False``, one per request."""
        self._executor: ThreadPoolExecutor | None = None
        self._queue: asyncio.Queue[_Pending] | None = None
        self._batcher: asyncio.Task[None] | None = None
        self.app = web.Application(client_max_size=max_body_bytes)
        self.app.add_routes([web.post("/retrieve", self.retrieve), web.get("/health", self.health)])
        self.app.on_startup.append(self._start)
        self.app.on_cleanup.append(self._stop)

    async def _start(self, app: web.Application) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="retriever")
        self._queue = asyncio.Queue()
        self._batcher = asyncio.create_task(self._batch_loop())

    async def _stop(self, app: web.Application) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            await asyncio.gather(self._batcher, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "kind": self.index.kind,
                "documents": len(self.index),
                "batching": self.batching,
                "batches": self.batches,
            }
        )

    async def retrieve(self, request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            return _error(413, f"the request body is too large: {exc.text}")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _error(400, f"the request body is not valid UTF-8 (byte {exc.start})")
        try:
            payload = json.loads(text)
        except (ValueError, RecursionError) as exc:
            return _error(400, f"the request body is not valid JSON: {exc}")
        try:
            parsed = parse_retrieve_request(
                payload,
                default_topk=self.topk,
                max_topk=self.max_topk,
                max_queries=self.max_queries,
                max_query_chars=self.max_query_chars,
            )
        except RequestError as exc:
            return _error(400, str(exc))
        if not parsed.queries:
            return web.json_response({"result": []})
        try:
            results = await self._search(parsed.queries, parsed.topk)
        except Exception as exc:
            return _error(500, f"the search failed: {type(exc).__name__}: {exc}")
        return web.json_response(retrieve_response(results, parsed.return_scores))

    async def _search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        loop = asyncio.get_running_loop()
        if not self.batching:
            self.batches += 1
            return await loop.run_in_executor(self._executor, self.index.search, queries, topk)
        assert self._queue is not None
        future: asyncio.Future[list[list[Hit]]] = loop.create_future()
        self._queue.put_nowait(_Pending(queries, topk, future))
        return await future

    async def _batch_loop(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            size = len(batch[0].queries)
            while not self._queue.empty() and size < self.max_batch_queries:
                batch.append(self._queue.get_nowait())
                size += len(batch[-1].queries)
            queries = [query for pending in batch for query in pending.queries]
            topk = max(pending.topk for pending in batch)
            self.batches += 1
            try:
                results = await loop.run_in_executor(
                    self._executor, self.index.search, queries, topk
                )
            except Exception as exc:
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                continue
            start = 0
            for pending in batch:
                end = start + len(pending.queries)
                if not pending.future.done():  # the client may have gone
                    pending.future.set_result([hits[: pending.topk] for hits in results[start:end]])
                start = end


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"detail": message}, status=status)


class RetrieverClient:
    """Asks a Search-R1-style ``/retrieve`` endpoint (this service or Search-R1's own).

    Each call opens its own connection, so a client holds nothing bound to an event loop and
    environments may share one across loops. A 4xx answer raises :class:`QueryError` with the
    server's message; no answer, a timeout, a 5xx or a malformed body raise
    :class:`RetrieverUnavailable`.
    """

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        self.url = url
        self.timeout = timeout

    async def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        payload = {"queries": list(queries), "topk": topk, "return_scores": True}
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as session,
                session.post(self.url, json=payload) as response,
            ):
                text = await response.text(errors="replace")
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            raise RetrieverUnavailable(
                f"no answer from the retriever at {self.url}: {reason}"
            ) from None
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        detail = body.get("detail") if isinstance(body, dict) else None
        if 400 <= status < 500 and status not in (404, 405, 408, 429):
            raise QueryError(str(detail or text[:500]))
        if status != 200:
            raise RetrieverUnavailable(
                f"the retriever at {self.url} answered {status}: {detail or text[:500]}"
            )
        try:
            return [[_hit(item) for item in hits] for hits in body["result"]]
        except (TypeError, KeyError, AttributeError) as exc:
            raise RetrieverUnavailable(
                f"the retriever at {self.url} sent an unexpected body ({exc!r}): {text[:200]}"
            ) from None


def _hit(item: dict[str, Any]) -> Hit:
    """A hit from a /retrieve answer; documents with only ``contents`` (Search-R1's corpora) get
    their title (first line, unquoted) and text (the rest)."""
    document = item["document"]
    contents = str(document["contents"])
    title, _, text = contents.partition("\n")
    return Hit(
        {
            "id": str(document.get("id", "")),
            "title": str(document.get("title", title.strip('"'))),
            "text": str(document.get("text", text)),
            "contents": contents,
        },
        float(item.get("score", 0.0)),
    )


async def serve(
    index_path: str,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    ready: asyncio.Event | None = None,
    **options: Any,
) -> None:
    """Load the index at ``index_path`` and serve it until cancelled; ``options`` go to
    :class:`RetrieverService`."""
    index = await asyncio.to_thread(load_index, index_path)
    banner = (
        f"agentrl retriever serve: {index.kind} index of {len(index)} documents "
        f"on http://{host}:{port}/retrieve"
    )
    await serve_app(RetrieverService(index, **options).app, host, port, banner, ready)
