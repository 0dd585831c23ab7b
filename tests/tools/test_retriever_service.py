"""``agentrl retriever serve``: a real aiohttp server on the loopback, real HTTP."""

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import requests
from aiohttp import web

from agentrl.cli import main as agentrl_main
from agentrl.engine_pool.sglang_engine import free_port
from agentrl.envs.search.qa import SHIPPED_CORPUS
from agentrl.tools.retriever import QueryError, RetrieverUnavailable, cached_index, load_index
from agentrl.tools.retriever_service import RetrieverClient, RetrieverService


@pytest.fixture(scope="module")
def index_path(tmp_path_factory) -> Path:
    return cached_index(SHIPPED_CORPUS, cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def index(index_path):
    return load_index(index_path)


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def service(index):
    service = RetrieverService(index, topk=3)
    runner, url = await start(service.app)
    service.url = url
    yield service
    await runner.cleanup()


def search_r1_batch_search(search_url: str, queries: list[str], topk: int) -> list[str]:
    """Search-R1's client, as in ``search_r1/llm_agent/generation.py`` (LLMGenerationManager.
    batch_search, _batch_search and _passages2string), with its config's values passed in."""
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    results = requests.post(search_url, json=payload).json()["result"]

    def _passages2string(retrieval_result):
        format_reference = ""
        for idx, doc_item in enumerate(retrieval_result):
            content = doc_item["document"]["contents"]
            title = content.split("\n")[0]
            text = "\n".join(content.split("\n")[1:])
            format_reference += f"Doc {idx + 1}(Title: {title}) {text}\n"
        return format_reference

    return [_passages2string(result) for result in results]


async def test_search_r1s_client_gets_its_passages(service):
    queries = ["What is the capital of Peru?", "Which continent is Peru in?"]
    answers = await asyncio.to_thread(search_r1_batch_search, f"{service.url}/retrieve", queries, 3)
    assert len(answers) == 2
    assert answers[0].startswith("Doc 1(Title: Lima) Lima: capital and largest city")
    assert "Peru is part of South America." in answers[1]
    assert [line[:6] for line in answers[0].splitlines()] == ["Doc 1(", "Doc 2(", "Doc 3("]


async def post(url: str, body: bytes | dict) -> tuple[int, dict]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/retrieve", data=data) as response,
    ):
        return response.status, await response.json()


async def test_response_shapes_with_and_without_scores(service):
    status, body = await post(service.url, {"queries": ["Lima", "Einstein", "Nile"], "topk": 2})
    assert status == 200 and [len(hits) for hits in body["result"]] == [2, 2, 2]
    assert set(body["result"][0][0]) == {"id", "title", "text", "contents"}
    status, scored = await post(
        service.url, {"queries": ["Lima", "Einstein", "Nile"], "topk": 2, "return_scores": True}
    )
    assert [[hit["document"] for hit in hits] for hits in scored["result"]] == body["result"]
    scores = [hit["score"] for hit in scored["result"][0]]
    assert scores == sorted(scores, reverse=True) and all(isinstance(s, float) for s in scores)


@pytest.mark.parametrize(("topk", "expected"), [(None, 3), (0, 3), (5, 5)])
async def test_topk_defaults_as_search_r1s_server(service, topk, expected):
    body = {"queries": ["capital"], "topk": topk} if topk is not None else {"queries": ["capital"]}
    status, answer = await post(service.url, body)
    assert status == 200 and len(answer["result"][0]) == expected


async def test_no_queries_no_results(service):
    assert await post(service.url, {"queries": []}) == (200, {"result": []})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"queries": ["\xff\xfe"]}', "not valid UTF-8"),
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, not list"),
        ({"queries": "Lima"}, '"queries" must be a list of strings'),
        ({"queries": ["Lima", ""]}, r"queries\[1\]: the query is empty"),
        ({"queries": ["   "]}, r"queries\[0\]: the query is empty"),
        ({"queries": ["x" * 5000]}, r"queries\[0\]: the query has 5000 characters"),
        (b'{"queries": ["Lima \\udcff"]}', r"queries\[0\]: the query is not valid Unicode"),
        ({"queries": [7]}, r"queries\[0\]: a query must be a string, not int"),
        ({"queries": ["Lima"] * 1025}, "1025 queries in one request; the limit is 1024"),
        ({"queries": ["Lima"], "topk": -1}, '"topk" must be an integer from 1 to 100'),
        ({"queries": ["Lima"], "topk": "3"}, '"topk" must be an integer'),
        ({"queries": ["Lima"], "topk": 101}, '"topk" must be an integer from 1 to 100'),
        ({"queries": ["Lima"], "return_scores": "yes"}, '"return_scores" must be true or false'),
    ],
)
async def test_bad_requests_get_400_and_the_service_stays_up(service, body, message):
    status, answer = await post(service.url, body)
    assert status == 400
    assert __import__("re").search(message, answer["detail"]), answer
    status, good = await post(service.url, {"queries": ["Lima"], "topk": 1})
    assert status == 200 and good["result"][0][0]["title"] == "Lima"


