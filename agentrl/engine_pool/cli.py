"""``agentrl serve MODEL``: the embedded engine as an HTTP server speaking SGLang's native API, and
OpenAI's (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, sessions)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help='"smollm2", a local model directory or a .gguf file')
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=30000, help="port to bind (default 30000)")
    parser.add_argument(
        "--max-batch-size", type=int, default=32, help="most requests decoded together (32)"
    )
    parser.add_argument("--dtype", default="float32", help="model dtype (default float32)")
    parser.add_argument(
        "--device", default="cpu", help='where the model runs: "cpu" (default), "cuda", "cuda:1"'
    )
    parser.add_argument(
        "--served-model-name",
        help="the model id of the OpenAI-compatible routes (default: MODEL as given)",
    )
    parser.add_argument(
        "--fp8-weights",
        action="store_true",
        help="compute with blockwise-FP8 (128x128) linear weights, as SGLang serving a "
        "blockwise-FP8 checkpoint; weight updates may send FP8 weights with weight_scale_inv",
    )


def run(args: argparse.Namespace) -> int:
    from agentrl.engine_pool.server import serve

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            serve(
                args.model,
                host=args.host,
                port=args.port,
                max_batch_size=args.max_batch_size,
                dtype=args.dtype,
                fp8_weights=args.fp8_weights,
                device=args.device,
                served_model_name=args.served_model_name,
            )
        )
    return 0
