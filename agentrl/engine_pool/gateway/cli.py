"""``agentrl gateway --engine-url URL [--engine-url URL ...] --model MODEL``: the OpenAI-compatible
endpoint in front of an :class:`~agentrl.engine_pool.EnginePool` of SGLang or ``agentrl serve``
servers. The gateway templates, parses tool calls and records sessions itself; the servers get
token ids only."""

from __future__ import annotations

import argparse
import asyncio
import contextlib


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine-url",
        action="append",
        required=True,
        help="an SGLang or agentrl serve server (repeat for several: they form one EnginePool)",
    )
    parser.add_argument(
        "--model",
        required=True,
        help='the tokenizer and chat template: "smollm2", a local model directory or a .gguf',
    )
    parser.add_argument(
        "--served-model-name", help="the model id clients send (default: --model as given)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument(
        "--template-policy",
        choices=("keep", "strict"),
        default="keep",
        help="a chat template that is not append-only: keep the sampled tokens (default) or "
        "refuse the calls (rollout.template_policy)",
    )
    parser.add_argument(
        "--chat-template", help="a Jinja file to use instead of the tokenizer's chat template"
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        help="largest request body in bytes (default 32 MiB); larger ones get 413",
    )
    parser.add_argument(
        "--max-sessions", type=int, default=10_000, help="open sessions at most (default 10000)"
    )


def run(args: argparse.Namespace) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_gateway(args))
    return 0


async def serve_gateway(args: argparse.Namespace, ready: asyncio.Event | None = None) -> None:
    """Attach to the servers, then serve the gateway's routes until cancelled."""
    from pathlib import Path

    from aiohttp import web

    from agentrl.engine_pool.gateway.routes import DEFAULT_MAX_BODY_BYTES, GatewayRoutes
    from agentrl.engine_pool.gateway.service import Gateway
    from agentrl.engine_pool.pool import EnginePool
    from agentrl.engine_pool.sglang_engine import SGLangEngine
    from agentrl.http_app import serve_app
    from agentrl.models import load_tokenizer

    template = Path(args.chat_template).read_text() if args.chat_template else None
    engines = [SGLangEngine(url) for url in args.engine_url]
    async with EnginePool(engines) as pool:
        contexts = [e.server.context_length for e in engines if e.server is not None]
        gateway = Gateway(
            pool,
            load_tokenizer(args.model),
            model_name=args.served_model_name or args.model,
            context_length=min((c for c in contexts if c), default=None),
            chat_template=template,
            template_policy=args.template_policy,
            max_sessions=args.max_sessions,
        )
        max_body = args.max_body_bytes or DEFAULT_MAX_BODY_BYTES
        app = web.Application(client_max_size=max_body + 1)
        GatewayRoutes(gateway, max_body_bytes=max_body).add_to(app)
        banner = (
            f"agentrl gateway: {gateway.model_name} on http://{args.host}:{args.port}/v1 "
            f"in front of {', '.join(args.engine_url)}"
        )
        await serve_app(app, args.host, args.port, banner, ready)