async def test_a_huge_body_gets_413(index):
    service = RetrieverService(index, max_body_bytes=1 << 16)
    runner, url = await start(service.app)
    try:
        status, answer = await post(url, {"queries": ["Lima " * 20_000]})
        assert status == 413 and "too large" in answer["detail"]
        assert (await post(url, {"queries": ["Lima"]}))[0] == 200
    finally:
        await runner.cleanup()


async def test_concurrent_requests_are_searched_in_batches(service, index):
    queries = [f"capital of {country}" for country in ("Peru", "France", "Chile", "Iran")] * 16
    answers = await asyncio.gather(*(post(service.url, {"queries": [q]}) for q in queries))
    assert all(status == 200 for status, _ in answers)
    alone = index.search(queries, 3)
    assert [a["result"][0] for _, a in answers] == [[h.document for h in hits] for hits in alone]
    assert service.batches < len(queries)  # some requests shared an index call


async def test_the_client_reads_hits_and_maps_failures(service, index):
    client = RetrieverClient(f"{service.url}/retrieve")
    queries = ["capital of Peru", "Einstein"]
    assert await client.search(queries, 2) == index.search(queries, 2)
    with pytest.raises(QueryError, match="the query is empty"):
        await client.search([""], 2)
    with pytest.raises(RetrieverUnavailable, match="answered 404"):
        await RetrieverClient(f"{service.url}/nowhere").search(["Lima"], 2)
    with pytest.raises(RetrieverUnavailable, match="no answer from the retriever"):
        await RetrieverClient(f"http://127.0.0.1:{free_port()}/retrieve").search(["Lima"], 2)


async def test_the_client_reads_search_r1s_documents_and_refuses_garbage():
    """A server answering as Search-R1's does (documents with only id and contents), then one
    that answers garbage, then one that fails."""
    answers = iter(
        [
            web.json_response({"result": [[{"document": {"id": "7", "contents": '"T"\nbody'}}]]}),
            web.Response(text="<html>oops</html>"),
            web.json_response({"detail": "index exploded"}, status=500),
        ]
    )

    async def retrieve(request: web.Request) -> web.Response:
        return next(answers)

    app = web.Application()
    app.add_routes([web.post("/retrieve", retrieve)])
    runner, url = await start(app)
    client = RetrieverClient(f"{url}/retrieve")
    try:
        [[hit]] = await client.search(["q"], 1)
        assert hit.document == {"id": "7", "title": "T", "text": "body", "contents": '"T"\nbody'}
        with pytest.raises(RetrieverUnavailable, match="unexpected body"):
            await client.search(["q"], 1)
        with pytest.raises(RetrieverUnavailable, match="answered 500: index exploded"):
            await client.search(["q"], 1)
    finally:
        await runner.cleanup()


def test_cli_build_and_its_errors(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "contents": "Lima\\ncapital of Peru"}\n')
    assert agentrl_main(["retriever", "build", str(corpus), str(tmp_path / "ix")]) == 0
    assert "bm25 index of 1 documents" in capsys.readouterr().out
    assert agentrl_main(["retriever", "build", str(corpus), str(tmp_path / "ix")]) == 2
    assert "exists" in capsys.readouterr().err
    corpus.write_text('{"id": "a", "contents": "Lima\\ncapital of Peru"}\n{"id": "b",\n')
    assert agentrl_main(["retriever", "build", str(corpus), str(tmp_path / "ix2")]) == 2
    assert "corpus.jsonl line 2 is not valid JSON" in capsys.readouterr().err


def test_cli_serve_refuses_a_missing_index(tmp_path, capsys):
    assert agentrl_main(["retriever", "serve", str(tmp_path / "none"), "--port", "0"]) == 2
    assert "no retriever index at" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_serve_answers_search_r1s_client(index_path, tmp_path):
    port = free_port()
    command = [sys.executable, "-m", "agentrl.cli", "retriever", "serve", str(index_path)]
    log = tmp_path / "serve.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [*command, "--port", str(port), "--topk", "2"], stdout=output, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
                break
            except requests.RequestException:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        url = f"http://127.0.0.1:{port}/retrieve"
        [passages] = search_r1_batch_search(url, ["capital of Peru"], 2)
        assert passages.startswith("Doc 1(Title: Lima)") and "Doc 2(" in passages
        body = requests.post(url, json={"queries": ["Peru"]}).json()
        assert len(body["result"][0]) == 2  # --topk 2 is the default
    finally:
        process.terminate()
        process.wait(10)
    assert "(ready)" in log.read_text()
